"""A running query whose writer term is fenced by a newer writer stops with the coordinator's reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from pyiceberg.catalog import Catalog
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from coordinator_service.contract.client import CoordinatorRpcError
from spark_writer.arrow_schema import arrow_schema_of, serialize_schema
from spark_writer.sink.iceberg_sink import write_to_iceberg
from spark_writer.sink.sink_query import SinkRefusedError
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.pipeline import QUERY_TIMEOUT_SECONDS, order_ids, order_stream, produce_orders
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]


def test_fenced_writer_stops_with_the_reason(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=2)
    produce_orders(kafka_bootstrap, topic, range(4000), partitions=2)
    orders = order_stream(spark, kafka_bootstrap, topic, max_offsets=200)
    running = write_to_iceberg(
        orders,
        sink="orders",
        table="shop.orders",
        coordinator=coordinator.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        available_now=True,
    )
    coordinator.wait_for_log("pre-commit persisted", sink="orders", epoch=1)

    # Another job takes the sink over (say, a second deployment started by mistake) from the checkpoint the
    # coordinator recorded. The running writer may checkpoint between the read and the registration, which is then
    # refused as a checkpoint behind the coordinator's: read it again, as a restarted deployment would.
    with coordinator.client() as client:
        for _ in range(20):
            recorded = client.sink_state("orders").checkpointed_epoch
            try:
                newer = client.register_writer(
                    "orders", "shop.orders", recorded, arrow_schema=serialize_schema(arrow_schema_of(orders.schema))
                )
                break
            except CoordinatorRpcError as error:
                if error.code != grpc.StatusCode.FAILED_PRECONDITION or "checkpoint was lost" not in error.message:
                    raise
        else:
            raise AssertionError("the running writer checkpointed before every one of 20 registrations")
    assert newer.writer_term == 2

    with pytest.raises((StreamingQueryException, SinkRefusedError), match="fenced by term 2"):
        running.await_termination(QUERY_TIMEOUT_SECONDS)
    assert not running.query.isActive
    in_table = order_ids(catalog, "shop.orders")
    assert max(in_table.values(), default=1) == 1, "an order was written twice"
    assert sum(in_table.values()) < 4000, "the fenced query went on to the end"
    assert_verified(coordinator.database_url, catalog, "orders", kafka_bootstrap)
