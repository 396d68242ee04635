"""The writer's job on Spark: the session to run in, the query started from the job's settings, waited for and
stopped between two batches on request, and what is checked before Spark starts.

`sink-writer` (spark_writer.job) runs these; a job of one's own can too (docs/spark-writer.md: the Python API).
"""

from __future__ import annotations

import os
from typing import Final

import structlog
from pyspark.sql import SparkSession

from spark_writer.driver_jvm import SparkLog
from spark_writer.job_failures import ExitCode, JobFailure, one_line
from spark_writer.job_records import registry_parser, table_records, task_ranges
from spark_writer.job_settings import KafkaSettings, KafkaSource, ParseSettings, SinkSettings
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_source import register_kafka_sources
from spark_writer.mutations.tasks import keyed_tasks
from spark_writer.session import local_spark_session, retries_tasks
from spark_writer.sink.iceberg_sink import write_to_iceberg
from spark_writer.sink.parquet_writer import append_tasks
from spark_writer.sink.sink_query import IcebergSinkQuery
from spark_writer.start_checks import wait_for_coordinator, wait_for_topics
from spark_writer.stop_signals import StopRequest

log = structlog.get_logger(__name__)

STOP_CHECK_SECONDS: Final = 1
# A local master without a retry count is given one (spark_writer.session.with_task_retries).
DEFAULT_LOCAL_MASTER: Final = "local[*]"


def spark_session(
    master: str | None,
    spark_log: SparkLog | None = None,
    app_name: str = "sink-writer",
    *,
    records_in_jvm: bool = True,
) -> SparkSession:
    """The session to run in: spark-submit's when it launched us (its JVM logs as spark-submit says), else a local
    one (Java found, source registered); `spark_log`: where the JVM of a local one and py4j log (else the console);
    `records_in_jvm`: whether the stream's records pass through the JVM (session.local_spark_session)."""
    if spark_log is not None:
        spark_log.capture_py4j()
    # spark-submit starts the JVM first and tells the Python driver its gateway port.
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        register_kafka_sources(spark)
        submitted_master = spark.sparkContext.master or ""
        if not retries_tasks(submitted_master):
            log.warning(
                "failed tasks are not retried under this master: pass spark-submit --master 'local[N, 4]'",
                master=submitted_master,
            )
        return spark
    if spark_log is not None:
        log.info("spark's own log", path=str(spark_log.path), on_console=spark_log.on_console)
    return local_spark_session(app_name, master or DEFAULT_LOCAL_MASTER, spark_log, records_in_jvm=records_in_jvm)


def start_job(spark: SparkSession, kafka: KafkaSettings, parse: ParseSettings, sink: SinkSettings) -> IcebergSinkQuery:
    records, parser = table_records(spark, kafka, parse, sink.sink)
    return write_to_iceberg(
        records,
        sink=sink.sink,
        table=sink.table,
        coordinator=sink.coordinator,
        checkpoint_location=sink.checkpoint_location,
        partition_by=sink.partition_by,
        target_file_size_bytes=sink.target_file_size_bytes,
        processing_time=sink.processing_time,
        available_now=sink.available_now,
        writer_token=sink.writer_token,
        evolve_schema=parse.evolve_schema,
        transform=parser,
        query_name=sink.sink,
        coordinator_retry_seconds=sink.coordinator_retry_seconds,
        storage=sink.storage,
        routes=sink.routes,
        key_columns=parse.mutations.key,
        tasks=keyed_tasks if parse.mutations.keyed else append_tasks,
    )


def run_until_done(query: IcebergSinkQuery, stop: StopRequest) -> bool:
    """Wait for the query (availableNow: until drained); False if a stop was requested and made first."""
    while not query.await_termination(STOP_CHECK_SECONDS):
        if stop.signal is not None:
            log.warning("stop requested: stopping the query between two batches", signal=stop.signal.name)
            query.stop()
            return False
    return True


def check_before_spark(
    kafka: KafkaSettings, parse: ParseSettings, sink: SinkSettings, wait_for_topic: float, stop: StopRequest
) -> None:
    """What needs no Spark, checked before it starts: the coordinator answers, the topics exist (with the Python
    source; Spark's connector waits for a topic as Spark's users know), the registry has the subjects."""
    wait_for_coordinator(sink.coordinator, sink.writer_token, sink.sink, sink.coordinator_retry_seconds, stop)
    if kafka.source is KafkaSource.PYTHON and not stop.requested:
        wait_for_topics(parse_options(kafka.source_options()), wait_for_topic, stop)
    if parse.record_format.registry_format is not None and not stop.requested:
        try:
            registry_parser(kafka, parse, sink.sink)  # the subjects' schemas read and mapped: refused now, not in Spark
        except ValueError as error:
            raise JobFailure(one_line(str(error)), ExitCode.USAGE) from None


def run_on_spark(
    kafka: KafkaSettings,
    parse: ParseSettings,
    sink: SinkSettings,
    master: str | None,
    spark_log: SparkLog,
    stop: StopRequest,
) -> bool:
    """Start Spark and run the job; False when a stop request ended it before its end."""
    spark = spark_session(master, spark_log, records_in_jvm=task_ranges(kafka, parse) is None)
    stop.install()  # the SparkContext replaced SIGINT's handler
    try:
        if stop.requested:
            return False
        try:
            query = start_job(spark, kafka, parse, sink)
        except ValueError as error:  # what could only be checked on the running session (a schema, a column)
            raise JobFailure(one_line(str(error)), ExitCode.USAGE) from None
        return run_until_done(query, stop)
    finally:
        # Spark's threads stopped before the interpreter exits, not left to the JVM's end.
        spark.stop()
