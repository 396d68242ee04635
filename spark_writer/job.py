"""`sink-writer`: stream Kafka topics into an Iceberg table exactly once, through the commit coordinator.

Run it directly (a local Spark unless --master says otherwise)::

    sink-writer --bootstrap-servers localhost:9092 --topic orders \\
        --schema "order_id BIGINT, amount DOUBLE, created_at TIMESTAMP" \\
        --sink orders --table shop.orders --coordinator localhost:50051 \\
        --checkpoint-location /data/checkpoints/orders

or hand the same module to spark-submit (the package and its dependencies must
be importable on the driver and the executors: installed in their Python, or
shipped with --py-files / --archives)::

    spark-submit --master spark://host:7077 spark_writer/job.py --bootstrap-servers ... (same flags)

Records are parsed as JSON objects (a given schema, or one inferred from a
sample of the newest records, grown batch by batch when new fields appear), decoded
as Avro, Protobuf or JSON Schema with their schemas from a schema registry
(--format avro|protobuf|json-schema --schema-registry-url URL; the table follows the
subject's latest version), or kept raw (key, value, topic, partition, offset,
timestamp). See docs/spark-writer.md for every flag and how exactly-once works.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Final

import structlog
import typer
from pydantic import ByteSize
from pyspark.sql import SparkSession

from coordinator_service.contract.flag_values import KEY_VALUE, SIZE, KeyValue, parse_key_value, parse_size
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
from coordinator_service.contract.table_identifiers import sink_name_problem, table_identifier_problem
from spark_writer.driver_jvm import SparkLog
from spark_writer.job_failures import ExitCode, JobFailure, failure_of, one_line
from spark_writer.job_records import registry_parser, table_records
from spark_writer.job_settings import (
    DEFAULT_SAMPLE_SIZE,
    KafkaSettings,
    KafkaSource,
    ParseSettings,
    RecordFormat,
    SinkSettings,
)
from spark_writer.kafka.options import DEFAULT_STARTING_OFFSETS, parse_options
from spark_writer.kafka.source import KafkaDataSource
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations, Op, default_op_map, key_names, parse_op_map
from spark_writer.mutations.tasks import keyed_tasks
from spark_writer.routing.routes import Unrouted, routes_from_flags
from spark_writer.session import local_spark_session, retries_tasks, with_task_retries
from spark_writer.sink.iceberg_sink import (
    DEFAULT_COORDINATOR_RETRY_SECONDS,
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    write_to_iceberg,
)
from spark_writer.sink.kafka_records import DEFAULT_JSON_TIME_ZONE, BadRecordPolicy, check_time_zone
from spark_writer.sink.parquet_writer import append_tasks
from spark_writer.sink.partitioning import parse_partition_specs
from spark_writer.sink.sink_query import IcebergSinkQuery
from spark_writer.start_checks import wait_for_coordinator, wait_for_topics
from spark_writer.stop_signals import StopRequest, stop_on_signals
from spark_writer.worker_logging import set_worker_log_level

log = structlog.get_logger(__name__)

STOP_CHECK_SECONDS: Final = 1
# A local master without a retry count is given one (spark_writer.session.with_task_retries).
DEFAULT_LOCAL_MASTER: Final = "local[*]"
MAX_WAIT_SECONDS: Final = 86_400.0


def spark_session(master: str | None, spark_log: SparkLog | None = None, app_name: str = "sink-writer") -> SparkSession:
    """The session to run in: spark-submit's when it launched us (its JVM logs as spark-submit says), else a local
    one (Java found, source registered); `spark_log`: where the JVM of a local one and py4j log (else the console)."""
    if spark_log is not None:
        spark_log.capture_py4j()
    # spark-submit starts the JVM first and tells the Python driver its gateway port.
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        spark.dataSource.register(KafkaDataSource)
        submitted_master = spark.sparkContext.master or ""
        if not retries_tasks(submitted_master):
            log.warning(
                "failed tasks are not retried under this master: pass spark-submit --master 'local[N, 4]'",
                master=submitted_master,
            )
        return spark
    if spark_log is not None:
        log.info("spark's own log", path=str(spark_log.path), on_console=spark_log.on_console)
    return local_spark_session(app_name, master or DEFAULT_LOCAL_MASTER, spark_log)


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
    spark = spark_session(master, spark_log)
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
        # Stops the listener bus before the interpreter exits, so that no event is sent to a closed gateway.
        spark.stop()


def ended(error: BaseException, spark_log: SparkLog) -> typer.Exit:
    """Log the failure's cause as the run's last line; when the cause is none of the job's own (code 1), the whole
    error goes to Spark's log, which the line names. The exit that says the failure's kind."""
    failure = failure_of(error)
    where = {}
    if failure.exit_code is ExitCode.FAILED:
        spark_log.append_error(error)
        where = {"spark_log": str(spark_log.path)}
    log.error("sink writer failed", error=failure.cause, exit_code=int(failure.exit_code), **where)
    return typer.Exit(failure.exit_code)


def seconds(low: float, high: float) -> Callable[[str], float]:
    """A flag's parser of a number of seconds from `low` to `high` (not NaN, not infinite)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise typer.BadParameter(f"{text!r} is not between {low:g} and {high:g} seconds")
        return value

    return parse


