"""The one name policy (coordinator_service.contract.table_identifiers), fuzzed: on the coordinator's side against
where a catalog puts a table, on the writer's side through the routes a record's value takes."""

from __future__ import annotations

import posixpath
import string
from typing import Final

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.table_identifiers import (
    check_sink_name,
    check_table_identifier,
    sink_name_problem,
    table_identifier_problem,
)
from spark_writer.routing.routes import Routes
from spark_writer.routing.split import TaskRouting, split_by_route
from spark_writer.sink.sink_arguments import check_names

WAREHOUSE: Final = "file:///warehouse"
OWN: Final = "shop.orders"
NAME_CHARACTERS: Final = string.ascii_lowercase + string.digits + "_-"
# Near misses: the policy's characters and those a hostile or careless name holds.
HOSTILE: Final = NAME_CHARACTERS + "./\\ AZ\n\x00\t$é"

parts = st.text(alphabet=HOSTILE, min_size=0, max_size=12)
identifiers = st.one_of(
    st.lists(parts, min_size=1, max_size=4).map(".".join),
    st.text(max_size=30),  # anything at all
)


def inside_the_policy(identifier: str, *, nested_namespaces: bool) -> bool:
    """The policy as docs/architecture.md states it, written again here: the oracle."""
    names = identifier.split(".")
    if len(names) < 2 or (len(names) > 2 and not nested_namespaces):
        return False
    if any(not name or name[0] == "-" or any(c not in NAME_CHARACTERS for c in name) for name in names):
        return False
    return len(".".join(names[:-1])) <= 255 and len(names[-1]) <= 255


@given(identifiers, st.booleans())
def test_an_identifier_is_taken_exactly_when_the_documented_policy_takes_it(identifier: str, nested: bool) -> None:
    problem = table_identifier_problem(identifier, nested_namespaces=nested)
    assert (problem is None) is inside_the_policy(identifier, nested_namespaces=nested), problem
    if problem is not None:
        with pytest.raises(InvalidArgument, match="table identifier"):
            check_table_identifier(identifier, nested_namespaces=nested)


@pytest.fixture(scope="module")
def catalog() -> SqlCatalog:
    sql = SqlCatalog("names", uri="sqlite:///:memory:", warehouse=WAREHOUSE)
    sql.load_namespace_properties = lambda namespace: {}  # type: ignore[method-assign]  # no namespace's own location
    return sql


def locations(catalog: SqlCatalog, identifier: str) -> list[str]:
    """Where pyiceberg's catalogs put the table: the SQL catalog's convention, and Hive's and Glue's."""
    *namespace, table = check_table_identifier(identifier)
    database = ".".join(namespace)
    return [
        catalog._resolve_table_location(None, database, table),
        catalog._get_hive_style_warehouse_location(database, table),
    ]


# Names the policy takes, often alike (short parts of few characters), so that prefixes and shared directories occur.
taken_identifiers = (
    st.lists(st.text(alphabet="ab_-./A", min_size=1, max_size=4), min_size=2, max_size=4)
    .map(".".join)
    .filter(lambda identifier: table_identifier_problem(identifier) is None)
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(taken_identifiers, min_size=2, max_size=6, unique=True))
def test_no_table_the_policy_takes_lies_inside_another(catalog: SqlCatalog, taken: list[str]) -> None:
    """Two tables the policy takes never share a directory, whichever catalog places them."""
    for convention in (0, 1):
        placed = {identifier: locations(catalog, identifier)[convention] for identifier in taken}
        for identifier, location in placed.items():
            path = location.removeprefix("file://")
            assert posixpath.normpath(path) == path, location  # no '..', no '//', nothing to resolve
            for other, elsewhere in placed.items():
                if other != identifier:
                    assert not location.startswith(elsewhere + "/"), (identifier, other)
    folded = {identifier.casefold() for identifier in taken}
    assert len(folded) == len(taken)  # no two are one table where the catalog folds case


@given(st.text(max_size=210))
def test_a_sink_name_is_the_whole_text(name: str) -> None:
    accepted = sink_name_problem(name) is None
    assert accepted is (
        0 < len(name) <= 200
        and name[0] in string.ascii_letters + string.digits
        and all(c in string.ascii_letters + string.digits + "_.-" for c in name)
    )
    if accepted:
        assert check_sink_name(name) == name


def test_a_sink_name_with_a_trailing_line_break_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="sink name 'orders\\\\n' is invalid"):
        check_sink_name("orders\n")


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(identifiers, st.none()), min_size=1, max_size=20), st.booleans())
def test_a_record_goes_to_the_table_it_names_only_inside_the_policy(values: list[str | None], nested: bool) -> None:
    """Every record of a dynamic route goes to the table it names when the policy takes it (written, or reported
    for EnsureTables), else to the sink's own table: never a name outside the policy to the catalog."""
    rows = pa.table({"id": list(range(len(values))), "target": values})
    known = {OWN: "file:///w/own", **{value: f"file:///w/{i}" for i, value in enumerate(values[:3]) if value}}
    routing = TaskRouting(Routes("target", dynamic=True), OWN, known, nested_namespaces=nested)
    split = split_by_route(rows, routing)
    for table in [*split.tables, *split.unknown]:
        assert table == OWN or inside_the_policy(table, nested_namespaces=nested), table
    placed = {i: table for table, part in split.tables.items() for i in part.column("id").to_pylist()}
    for i, value in enumerate(values):
        if value is not None and inside_the_policy(value, nested_namespaces=nested):
            assert placed.get(i, value) == value and (i in placed or value in split.unknown)
        else:
            assert placed[i] == OWN


@pytest.mark.parametrize(
    ("sink", "table", "message"),
    [
        ("orders\n", "shop.orders", "sink name"),
        ("orders", "shop.orders/data", "path separator '/'"),
        ("orders", "shop.Orders", "upper-case 'O'"),
        ("orders", "shop..orders", "no empty part"),
    ],
)
def test_the_writer_refuses_its_own_names_outside_the_policy(sink: str, table: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_names(sink, table)
