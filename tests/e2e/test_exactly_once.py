"""The whole pipeline in one process: a real broker, the real coordinator process, the session's local Spark."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS, SNAPSHOT_VALID_THROUGH_MS
from spark_writer.job import start_job
from spark_writer.job_settings import SPARK_KAFKA_PROVIDER, KafkaSettings, KafkaSource, ParseSettings, SinkSettings
from spark_writer.sink.iceberg_sink import write_to_iceberg
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.pipeline import (
    ORDER_SCHEMA_DDL,
    QUERY_TIMEOUT_SECONDS,
    kafka_positions,
    newest_marked_summary,
    order_ids,
    order_stream,
    produce_orders,
    produced_positions,
    table_arrow,
)
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]


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
    orders = order_stream(spark, kafka_bootstrap, topic, max_offsets=600)
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
    assert coordinator.database_url is not None
    verified = assert_verified(coordinator.database_url, catalog, "orders", kafka_bootstrap)
    assert verified.tables[0].kafka and verified.end_offsets
    assert order_ids(catalog, "shop.orders") == Counter(range(3000))
    with coordinator.client() as client:
        state = client.sink_state("orders")
    assert state.committed_epoch == state.checkpointed_epoch == 4
    first = httpx.get(f"{coordinator.http_url}/api/v1/sinks/orders/epochs/0").json()
    assert json.loads(first["properties"]["spark.end_offsets"]) == [
        {
            "$start": {topic: {"0": 0, "1": 0, "2": 0}},
            "$incarnations": {topic: {"logStarts": {"0": 0, "1": 0, "2": 0}}},  # noida-db reports no topic ids
            topic: {"0": 200, "1": 200, "2": 200},
        }
    ]
    # The executors shipped every file's footer: the coordinator read none from storage.
    footers = {
        source: float(line.rsplit(" ", 1)[1])
        for source in ("sent", "read")
        for line in httpx.get(f"{coordinator.http_url}/metrics").text.splitlines()
        if line.startswith(f'sink_coordinator_precommit_footers_total{{source="{source}"}}')
    }
    assert footers.get("sent", 0) > 0 and footers.get("read", 0) == 0, footers


def test_partitioned_table_one_partition_per_file(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=2)
    produced = produce_orders(kafka_bootstrap, topic, range(1200), partitions=2)
    orders = order_stream(spark, kafka_bootstrap, topic, max_offsets=600)
    running = write_to_iceberg(
        orders,
        sink="orders-by-country-day",
        table="shop.orders_by_country_day",
        coordinator=coordinator.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        partition_by=("country", "day(created_at)"),
        available_now=True,
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert kafka_positions(catalog, "shop.orders_by_country_day") == produced_positions(produced)
    assert coordinator.database_url is not None
    assert_verified(coordinator.database_url, catalog, "orders-by-country-day", kafka_bootstrap)
    table = catalog.load_table("shop.orders_by_country_day")
    assert [str(field) for field in table.spec().fields] == [
        "1000: country: identity(4)",
        "1001: created_at_day: day(5)",
    ]
    files = table.inspect.files().select(["file_path", "partition"]).to_pylist()
    partitions = {(f["partition"]["country"], f["partition"]["created_at_day"]) for f in files}
    assert len(partitions) == 9, "3 countries x 3 days"
    for data_file in files:
        rows = pq.read_table(data_file["file_path"].removeprefix("file://"), columns=["country", "created_at"])
        days = {ts.date() for ts in rows.column("created_at").to_pylist()}
        countries = set(rows.column("country").to_pylist())
        expected = data_file["partition"]
        assert (countries, days) == ({expected["country"]}, {expected["created_at_day"]}), data_file["file_path"]


def test_new_json_field_mid_stream_becomes_a_column(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """The job infers the schema from a sample, then a field appears: the table grows a column, no record is lost."""
    topic = kafka_topic(partitions=2)
    before = produce_orders(kafka_bootstrap, topic, range(1000), partitions=2)
    running = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=500),
        ParseSettings(evolve_schema=True, kafka_metadata=True),
        SinkSettings(
            sink="orders-evolving",
            table="shop.orders_evolving",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
        ),
    )
    running.query.processAllAvailable()
    assert "coupon" not in catalog.load_table("shop.orders_evolving").schema().column_names

    after = produce_orders(kafka_bootstrap, topic, range(1000, 2000), partitions=2, coupon="SPRING")
    running.query.processAllAvailable()
    running.stop()

    coordinator.wait_for_log("added columns to iceberg table", columns=["coupon"])
    assert kafka_positions(catalog, "shop.orders_evolving") == produced_positions(before + after)
    rows = table_arrow(catalog, "shop.orders_evolving", ("order_id", "coupon")).to_pylist()
    assert {row["order_id"]: row["coupon"] for row in rows} == {
        **dict.fromkeys(range(1000)),
        **dict.fromkeys(range(1000, 2000), "SPRING"),
    }

    # The newest snapshot says where the stream ended and how far in time every partition is in the table.
    summary = newest_marked_summary(catalog, "shop.orders_evolving")
    read = table_arrow(catalog, "shop.orders_evolving", ("kafka_partition", "kafka_offset", "kafka_timestamp"))
    ends: dict[str, int] = {}
    latest: dict[int, int] = {}
    for row in read.to_pylist():
        partition = row["kafka_partition"]
        ends[str(partition)] = max(ends.get(str(partition), 0), row["kafka_offset"] + 1)
        latest[partition] = max(latest.get(partition, 0), int(row["kafka_timestamp"].timestamp() * 1000))
    assert json.loads(summary[SNAPSHOT_END_OFFSETS]) == {topic: ends}
    assert int(summary[SNAPSHOT_VALID_THROUGH_MS]) == min(latest.values())
    assert_verified(coordinator.database_url, catalog, "orders-evolving", kafka_bootstrap)


def _spark_kafka_on_classpath(spark: SparkSession) -> bool:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(SPARK_KAFKA_PROVIDER))


def test_the_spark_kafka_source_without_its_jar_is_refused_before_anything_is_registered(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
) -> None:
    if _spark_kafka_on_classpath(spark):
        pytest.skip("Spark's Kafka connector jar is on this classpath: the refusal cannot happen here")
    topic = kafka_topic(partitions=1)

    with pytest.raises(ValueError, match=r"--source spark needs Spark's Kafka connector .* or use --source python"):
        start_job(
            spark,
            KafkaSettings(kafka_bootstrap, (topic,), source=KafkaSource.SPARK),
            ParseSettings(schema_ddl="order_id BIGINT"),
            SinkSettings(
                sink="orders-spark-source",
                table="shop.orders_spark_source",
                coordinator=coordinator.target,
                checkpoint_location=str(tmp_path / "checkpoint"),
                available_now=True,
            ),
        )

    with coordinator.client() as client, pytest.raises(CoordinatorRpcError) as unknown:
        client.sink_state("orders-spark-source")
    assert unknown.value.code is grpc.StatusCode.NOT_FOUND


def test_every_record_once_through_sparks_own_kafka_source(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    if not _spark_kafka_on_classpath(spark):
        pytest.skip(
            "Spark's Kafka connector (spark-sql-kafka-0-10_2.13 and its dependencies) is not on the classpath: "
            "put its jars in SPARK_HOME/jars (no Maven here)"
        )
    topic = kafka_topic(partitions=3)
    produced = produce_orders(kafka_bootstrap, topic, range(3000), partitions=3)
    running = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=600, source=KafkaSource.SPARK),
        ParseSettings(schema_ddl=ORDER_SCHEMA_DDL, evolve_schema=False, kafka_metadata=True),
        SinkSettings(
            sink="orders-spark-kafka",
            table="shop.orders_spark_kafka",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            available_now=True,
        ),
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert kafka_positions(catalog, "shop.orders_spark_kafka") == produced_positions(produced)
    assert coordinator.database_url is not None
    assert_verified(coordinator.database_url, catalog, "orders-spark-kafka", kafka_bootstrap)
    assert order_ids(catalog, "shop.orders_spark_kafka") == Counter(range(3000))