def refused_by(problem: Callable[[str], str | None]) -> Callable[[str], str]:
    """A flag's check of a name against a policy (coordinator_service.contract.table_identifiers), naming the flag."""

    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise typer.BadParameter(found)
        return value

    return check


# gRPC's own target schemes (dns:///host:port, unix:/path, ...): taken as they are.
GRPC_TARGET_SCHEMES: Final = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:")


def coordinator_address(value: str) -> str:
    """A flag's check of the coordinator's gRPC address: HOST:PORT (a port from 1 to 65535), or a gRPC target."""
    if value.startswith(GRPC_TARGET_SCHEMES):
        return value
    if "://" in value:
        raise typer.BadParameter(f"{value!r} is a URL: give the coordinator's gRPC address, HOST:PORT")
    host, _, port = value.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (a port from 1 to 65535), such as 127.0.0.1:50051")
    return value


def partition_syntax(values: list[str] | None) -> list[str] | None:
    try:
        parse_partition_specs(values or ())
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return values


def op_map_flag(text: str) -> dict[str, Op]:
    try:
        return parse_op_map(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


SECONDS: Final = "<seconds>"

app = typer.Typer(
    name="sink-writer",
    help="Stream Kafka topics into an Apache Iceberg table exactly once, through the sink coordinator.",
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def main(
    bootstrap_servers: Annotated[
        str, typer.Option(help="Kafka bootstrap servers, host:port[,host:port].", envvar="KAFKA_BOOTSTRAP_SERVERS")
    ],
    topic: Annotated[list[str], typer.Option(help="Topic to read (repeat for several).")],
    sink: Annotated[
        str,
        typer.Option(help="The coordinator's name for this query and table.", callback=refused_by(sink_name_problem)),
    ],
    table: Annotated[
        str,
        typer.Option(
            help="Iceberg table, namespace.table (created when missing).", callback=refused_by(table_identifier_problem)
        ),
    ],
    checkpoint_location: Annotated[str, typer.Option(help="Spark checkpoint directory (any Hadoop URI).")],
    coordinator: Annotated[
        str,
        typer.Option(
            help="gRPC address of the coordinator, HOST:PORT.",
            envvar="SINK_WRITER_COORDINATOR",
            callback=coordinator_address,
        ),
    ] = "127.0.0.1:50051",
    writer_token: Annotated[
        str | None, typer.Option(help="The coordinator's writer token.", envvar="SINK_WRITER_TOKEN")
    ] = None,
    coordinator_retry_seconds: Annotated[
        float,
        typer.Option(
            help="How long a coordinator call retries while it is unreachable (at start too, saying so).",
            parser=seconds(0.1, MAX_WAIT_SECONDS),
            metavar=SECONDS,
        ),
    ] = DEFAULT_COORDINATOR_RETRY_SECONDS,
    starting_offsets: Annotated[
        str, typer.Option(help='earliest, latest or JSON {"topic": {"0": 42}}; only for a new checkpoint.')
    ] = DEFAULT_STARTING_OFFSETS,
    max_offsets_per_trigger: Annotated[
        int | None, typer.Option(min=1, help="Most records per micro-batch (shared over partitions).")
    ] = None,
    kafka_option: Annotated[
        list[KeyValue] | None,
        typer.Option(
            help="librdkafka consumer setting key=value (repeat), e.g. security.protocol=SSL.",
            parser=parse_key_value,
            metavar=KEY_VALUE,
        ),
    ] = None,
    fail_on_data_loss: Annotated[
        bool, typer.Option(help="Fail when records were deleted before they were read.")
    ] = True,
    source: Annotated[
        KafkaSource,
        typer.Option(
            help="python: this project's Kafka source (no jar); spark: Spark's own (spark-sql-kafka-0-10 on the "
            "classpath; --kafka-option keys then go to the Java Kafka client)."
        ),
    ] = KafkaSource.PYTHON,
    record_format: Annotated[
        RecordFormat,
        typer.Option(
            "--format",
            help="json: parse values as JSON objects; avro, protobuf, json-schema: decode values in Confluent's wire "
            "format with their schemas from --schema-registry-url; raw: keep Kafka columns.",
        ),
    ] = RecordFormat.JSON,
    schema_registry_url: Annotated[
        str | None,
        typer.Option(
            help="Schema registry URL(s), comma-separated (avro, protobuf, json-schema).",
        ),
    ] = None,
    schema_registry_option: Annotated[
        list[KeyValue] | None,
        typer.Option(
            help="Schema registry client setting key=value (repeat): basic.auth.user.info, ssl.ca.location, "
            "bearer.auth.credentials.source, timeout, ...",
            parser=parse_key_value,
            metavar=KEY_VALUE,
        ),
    ] = None,
    subject: Annotated[
        str | None, typer.Option(help="Subject whose latest version the table follows; default: <topic>-value.")
    ] = None,
    decode_key: Annotated[
        bool, typer.Option(help="Decode keys too (same format, subject <topic>-key) into a `key` column.")
    ] = False,
    key_subject: Annotated[str | None, typer.Option(help="Subject of the keys; default: <topic>-key.")] = None,
    protobuf_message: Annotated[
        str | None, typer.Option(help="Message of the Protobuf schema the table holds; default: its first.")
    ] = None,
    mode: Annotated[
        MutationMode,
        typer.Option(
            help="append: every record is a new row; upsert: the whole new row of its --key (a tombstone deletes "
            "it); cdc: a change whose --op-field or --cdc-envelope says upsert or delete (docs/spark-writer.md)."
        ),
    ] = MutationMode.APPEND,
    key: Annotated[
        str | None, typer.Option(help="upsert, cdc: the key's columns, COL[,COL...]: the table's identifier fields.")
    ] = None,
    op_field: Annotated[str | None, typer.Option(help="cdc: the column holding each change's operation.")] = None,
    op_map: Annotated[
        dict[str, Op] | None,
        typer.Option(
            help="cdc: operations to upsert or delete, VALUE=upsert|delete[,...]; default c, r, u, I, U upsert and "
            "d, D delete.",
            parser=op_map_flag,
            metavar="VALUE=OP,...",
        ),
    ] = None,
    cdc_envelope: Annotated[
        Envelope | None, typer.Option(help="cdc: debezium: the row is after (before for a delete), the operation op.")
    ] = None,
    schema: Annotated[
        str | None, typer.Option(help='JSON schema as DDL, "order_id BIGINT, amount DOUBLE"; default: inferred.')
    ] = None,
    infer_sample: Annotated[
        int, typer.Option(min=1, help="Newest records sampled to infer the JSON schema.")
    ] = DEFAULT_SAMPLE_SIZE,
    evolve_schema: Annotated[
        bool, typer.Option(help="Add new fields (JSON, or new registered versions) as table columns as they appear.")
    ] = True,
    kafka_metadata: Annotated[
        bool, typer.Option(help="Add kafka_topic, kafka_partition, kafka_offset, kafka_timestamp columns.")
    ] = False,
    json_time_zone: Annotated[
        str, typer.Option(help="Zone of JSON timestamps written without one (any session zone).")
    ] = DEFAULT_JSON_TIME_ZONE,
    on_bad_record: Annotated[
        BadRecordPolicy,
        typer.Option(help="A record that does not fit the schema: fail the batch, write nulls, or dead-letter."),
    ] = BadRecordPolicy.FAIL,
    dead_letter_topic: Annotated[
        str | None, typer.Option(help="Topic of the dead letters (with --on-bad-record dead-letter).")
    ] = None,
    partition_by: Annotated[
        list[str] | None,
        typer.Option(
            help="Partition field of a new table: col, day(ts), truncate(4, s)... (repeat).", callback=partition_syntax
        ),
    ] = None,
    target_file_size: Annotated[
        ByteSize,
        typer.Option(help="Roll data files at this size: bytes, or 128MiB, 64MB, ...", parser=parse_size, metavar=SIZE),
    ] = ByteSize(DEFAULT_TARGET_FILE_SIZE_BYTES),
    trigger_interval: Annotated[
        str | None, typer.Option(help='Micro-batch interval, e.g. "10 seconds"; default: back to back.')
    ] = None,
    available_now: Annotated[bool, typer.Option(help="Process what the topics hold now, then stop.")] = False,
    wait_for_topic: Annotated[
        float,
        typer.Option(
            help="Wait this long for topics that do not exist yet, saying so; 0: refuse them at once.",
            parser=seconds(0, MAX_WAIT_SECONDS),
            metavar=SECONDS,
        ),
    ] = 0.0,
    storage: Annotated[
        list[KeyValue] | None,
        typer.Option(
            help="FileIO property of the table's storage key=value (repeat), as the coordinator's catalog takes "
            "it: s3.endpoint, s3.region, s3.access-key-id, ...; leave secrets to AWS_* variables and files.",
            parser=parse_key_value,
            metavar=KEY_VALUE,
        ),
    ] = None,
    route_by: Annotated[
        str | None, typer.Option(help="Fan-out: the column whose value picks each record's table.")
    ] = None,
    route: Annotated[
        list[str] | None,
        typer.Option(
            help="Fan-out: records whose --route-by value is VALUE go to TABLE (repeat).", metavar="VALUE=TABLE"
        ),
    ] = None,
    dynamic_routes: Annotated[
        bool, typer.Option(help="Fan-out: the --route-by value is the table (namespace.table), created when new.")
    ] = False,
    unrouted: Annotated[
        Unrouted | None,
        typer.Option(help="Fan-out: a record no route takes goes to --table (default), or fails the batch (fail)."),
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            help=f"Spark master; default: spark-submit's, else {with_task_retries(DEFAULT_LOCAL_MASTER)} (a local "
            "master without a retry count is given one: 4 attempts per task)."
        ),
    ] = None,
    spark_log_file: Annotated[
        Path | None,
        typer.Option(
            help="Where Spark's own log goes (its warnings, failed tasks with their stack traces, py4j's), appended; "
            "default: sink-writer-<sink>.log in the temporary directory. On the console too at --log-level DEBUG.",
            dir_okay=False,
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False, help="Log level.")] = LogLevel.INFO,
    log_format: Annotated[LogFormat, typer.Option(help="Log lines as console text or JSON.")] = LogFormat.CONSOLE,
) -> None:
    """Run the streaming job until it is stopped (or, with --available-now, until the topics are drained).

    Exit codes: 0 the job ended by itself; 1 it failed (the last line says why, Spark's log the details); 2 a flag,
    a value, a schema or a topic that does not exist; 3 records that do not fit, have no route or were lost (the
    line names the flag that would take them); 4 the coordinator refused the writer; 5 the coordinator, Kafka or the
    registry did not answer. SIGINT (Ctrl-C) or SIGTERM stops the query between two batches: 130 or 143 (a second
    signal ends the process at once).
    """
    configure_logging(log_level, log_format)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per callback from the JVM
    set_worker_log_level(log_level.value)
    try:
        kafka = KafkaSettings(
            bootstrap_servers=bootstrap_servers,
            topics=tuple(topic),
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_offsets_per_trigger,
            fail_on_data_loss=fail_on_data_loss,
            consumer_options=dict(kafka_option or ()),
            source=source,
        )
        parse = ParseSettings(
            record_format,
            schema,
            infer_sample,
            evolve_schema,
            kafka_metadata,
            check_time_zone(json_time_zone),
            on_bad_record,
            dead_letter_topic,
            schema_registry_url=schema_registry_url,
            schema_registry_options=dict(schema_registry_option or ()),
            subject=subject,
            decode_key=decode_key,
            key_subject=key_subject,
            protobuf_message=protobuf_message,
            mutations=Mutations(
                mode, key_names(key) if key else (), op_field, op_map or default_op_map(), cdc_envelope
            ),
        )
        sink_settings = SinkSettings(
            sink=sink,
            table=table,
            coordinator=coordinator,
            checkpoint_location=checkpoint_location,
            writer_token=writer_token,
            partition_by=tuple(partition_by or ()),
            target_file_size_bytes=target_file_size,
            processing_time=trigger_interval,
            available_now=available_now,
            coordinator_retry_seconds=coordinator_retry_seconds,
            storage=dict(storage or ()),
            routes=routes_from_flags(route_by, route or (), dynamic_routes, unrouted),
        )
        parse.mutations.check_route_column(route_by)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    spark_log = SparkLog(spark_log_file or SparkLog.default_path(sink), on_console=log_level is LogLevel.DEBUG)
    try:
        spark_log.check()
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="'--spark-log-file'") from None
    with stop_on_signals() as stop:
        try:
            check_before_spark(kafka, parse, sink_settings, wait_for_topic, stop)
        except Exception as error:
            raise ended(error, spark_log) from None
        try:
            done = not stop.requested and run_on_spark(kafka, parse, sink_settings, master, spark_log, stop)
        except Exception as error:
            raise ended(error, spark_log) from None
    if not done:
        assert stop.signal is not None  # nothing else ends the job early without an error
        log.warning("sink writer stopped before the end", signal=stop.signal.name, exit_code=stop.exit_code)
        raise typer.Exit(stop.exit_code)


def run(args: Sequence[str] | None = None) -> None:
    """The `sink-writer` command: the job, whose every end is one last line and an exit code (ExitCode); a flag
    that is wrong is one line too, `Error: ...`, with exit code 2."""
    try:
        exit_code = app(args=args, standalone_mode=False)
    except typer.TyperException as error:  # typer's click: a flag or a value
        typer.echo(f"Error: {one_line(error.format_message())}", err=True)
        sys.exit(error.exit_code)
    sys.exit(exit_code or 0)


if __name__ == "__main__":
    run()
