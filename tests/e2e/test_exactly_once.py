"""The whole pipeline in one process: a real broker, the real coordinator process, the session's local Spark."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession

from spark_writer.iceberg_sink import write_to_iceberg
from spark_writer.kafka_records import json_records, schema_from_ddl
from spark_writer.kafka_source import SOURCE_NAME
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.pipeline import (
    ORDER_SCHEMA_DDL,
    kafka_positions,
    order_ids,
    produce_orders,
    produced_positions,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

QUERY_TIMEOUT_SECONDS = 180
TopicFactory = Callable[..., str]


def kafka_stream(spark: SparkSession, bootstrap: str, topic: str, max_offsets: int) -> DataFrame:
    return (
        spark.readStream.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .load()
    )


def test_every_record_once_over_several_batches(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=3)
    produced = produce_orders(kafka_bootstrap, topic, range(3000), partitions=3)
    orders = json_records(
        kafka_stream(spark, kafka_bootstrap, topic, max_offsets=600),
        schema_from_ddl(ORDER_SCHEMA_DDL),
        kafka_metadata=True,
    )
    running = write_to_iceberg(
        orders,
        sink="orders",
        table="shop.orders",
        coordinator=coordinator.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        available_now=True,
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert kafka_positions(catalog, "shop.orders") == produced_positions(produced)
    assert order_ids(catalog, "shop.orders") == Counter(range(3000))
    with coordinator.client() as client:
        state = client.sink_state("orders")
    assert state.committed_epoch == state.checkpointed_epoch >= 4, "the records came in one batch"
