"""Where a table stands for a sink (spark_writer.fresh.table_head): the newest of the sink's own snapshots says which
records the table holds; maintenance's snapshots and other sinks' are passed over, an earlier incarnation's or one
that does not say is refused. A real pyiceberg SQL catalog (SQLite)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
from spark_writer.fresh.table_head import TableHeadError, table_head
from spark_writer.kafka.offsets import PartitionKey

SINK = SinkIdentity(name="orders", incarnation=str(uuid.uuid4()), generation=1)
ROWS = pa.schema([pa.field("id", pa.int64())])


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog: Catalog = SqlCatalog(
        "test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri()
    )
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", ROWS)


def append(table: Table, ids: list[int], properties: dict[str, str]) -> None:
    table.append(pa.Table.from_pylist([{"id": i} for i in ids], ROWS), snapshot_properties=properties)


def epoch(epoch: int, offsets: dict[str, dict[str, int]] | None, sink: SinkIdentity = SINK) -> dict[str, str]:
    properties = sink.marker(epoch, f"commit-{epoch}")
    if offsets is not None:
        properties[SNAPSHOT_END_OFFSETS] = json.dumps(offsets)
    return properties


def test_a_table_without_snapshots_holds_nothing_of_the_sink(table: Table) -> None:
    head = table_head(table, SINK)
    assert (head.snapshot_id, head.end_offsets, head.epoch, head.rows().num_rows) == (None, None, None, 0)


def test_the_newest_of_the_sinks_snapshots_says_where_the_table_ends_past_maintenance_and_other_sinks(
    table: Table,
) -> None:
    append(table, [1], epoch(0, {"orders": {"0": 1}}))
    append(table, [2, 3], epoch(1, {"orders": {"0": 2, "1": 1}}))
    other = SinkIdentity("audit", str(uuid.uuid4()), 0)
    append(table, [99], epoch(7, {"audit": {"0": 9}}, other))
    append(table, [], {"operation-note": "maintenance"})  # no marker: compaction's, expiry's
    head = table_head(table, SINK)
    assert head.end_offsets == {PartitionKey("orders", 0): 2, PartitionKey("orders", 1): 1}
    assert head.epoch == 1
    current = table.current_snapshot()
    assert current is not None and head.snapshot_id == current.snapshot_id, "the rows are the current snapshot's"
    assert sorted(head.rows().column("id").to_pylist()) == [1, 2, 3, 99]


def test_a_table_that_holds_none_of_the_sinks_epochs_yet_says_so(table: Table) -> None:
    append(table, [5], {})  # an adopted table's own rows
    head = table_head(table, SINK)
    assert head.end_offsets is None and head.snapshot_id is not None and head.rows().num_rows == 1


@pytest.mark.parametrize(
    ("newest", "message"),
    [
        (epoch(4, {"orders": {"0": 9}}, SinkIdentity("orders", SINK.incarnation, 0)), "earlier incarnation's"),
        (epoch(4, {"orders": {"0": 9}}, SinkIdentity("orders", str(uuid.uuid4()), 1)), "earlier incarnation's"),
        (epoch(4, None), "does not say where its epoch ended in Kafka"),
        ({**epoch(4, None), SNAPSHOT_END_OFFSETS: "[1, 2]"}, "is not end offsets"),
        ({**epoch(4, None), SNAPSHOT_END_OFFSETS: "{"}, "is not end offsets"),
    ],
)
def test_a_sinks_newest_snapshot_that_cannot_say_what_the_table_holds_is_refused(
    table: Table, newest: dict[str, str], message: str
) -> None:
    append(table, [1], epoch(0, {"orders": {"0": 1}}))
    append(table, [2], newest)
    with pytest.raises(TableHeadError, match=message):
        table_head(table, SINK)
