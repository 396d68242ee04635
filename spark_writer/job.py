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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import structlog
import typer
from pydantic import ByteSize

from coordinator_service.contract.flag_values import KEY_VALUE, SIZE, KeyValue, parse_key_value, parse_size
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
from coordinator_service.contract.table_identifiers import sink_name_problem, table_identifier_problem
from spark_writer.driver_jvm import SparkLog
from spark_writer.formats.json_decoding import DEFAULT_JSON_TIME_ZONE, check_time_zone
from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.job_failures import ExitCode, failure_of, one_line
from spark_writer.job_flags import (
    MAX_WAIT_SECONDS,
    SECONDS,
    coordinator_address,
    op_map_flag,
    partition_syntax,
    refused_by,
    seconds,
)
from spark_writer.job_run import (
    DEFAULT_LOCAL_MASTER,
    check_before_spark,
    run_on_spark,
    run_until_done,
    spark_session,
    start_job,
)
from spark_writer.job_settings import (
    DEFAULT_SAMPLE_SIZE,
    KafkaSettings,
    KafkaSource,
    ParseSettings,
    RecordFormat,
    SinkSettings,
)
from spark_writer.kafka.options import DEFAULT_STARTING_OFFSETS
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations, Op, default_op_map, key_names
from spark_writer.routing.routes import Unrouted, routes_from_flags
from spark_writer.session import with_task_retries
from spark_writer.sink.sink_arguments import DEFAULT_COORDINATOR_RETRY_SECONDS, DEFAULT_TARGET_FILE_SIZE_BYTES
from spark_writer.stop_signals import stop_on_signals
from spark_writer.worker_logging import set_worker_log_level

# The job's Python API (docs/spark-writer.md) is this module's: the settings, the session, the query started and
# waited for; the command line is `app` (run: the `sink-writer` command).
__all__ = [
    "DEFAULT_LOCAL_MASTER",
    "KafkaSettings",
    "ParseSettings",
    "RecordFormat",
    "SinkSettings",
    "app",
    "main",
    "run",
    "run_until_done",
    "spark_session",
    "start_job",
]

log = structlog.get_logger(__name__)


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
