"""The task side of fan-out, without Spark: rows split by route, and a task's files under each table's location."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_writer.routing.routes import Routes, Unrouted
from spark_writer.routing.split import (
    MAX_UNROUTED_VALUES,
    OTHER_VALUES,
    TaskRouting,
    UnroutedTally,
    record_origin,
    split_by_route,
)
from spark_writer.sink.parquet_writer import DataFileTarget, task_writer
from spark_writer.sink.partitioning import parse_partition_fields

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("region", pa.string()),
        pa.field("shard", pa.int64()),
        pa.field("day", pa.string()),
    ]
)
OWN = "shop.orders"


def rows(*regions: str | None) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "region": region, "shard": i % 3, "day": f"d{i % 2}"} for i, region in enumerate(regions)],
        schema=SCHEMA,
    )


def routing(routes: Routes, *tables: str, only: frozenset[str] | None = None) -> TaskRouting:
    return TaskRouting(routes, OWN, {table: f"file:///w/{table}" for table in (OWN, *tables)}, only)


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


EU_US = Routes.static("region", [("eu", "shop.eu"), ("us", "shop.us")])


def test_static_routes_and_the_default_table_take_every_row_once() -> None:
    split = split_by_route(rows("eu", "us", "apac", None, "eu", "us", "eu"), routing(EU_US, "shop.eu", "shop.us"))
    assert {table: ids(part) for table, part in split.tables.items()} == {
        "shop.eu": [0, 4, 6],
        "shop.us": [1, 5],
        OWN: [2, 3],
    }
    assert split.unrouted == [] and split.unknown == {}


def test_unrouted_values_fail_with_their_counts_and_first_rows() -> None:
    failing = Routes.static("region", [("eu", "shop.eu")], Unrouted.FAIL)
    split = split_by_route(rows("eu", "apac", None, "apac", "x'y"), routing(failing, "shop.eu"))
    assert {table: ids(part) for table, part in split.tables.items()} == {"shop.eu": [0]}
    assert sorted((v.first_row, v.description, v.records) for v in split.unrouted) == [
        (1, "'apac'", 2),
        (2, "null", 1),
        (4, '"x\'y"', 1),
    ]


def test_integer_route_columns_match_routes_as_text() -> None:
    by_shard = Routes.static("shard", [("0", "shop.s0"), ("2", "shop.s2")], Unrouted.FAIL)
    split = split_by_route(rows(*["eu"] * 6), routing(by_shard, "shop.s0", "shop.s2"))
    assert {table: ids(part) for table, part in split.tables.items()} == {"shop.s0": [0, 3], "shop.s2": [2, 5]}
    assert [(v.description, v.records) for v in split.unrouted] == [("'1'", 2)]


def test_dynamic_routes_write_known_tables_and_report_new_ones() -> None:
    dynamic = Routes("region", dynamic=True, unrouted=Unrouted.FAIL)
    split = split_by_route(
        rows("shop.eu", "shop.new", "shop.new", "no_namespace", OWN, None), routing(dynamic, "shop.eu")
    )
    assert {table: ids(part) for table, part in split.tables.items()} == {"shop.eu": [0], OWN: [4]}
    assert split.unknown == {"shop.new": 2}
    described = {v.description: v.records for v in split.unrouted}
    assert described.pop("null") == 1
    ((problem, records),) = described.items()
    assert problem.startswith("table identifier 'no_namespace' must be 'namespace.table'") and records == 1


def test_dynamic_routes_send_what_names_no_table_to_the_default_table() -> None:
    dynamic = Routes("region", dynamic=True)
    split = split_by_route(rows("shop.eu", "bad name", None), routing(dynamic, "shop.eu"))
    assert {table: ids(part) for table, part in split.tables.items()} == {"shop.eu": [0], OWN: [1, 2]}


def test_the_second_pass_writes_only_the_new_tables() -> None:
    dynamic = Routes("region", dynamic=True)
    split = split_by_route(
        rows("shop.eu", "shop.new", "shop.other", None),
        routing(dynamic, "shop.eu", "shop.new", only=frozenset({"shop.new"})),
    )
    assert {table: ids(part) for table, part in split.tables.items()} == {"shop.new": [1]}
    assert split.unknown == {"shop.other": 1}  # not ensured: a batch that changed between its passes


def test_a_batch_of_one_route_is_not_copied() -> None:
    batch = rows("eu", "eu", "eu")
    assert split_by_route(batch, routing(EU_US, "shop.eu", "shop.us")).tables["shop.eu"] is batch


def test_origins_name_the_record_or_the_kafka_range_it_came_from() -> None:
    with_positions = pa.table(
        {"kafka_topic": ["orders"], "kafka_partition": [2], "kafka_offset": [41], "region": ["apac"]}
    )
    assert record_origin(with_positions, 0, None) == "topic orders partition 2 offset 41"
    kafka = pa.RecordBatch.from_pydict({"topic": ["orders"] * 3, "partition": [1] * 3, "offset": [7, 8, 9]})
    assert record_origin(rows("apac"), 0, kafka) == "topic orders partition 1 offsets 7 to 9"
    mixed = pa.RecordBatch.from_pydict({"topic": ["a", "b"], "partition": [1, 1], "offset": [7, 8]})
    assert record_origin(rows("apac"), 0, mixed) is None
    assert record_origin(rows("apac"), 0, None) is None


def test_a_task_describes_a_bounded_number_of_unrouted_values() -> None:
    tally = UnroutedTally()
    for index in range(MAX_UNROUTED_VALUES + 5):
        tally.add(f"'v{index}'", 2, f"offset {index}")
    tally.add("'v0'", 1, "offset 99")
    assert len(tally.values) == MAX_UNROUTED_VALUES + 1
    assert tally.values["'v0'"] == (3, "offset 0")
    assert tally.values[OTHER_VALUES] == (10, f"offset {MAX_UNROUTED_VALUES}")


def test_a_routed_task_writes_each_tables_files_under_its_location(tmp_path: Path) -> None:
    locations = {table: (tmp_path / table).as_uri() for table in (OWN, "shop.eu", "shop.us")}
    routes = Routes("region", dynamic=True, unrouted=Unrouted.FAIL)
    target = DataFileTarget(
        table_location=locations[OWN],
        batch_id=3,
        schema=SCHEMA,
        partition_fields=parse_partition_fields(["day"], SCHEMA),
        target_file_size_bytes=1 << 20,
        routing=TaskRouting(routes, OWN, locations),
    )
    data = rows("shop.eu", "shop.us", "shop.eu", "shop.new", OWN, "shop.us", None, "shop.eu").to_batches()
    (result,) = list(task_writer(target)(iter(data)))
    reported = result.to_pylist()
    files = [row for row in reported if row["path"] is not None]

    seen: Counter[int] = Counter()
    for row in files:
        table = row["table"] or OWN
        path = str(row["path"]).removeprefix("file://")
        assert path.startswith(f"{tmp_path}/{table}/data/00000003-"), (table, path)
        written = pq.read_table(path)
        assert set(written.column("region").to_pylist()) == {table}  # the route column is kept
        assert len(set(written.column("day").to_pylist())) == 1  # and each file lies in one partition
        seen.update(written.column("id").to_pylist())
    assert seen == Counter([0, 1, 2, 4, 5, 7])
    assert {row["table"] for row in files} == {"shop.eu", "shop.us", None}  # the sink's own table: no name
    assert [(row["table"], row["record_count"]) for row in reported if row["path"] is None and row["table"]] == [
        ("shop.new", 1)
    ]
    assert [
        (row["unrouted"], row["unrouted_records"], row["unrouted_origin"]) for row in reported if row["unrouted"]
    ] == [("null", 1, "Spark task driver")]


def test_a_task_without_routes_names_no_table(tmp_path: Path) -> None:
    target = DataFileTarget(tmp_path.as_uri(), 0, SCHEMA, (), 1 << 20)
    (result,) = list(task_writer(target)(iter(rows("eu", "us").to_batches())))
    assert result.column("table").to_pylist() == [None]
    assert result.column("unrouted").to_pylist() == [None]


# Route values a table identifier may not be (the name policy, coordinator_service.contract.table_identifiers).
OUTSIDE_THE_POLICY = (
    "shop.orders/data",  # inside shop.orders' own directory
    "shop/x.orders",
    "shop.Orders",  # one table with shop.orders where the catalog folds case
    "shop..orders",
    "shop.or ders",
    "shop.-orders",
    "shop.orders\n",
    "shop.or\\ders",
    "shop.ördres",
)


def test_dynamic_route_values_outside_the_name_policy_go_to_the_unrouted_records() -> None:
    split = split_by_route(rows(*OUTSIDE_THE_POLICY), routing(Routes("region", dynamic=True)))
    assert {table: ids(part) for table, part in split.tables.items()} == {OWN: list(range(len(OUTSIDE_THE_POLICY)))}
    assert split.unknown == {}


def test_a_nested_namespace_is_a_table_only_where_the_catalog_has_nested_namespaces() -> None:
    dynamic = Routes("region", dynamic=True)
    without = split_by_route(rows("lake.shop.orders", "shop.eu"), routing(dynamic))
    assert {table: ids(part) for table, part in without.tables.items()} == {OWN: [0]}
    assert without.unknown == {"shop.eu": 1}
    nested = TaskRouting(dynamic, OWN, {OWN: "file:///w/own"}, nested_namespaces=True)
    assert split_by_route(rows("lake.shop.orders"), nested).unknown == {"lake.shop.orders": 1}
