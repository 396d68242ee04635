"""The driver's side of fan-out without Spark: the tables ensured at start, a coordinator without fan-out, the
message of a batch failing for its unrouted records, the batch directory sent with the files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import grpc
import pyarrow as pa
import pytest
from pyspark.sql import Row

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError, TableSpec
from coordinator_service.contract.views import SinkState, SinkTable, TableLocation, TablesEnsured
from spark_writer.routing.routes import Routes, Unrouted, UnroutedRecordsError
from spark_writer.sink.fan_out import MAX_TABLES_PER_ENSURE, FanOut, FanOutUnsupportedError
from spark_writer.sink.parquet_writer import DataFileTarget
from spark_writer.sink.storage import Storage

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string())])
OWN = "shop.orders"


class FakeCoordinator:
    """Answers EnsureTables with a location per table (or UNIMPLEMENTED), and GetSinkState with `tables`."""

    target = "fake:1"

    def __init__(self, tables: Sequence[str] = (OWN,), implemented: bool = True) -> None:
        self.tables = tables
        self.implemented = implemented
        self.ensured: list[list[TableSpec]] = []

    def ensure_tables(self, sink: str, writer_term: int, tables: Sequence[TableSpec]) -> TablesEnsured:
        if not self.implemented:
            raise CoordinatorRpcError(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.ensured.append(list(tables))
        return TablesEnsured(tuple(TableLocation(spec.table, f"s3://w/{spec.table}") for spec in tables))

    def sink_state(self, sink: str) -> SinkState:
        return cast(SinkState, _State(tuple(SinkTable(table, 3) for table in self.tables)))


class _State:
    def __init__(self, tables: tuple[SinkTable, ...]) -> None:
        self.tables = tables


def fan_out(coordinator: FakeCoordinator, routes: Routes) -> FanOut:
    client = cast(CoordinatorClient, coordinator)
    return FanOut(client, "orders", 7, routes, OWN, f"s3://w/{OWN}", ("region",), Storage())


def test_static_routes_tables_are_ensured_at_start_with_the_data_schema() -> None:
    coordinator = FakeCoordinator()
    routes = Routes.static("region", [("eu", "shop.eu"), ("uk", "shop.eu"), ("us", OWN)])
    fan_out(coordinator, routes).start(SCHEMA)
    ((own, eu),) = coordinator.ensured
    assert (own.table, eu.table) == (OWN, "shop.eu")  # the sink's own first: a coordinator without fan-out shows
    assert pa.ipc.read_schema(pa.py_buffer(eu.arrow_schema)) == SCHEMA and eu.partition_by == ("region",)


def test_dynamic_routes_learn_the_sinks_tables_at_start_in_calls_the_coordinator_takes() -> None:
    known = [OWN, *(f"shop.t{index}" for index in range(MAX_TABLES_PER_ENSURE + 10))]
    coordinator = FakeCoordinator(known)
    fan_out(coordinator, Routes("region", dynamic=True)).start(SCHEMA)
    assert [len(call) for call in coordinator.ensured] == [MAX_TABLES_PER_ENSURE, 11]
    assert [spec.table for call in coordinator.ensured for spec in call] == known


def test_a_coordinator_without_fan_out_is_named_at_start() -> None:
    with pytest.raises(FanOutUnsupportedError, match="the coordinator at fake:1 does not implement fan-out"):
        fan_out(FakeCoordinator(implemented=False), Routes("region", dynamic=True)).start(SCHEMA)


def unrouted(value: str, records: int, origin: str) -> Row:
    return Row(path=None, table=None, unrouted=value, unrouted_records=records, unrouted_origin=origin)


def test_a_batch_with_unrouted_records_fails_naming_them_most_frequent_first() -> None:
    sink = fan_out(FakeCoordinator(), Routes.static("region", [("eu", "shop.eu")], Unrouted.FAIL))
    rows: list[Any] = [
        Row(path="s3://w/shop.eu/data/a.parquet", table="shop.eu", unrouted=None),
        unrouted("'apac'", 2, "topic t partition 0 offset 5"),  # two tasks saw the same value
        unrouted("null", 4, "topic t partition 1 offset 9"),
        unrouted("'apac'", 3, "topic t partition 2 offset 1"),
    ]
    with pytest.raises(UnroutedRecordsError) as failure:
        sink._check_unrouted(rows, 12)
    assert str(failure.value) == (
        "batch 12: 9 record(s) whose route column 'region' has no route: "
        "'apac': 5 record(s), the first from topic t partition 0 offset 5; "
        "null: 4 record(s), the first from topic t partition 1 offset 9. "
        "Nothing of the batch was committed: add a route for them, or let unrouted records go to the sink's own "
        "table (--unrouted default, shop.orders)"
    )


def test_the_batch_directory_is_sent_when_its_files_lie_in_one_table() -> None:
    coordinator = FakeCoordinator()
    sink = fan_out(coordinator, Routes.static("region", [("eu", "shop.eu")]))
    sink.start(SCHEMA)
    target = DataFileTarget(f"s3://w/{OWN}", 5, SCHEMA, (), 1 << 20)
    in_eu = Row(path="s3://w/shop.eu/data/00000005/a.parquet", table="shop.eu")
    in_own = Row(path=f"s3://w/{OWN}/data/00000005/b.parquet", table=None)
    assert sink.files_directory(target, [in_eu]) == "s3://w/shop.eu/data/00000005"
    assert sink.files_directory(target, [in_own]) == f"s3://w/{OWN}/data/00000005"
    assert sink.files_directory(target, []) == f"s3://w/{OWN}/data/00000005"
    assert sink.files_directory(target, [in_eu, in_own]) == ""
