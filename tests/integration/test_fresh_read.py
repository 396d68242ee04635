"""A fresh read (spark_writer.fresh.read_arrow) against a real broker, the real coordinator process and its catalog,
the table written the way a writer writes it (files pre-committed with their end offsets, then committed), without
Spark: the seam between the table and the tail, a partition added after the snapshot, records retention deleted
before the sink read them, and flags that are not the sink's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.source_positions import END_OFFSETS, SNAPSHOT_END_OFFSETS
from spark_writer import fresh
from spark_writer.fresh.fresh_read import SinkMismatchError
from spark_writer.kafka.data_loss import DataLossError
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet
from tests.fixtures.kafka_broker import add_partitions, create_topic, delete_records_before, produce_records

pytestmark = pytest.mark.kafka

SINK = "orders"
TABLE = "shop.orders"


def produce(bootstrap: str, topic: str, ids: range, partition: int) -> None:
    records = (
        (partition, str(i).encode(), json.dumps(order).encode())
        for i, order in zip(ids, orders(ids.start, len(ids)), strict=True)
    )
    produce_records(bootstrap, topic, records)


@pytest.fixture
def sink(coordinator: CoordinatorProcess, kafka_bootstrap: str) -> str:
    """A sink whose table holds epoch 0: orders 0-5 of partition 0 and 100-105 of partition 1 (offsets 0-5 of each);
    the topic holds 10 records in each."""
    topic = create_topic(kafka_bootstrap, 2, prefix="fresh")
    produce(kafka_bootstrap, topic, range(0, 10), 0)
    produce(kafka_bootstrap, topic, range(100, 110), 1)
    with coordinator.client() as client:
        registration = client.register_writer(SINK, TABLE, -1, arrow_schema=ORDERS.serialize().to_pybytes())
        files = [write_parquet(registration.table_location, orders(0, 6) + orders(100, 6))]
        ends = {END_OFFSETS: json.dumps({topic: {"0": 6, "1": 6}})}
        client.pre_commit(SINK, 0, registration.writer_term, files, properties=ends)
        client.commit_checkpoint(SINK, 0, registration.writer_term, wait=True)
    return topic


def read(coordinator: CoordinatorProcess, catalog: Catalog, bootstrap: str, topic: str, **flags: Any) -> Any:
    return fresh.read_arrow(
        sink=SINK, coordinator=coordinator.target, catalog=catalog, bootstrap_servers=bootstrap, topic=topic, **flags
    )


def test_the_table_and_the_tail_meet_at_the_snapshots_end_offsets(
    coordinator: CoordinatorProcess, catalog: Catalog, kafka_bootstrap: str, sink: str
) -> None:
    rows = read(coordinator, catalog, kafka_bootstrap, sink)
    assert sorted(rows["order_id"].to_pylist()) == [*range(10), *range(100, 110)]
    assert rows.schema.field("order_id").type == ORDERS.field("order_id").type
    assert json.loads(rows.schema.metadata[SNAPSHOT_END_OFFSETS.encode()]) == {sink: {"0": 10, "1": 10}}


def test_a_partition_added_after_the_snapshot_is_read_from_its_start(
    coordinator: CoordinatorProcess, catalog: Catalog, kafka_bootstrap: str, sink: str
) -> None:
    add_partitions(kafka_bootstrap, sink, 3)
    produce(kafka_bootstrap, sink, range(200, 203), 2)
    rows = read(coordinator, catalog, kafka_bootstrap, sink)
    assert sorted(rows["order_id"].to_pylist()) == [*range(10), *range(100, 110), *range(200, 203)]


def test_records_retention_deleted_before_the_sink_read_them_fail_the_read_or_are_skipped(
    coordinator: CoordinatorProcess, catalog: Catalog, kafka_bootstrap: str, sink: str
) -> None:
    delete_records_before(kafka_bootstrap, sink, 0, 8)  # offsets 6 and 7 of partition 0: never in the table
    with pytest.raises(DataLossError, match=r"partition 0: offsets \[6, 10\).*earliest available offset is 8"):
        read(coordinator, catalog, kafka_bootstrap, sink)
    rows = read(coordinator, catalog, kafka_bootstrap, sink, fail_on_data_loss=False)
    assert sorted(rows["order_id"].to_pylist()) == [*range(6), 8, 9, *range(100, 110)]
    delete_records_before(kafka_bootstrap, sink, 1, 4)  # below the table's end: the table holds them, nothing lost
    assert len(read(coordinator, catalog, kafka_bootstrap, sink, fail_on_data_loss=False)) == 18


def test_flags_that_are_not_the_sinks_are_refused(
    coordinator: CoordinatorProcess, catalog: Catalog, kafka_bootstrap: str, sink: str
) -> None:
    with pytest.raises(SinkMismatchError, match=r"with the key \[\], the flags give \['order_id'\]"):
        read(coordinator, catalog, kafka_bootstrap, sink, mode="upsert", key="order_id")
    with pytest.raises(SinkMismatchError, match=r"not 'shop\.other'"):
        fresh.read_arrow(
            sink=SINK,
            coordinator=coordinator.target,
            catalog=catalog,
            table="shop.other",
            bootstrap_servers=kafka_bootstrap,
            topic=sink,
        )
    other = create_topic(kafka_bootstrap, 1, prefix="other")
    with pytest.raises(ValueError, match=rf"topic\(s\) \['{sink}'\], which --topic \['{other}'\] does not name"):
        read(coordinator, catalog, kafka_bootstrap, other)
