"""What the job relies on from Spark, on a real local session: failed tasks are retried, and zone-less JSON
timestamps are read in one documented zone whatever the session's zone is."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql import SparkSession

from spark_writer.kafka.source import KAFKA_SCHEMA
from spark_writer.sink.kafka_records import json_records, schema_from_ddl

pytestmark = pytest.mark.spark


def test_a_failed_task_is_retried(spark: SparkSession) -> None:
    def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Defined here, so that it is shipped to the Python workers by value.
        context = TaskContext.get()
        assert context is not None
        if context.attemptNumber() == 0:
            raise RuntimeError("injected failure of the first attempt of a task")
        yield from batches

    rows = spark.range(0, 6, numPartitions=2).mapInArrow(fail_first_attempt, "id long").collect()
    assert sorted(row.id for row in rows) == list(range(6))


@pytest.fixture
def new_york_session(spark: SparkSession) -> Iterator[SparkSession]:
    """The session's zone set as a spark-submit in New York would have it (the JVM's default zone)."""
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_zone_less_json_timestamps_are_utc_whatever_the_session_zone(new_york_session: SparkSession) -> None:
    values = ['{"id": 1, "at": "2025-03-01T23:30:00"}', '{"id": 2, "at": "2025-03-01T23:30:00-05:00"}']
    records = [(None, value.encode(), "t", 0, offset, None, -1, None) for offset, value in enumerate(values)]
    kafka = new_york_session.createDataFrame(records, KAFKA_SCHEMA)

    parsed = json_records(kafka, schema_from_ddl("id BIGINT, at TIMESTAMP")).toArrow()

    instants = dict(zip(parsed.column("id").to_pylist(), parsed.column("at").to_pylist(), strict=True))
    assert instants[1] == dt.datetime(2025, 3, 1, 23, 30, tzinfo=dt.UTC), "a zone-less timestamp is read as UTC"
    assert instants[2] == dt.datetime(2025, 3, 2, 4, 30, tzinfo=dt.UTC), "an explicit offset is kept"


def test_workers_import_pyspark_from_the_installed_package(spark: SparkSession) -> None:
    def pyspark_location(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyspark

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"file": pyspark.__file__}])

    (row,) = spark.range(1, numPartitions=1).mapInArrow(pyspark_location, "file string").collect()
    assert ".zip" not in row.file, f"a worker imported PySpark from Spark's zip (no bytecode cache): {row.file}"
