"""Columns of data files read as written (coordinator_service.tables.file_columns) against pyiceberg's own reading
(ArrowScan, which projects every file onto the table's schema), through any history of the table's schema: files
written by pyiceberg (field ids) or added without field ids (a name mapping), columns renamed, dropped and added
again under the same name, promoted. The table is a real one, in a SQL catalog on SQLite."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import ResolveError
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from coordinator_service.tables.file_columns import _names_by_field_id, data_file_columns
from coordinator_service.tables.table_audit import plain_strings

SCHEMA = Schema(
    NestedField(1, "order_id", LongType(), required=True),
    NestedField(2, "country", StringType(), required=False),
    NestedField(3, "n", IntegerType(), required=False),
    NestedField(4, "m", IntegerType(), required=False),
)
CHANGES = ("append", "add_files", "rename", "drop_and_add", "promote")


def rows(table: Table, first: int, count: int) -> pa.Table:
    values = {
        "order_id": range(first, first + count),
        "country": ["DE", "FR", None],
        "n": range(count),
        "m": range(100, 100 + count),
    }
    columns = {}
    for field in table.schema().fields:
        drawn = list(itertools.islice(itertools.cycle(values.get(field.name, values["country"])), count))
        columns[field.name] = pa.array(drawn if field.name != "order_id" else values["order_id"])
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return pa.table(columns).cast(arrow)


def change(table: Table, kind: str, step: int, directory: Path, order: random.Random) -> None:
    schema = table.schema()
    text = next(field.name for field in schema.fields if isinstance(field.field_type, StringType))
    number = next((field for field in schema.fields if field.field_id != 1 and field.name.startswith("n")), None)
    if kind == "append":
        table.append(rows(table, step * 10, 4))
    elif kind == "add_files":  # a file without field ids: read through the table's name mapping
        path = directory / f"added-{step}.parquet"
        written = rows(table, step * 10, 3)
        names = written.column_names
        order.shuffle(names)  # in any order: columns are found by name, not by place
        pq.write_table(written.select(names), path)
        table.add_files([path.as_uri()])
    elif kind == "rename":
        with table.update_schema() as update:
            update.rename_column(text, "region" if text == "country" else "country")
    elif kind == "drop_and_add" and number is not None:  # the same name, a new field id: older files lack it
        with table.update_schema() as update:
            update.delete_column(number.name)
        with table.update_schema() as update:
            update.add_column(number.name, IntegerType())
    elif kind == "promote" and number is not None and isinstance(number.field_type, IntegerType):
        with table.update_schema() as update:
            update.update_column(number.name, LongType())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.sampled_from(CHANGES), min_size=1, max_size=6), order=st.randoms(use_true_random=False))
def test_files_read_as_written_equal_pyicebergs_reading(
    tmp_path_factory: object, changes: list[str], order: random.Random
) -> None:
    directory = tmp_path_factory.mktemp("file_columns")  # type: ignore[attr-defined]
    catalog = SqlCatalog("t", uri=f"sqlite:///{directory / 'c.db'}", warehouse=directory.as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA)
    for step, kind in enumerate([*changes, "append"]):
        change(table, kind, step, directory, order)
    files = [task.file for task in table.scan().plan_files()]
    names = [field.name for field in table.schema().fields]
    text = [name for name in names if isinstance(table.schema().find_type(name), StringType)]

    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    try:
        expected = scan.to_table([FileScanTask(data_file) for data_file in files])
    except ResolveError:
        # A file added without field ids whose column's name now maps to another type (dropped and added again):
        # pyiceberg cannot read it, and neither can the reading as written, which hands such files to it.
        with pytest.raises(ResolveError):
            data_file_columns(table, files, names, dictionary=text)
        return

    found = data_file_columns(table, files, names, dictionary=text)

    assert found.column_names == names
    assert all(pa.types.is_dictionary(found.schema.field(name).type) for name in text)
    assert plain_strings(found).to_pylist() == expected.select(names).to_pylist()
    assert found.num_rows == sum(data_file.record_count for data_file in files)


def test_a_files_columns_are_found_by_its_field_ids_not_by_their_place(tmp_path: Path) -> None:
    """A file without field ids (as the Spark writer writes them) whose columns of one type are in another order
    than the table's: each is found through the name mapping, not by its place."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA)
    path = tmp_path / "swapped.parquet"
    pq.write_table(rows(table, 0, 3).select(["order_id", "country", "m", "n"]), path)
    table.add_files([path.as_uri()])
    [data_file] = [task.file for task in table.scan().plan_files()]

    found = data_file_columns(table, [data_file], ["n", "m", "order_id"])

    assert found.to_pydict() == {"n": [0, 1, 2], "m": [100, 101, 102], "order_id": [0, 1, 2]}


def test_a_file_with_two_columns_of_one_name_is_left_to_pyicebergs_reader() -> None:
    """pyarrow finds no column by a name two of them have (KeyError): such a file is not read as written."""
    physical = pa.schema([pa.field("n", pa.int32()), pa.field("n", pa.int32())])

    assert _names_by_field_id(physical, {"n": 3}) is None
    assert _names_by_field_id(physical.remove(1), {"n": 3}) == {3: "n"}


def test_dictionary_columns_become_plain_columns_of_their_values() -> None:
    """plain_strings: rows read as written (a topic as a dictionary array) concatenated with rows read otherwise."""
    rows = pa.table({"kafka_topic": pa.array(["a", "b", "a"]).dictionary_encode(), "n": pa.array([1, 2, 3])})

    plain = plain_strings(rows)

    assert plain.schema == pa.schema([("kafka_topic", pa.string()), ("n", pa.int64())])
    assert plain.to_pylist() == rows.to_pylist()
