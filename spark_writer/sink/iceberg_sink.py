"""Exactly-once from a Spark streaming DataFrame into an Iceberg table, through the commit coordinator.

``write_to_iceberg(df, sink=..., table=..., coordinator=..., checkpoint_location=...)``
starts a ``foreachBatch`` query whose every micro-batch (epoch = batch id) goes
through the coordinator's two-phase commit:

1. At start, the writer reads the highest batch id in ``<checkpoint>/commits/``
   and calls RegisterWriter with it (and the data's Arrow schema, so that the
   coordinator creates or evolves the table). The coordinator aborts the epochs
   above it that an earlier run pre-committed (Spark will run them again) and
   commits those at or below it (Spark will not).
2. For batch N the executors write Parquet files under ``<table location>/data``
   (``spark_writer.sink.parquet_writer``); the driver pre-commits their paths, with
   their footers and sizes, as epoch N. PreCommit answers once the epoch is durable in the coordinator's log;
   any error fails the batch, so Spark does not checkpoint it.
3. Spark writes ``commits/N``; then CommitCheckpoint(N) (``spark_writer.sink.checkpoint_reporter``)
   lets the coordinator append the epoch to the table.

A batch that Spark runs again after a crash is pre-committed again under the
new writer term (a new attempt of the epoch); files of the aborted attempt are
deleted by the coordinator and never reach the table.

With ``routes`` (fan-out, ``spark_writer.routing.routes``) the records go to several
tables by a column: the tasks write each table's rows under its location and the
one PreCommit of the batch names each file's table (``spark_writer.sink.fan_out``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import grpc
import pyarrow as pa
import structlog
from pyspark.sql import DataFrame

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.contract.views import PreCommitOutcome, Registration
from spark_writer.arrow_schema import arrow_schema_of, serialize_schema
from spark_writer.formats.record_decoding import RECORDS_READ_PROPERTY
from spark_writer.kafka.positions import TopicPartition, merge_latest, position_properties
from spark_writer.routing.routes import Routes
from spark_writer.sink.checkpoint import NO_BATCH, NO_OFFSET, SparkCheckpoint
from spark_writer.sink.checkpoint_reporter import CheckpointReporter
from spark_writer.sink.fan_out import FanOut
from spark_writer.sink.parquet_writer import BatchTasks, DataFileTarget, append_tasks, delete_files, precommit_files
from spark_writer.sink.partitioning import parse_partition_fields
from spark_writer.sink.sink_arguments import (
    DEFAULT_COORDINATOR_RETRY_SECONDS,
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    check_names,
)
from spark_writer.sink.sink_query import IcebergSinkQuery, SinkRefusedError
from spark_writer.sink.storage import Storage

if TYPE_CHECKING:
    from spark_writer.sink.kafka_records import BatchInput

log = structlog.get_logger(__name__)

# The coordinator keeps at most 64 KiB of properties per epoch (kafka_positions takes up to 24 KiB more); offsets of
# thousands of partitions are left out.
MAX_OFFSETS_PROPERTY_CHARS: Final = 36 * 1024
# Refusals after which no pre-commit was recorded: the files just written belong to nobody and are deleted.
REFUSED_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)

BatchTransform = Callable[[DataFrame], DataFrame]


@runtime_checkable
class DecodesInTasks(Protocol):
    """A transform whose work happens in the writer's own tasks (spark_writer.sink.kafka_records.JsonBatchParser).

    `prepare` gives, per batch, the DataFrame the tasks read, the table rows' Arrow
    schema and how the tasks decode their input into rows; once the files are
    written, `batch_properties` turns the tasks' count of records that did not fit
    into epoch properties.
    """

    @property
    def table_schema(self) -> pa.Schema: ...

    def prepare(self, batch: DataFrame) -> BatchInput: ...

    def batch_properties(self, bad_records: int) -> dict[str, str]: ...


# Spark's adaptive query execution (on by default).
ADAPTIVE_EXECUTION: Final = "spark.sql.adaptive.enabled"


class SinkStoppingError(RuntimeError):
    """A batch started while the query was being stopped; it is not run (Spark runs it again at restart)."""


@dataclass(frozen=True)
class SinkOptions:
    sink: str
    partition_by: tuple[str, ...]
    target_file_size_bytes: int
    evolve_schema: bool
    storage: Storage
    keyed: bool = False  # an upsert or change stream's (key_columns)


class MicroBatchWriter:
    """The ``foreachBatch`` function: write the batch's files on the executors, pre-commit them on the driver."""

    def __init__(
        self,
        client: CoordinatorClient,
        registration: Registration,
        options: SinkOptions,
        checkpoint: SparkCheckpoint,
        reporter: CheckpointReporter,
        transform: BatchTransform | DecodesInTasks | None,
        fan_out: FanOut | None = None,
        tasks: BatchTasks = append_tasks,
    ) -> None:
        self._tasks = tasks
        self._client = client
        self._registration = registration
        self._options = options
        self._checkpoint = checkpoint
        self._reporter = reporter
        self._transform = transform
        self._fan_out = fan_out
        self._state = threading.Condition()
        self._stopping = False
        self._in_batch = False
        self.last_written = NO_BATCH  # the last batch this function returned from: Spark checkpoints it after

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._state:
            if self._stopping:
                # Short on purpose: Spark ends the query with this message (the batch runs again at restart).
                raise SinkStoppingError(
                    f"sink {self._options.sink} is stopping; batch {batch_id} is left for the next run"
                )
            self._in_batch = True
        try:
            self._write(batch, batch_id)
            self.last_written = batch_id
            self._reporter.written(batch_id)
        finally:
            with self._state:
                self._in_batch = False
                self._state.notify_all()

    def stop_between_batches(self, timeout_seconds: float) -> bool:
        """Let a running batch finish and start no other; False if the batch is still running after the timeout."""
        with self._state:
            self._stopping = True
            return self._state.wait_for(lambda: not self._in_batch, timeout_seconds)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        # Spark starts batch N only once commits/N-1 exists: report it now in case the reporter's thread did not.
        self._reporter.report(batch_id - 1)
        if self._options.keyed:
            # In the query's own session (foreachBatch's), never the job's. Adaptive execution would run a keyed
            # batch's shuffle as a job of its own and plan its second stage again, with nothing to change in it (a
            # repartition into a given count is never coalesced): 0.2-0.3 s more per batch of 40,000 records here.
            batch.sparkSession.conf.set(ADAPTIVE_EXECUTION, "false")
        ranges = None
        if isinstance(self._transform, DecodesInTasks):
            prepared = self._transform.prepare(batch)
            frame, schema, decoding, ranges = prepared.frame, prepared.schema, prepared.decoding, prepared.ranges
        else:
            frame = batch if self._transform is None else self._transform(batch)
            schema, decoding = arrow_schema_of(frame.schema), None
        target = DataFileTarget(
            table_location=self._registration.table_location,
            batch_id=batch_id,
            schema=schema,
            partition_fields=parse_partition_fields(self._options.partition_by, schema),
            target_file_size_bytes=self._options.target_file_size_bytes,
            storage=self._options.storage,
            decoding=decoding,
            ranges=ranges,
            routing=None if self._fan_out is None else self._fan_out.task_routing(),
        )
        if self._fan_out is None:
            results = self._tasks(frame, target).collect()
        else:
            results = self._fan_out.write(frame, target, batch_id)
        written = [row for row in results if row.path is not None]
        paths = [row.path for row in written]
        files, key_files = precommit_files(written)
        records = sum(row.record_count for row in written if not row.key_file)
        decodes = isinstance(self._transform, DecodesInTasks)
        # Each task's latest timestamps; merge_latest keeps the largest where tasks read the same partition.
        latest = merge_latest(
            {(row.topic, row.partition): row.latest_timestamp_ms} for row in results if row.topic is not None
        )
        properties = self._properties(batch_id, latest if decodes else None)
        if isinstance(self._transform, DecodesInTasks):
            properties.update(self._transform.batch_properties(sum(row.bad_records for row in results)))
            properties[RECORDS_READ_PROPERTY] = str(sum(row.records_read or 0 for row in results))
        try:
            answer = self._client.pre_commit(
                self._options.sink,
                batch_id,
                self._registration.writer_term,
                files,
                properties=properties,
                evolve_schema=self._options.evolve_schema,
                files_directory=(
                    target.files_directory if self._fan_out is None else self._fan_out.files_directory(target, written)
                ),
                key_files=key_files,
            )
        except CoordinatorRpcError as error:
            if error.code in REFUSED_CODES:
                delete_files(paths, self._options.storage)
            raise
        if answer.outcome is PreCommitOutcome.ALREADY_COMMITTED:
            # The table holds this epoch from an earlier run: these files would be a second copy.
            delete_files(paths, self._options.storage)
            log.warning("batch already committed; its new files deleted", sink=self._options.sink, epoch=batch_id)
            return
        log.info(
            "batch pre-committed",
            sink=self._options.sink,
            epoch=batch_id,
            attempt=answer.attempt,
            files=len(files),
            key_files=len(key_files),
            records=records,
        )

    def _properties(self, batch_id: int, latest: Mapping[TopicPartition, int] | None) -> dict[str, str]:
        """Spark's end offsets of the batch (to restart a query from), and where it ended in Kafka (for the
        snapshots); `latest`: the latest record timestamps the tasks read, None when they did not see records."""
        lines = self._checkpoint.source_end_offsets(batch_id)
        offsets = json.dumps([None if line == NO_OFFSET else json.loads(line) for line in lines])
        properties = {"spark.end_offsets": offsets} if len(offsets) <= MAX_OFFSETS_PROPERTY_CHARS else {}
        return properties | position_properties(lines, latest)


def write_to_iceberg(
    df: DataFrame,
    *,
    sink: str,
    table: str,
    coordinator: str,
    checkpoint_location: str,
    partition_by: Sequence[str] = (),
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
    processing_time: str | None = None,
    available_now: bool = False,
    writer_token: str | None = None,
    evolve_schema: bool = True,
    transform: BatchTransform | DecodesInTasks | None = None,
    query_name: str | None = None,
    coordinator_retry_seconds: float = DEFAULT_COORDINATOR_RETRY_SECONDS,
    storage: Mapping[str, str] | None = None,
    routes: Routes | None = None,
    key_columns: Sequence[str] = (),
    tasks: BatchTasks = append_tasks,
) -> IcebergSinkQuery:
    """Start a streaming query writing `df` into the Iceberg table `table` exactly once.

    Args:
        df: a streaming DataFrame.
        sink: the coordinator's name for this query+table (one running writer per sink).
        table: Iceberg identifier "namespace.table"; created from the data's schema when missing.
        coordinator: gRPC address of the coordinator, "host:port".
        checkpoint_location: Spark's checkpoint; it holds the source offsets and decides the epochs.
        partition_by: partition fields of a table created here ("region", "day(ts)", "truncate(4, s)");
            data files are split so that each lies in one partition.
        target_file_size_bytes: a task starts a new file once its current one reaches this size.
        processing_time: trigger interval ("10 seconds"); default: a batch as soon as the last one ends.
        available_now: process what is in the source now (in several batches) and stop.
        writer_token: the coordinator's WRITER_TOKEN, when it has one.
        evolve_schema: let the coordinator add columns that new data has and the table lacks.
        transform: applied to each micro-batch on the driver before writing; it may change the schema
            from batch to batch (new columns evolve the table when `evolve_schema` is on). Or a transform that
            decodes in the writer's tasks (`DecodesInTasks`, such as kafka_records.JsonBatchParser).
        query_name: Spark query name.
        coordinator_retry_seconds: how long a call to the coordinator retries while it is unreachable before
            the batch fails; a failed checkpoint report is sent again on its own until it lands.
        storage: how executors reach the table's location, as pyiceberg's FileIO properties (`s3.endpoint`,
            `s3.region`, `s3.access-key-id`, ...: the coordinator's catalog takes the same keys); keys left
            out come from each machine's environment (spark_writer.sink.storage).
        routes: fan-out: route each record to a table by a column (spark_writer.routing.routes.Routes); `table` is the
            sink's own table, where unrouted records go under Unrouted.DEFAULT. Each route table is created like
            `table` (from the data's schema, partitioned by `partition_by`) and evolved by its own files.
        key_columns: an upsert or change stream's key (its tables keyed by it), with the `tasks` that write its
            rows and key files (spark_writer.mutations.tasks.keyed_tasks); () and append_tasks: an append stream.

    Raises CoordinatorRpcError when the coordinator refuses the registration (for
    example a checkpoint behind what it committed) and ValueError for bad options.
    """
    check_names(sink, table)
    if key_columns and tasks is append_tasks:
        raise ValueError("an upsert or change stream (key_columns) writes with its own tasks: pass tasks=keyed_tasks")
    if target_file_size_bytes <= 0:
        raise ValueError(f"target_file_size_bytes must be positive, got {target_file_size_bytes}")
    if available_now and processing_time is not None:
        raise ValueError("set processing_time or available_now, not both")
    spark = df.sparkSession
    if isinstance(transform, DecodesInTasks):
        arrow_schema = transform.table_schema
    else:
        initial = df if transform is None else transform(spark.createDataFrame([], df.schema))
        arrow_schema = arrow_schema_of(initial.schema)
    parse_partition_fields(partition_by, arrow_schema)
    if routes is not None:
        routes.check_schema(arrow_schema)
    checkpoint = SparkCheckpoint(spark, checkpoint_location)
    checkpointed = checkpoint.last_committed_batch()

    files = Storage(storage or {})
    if coordinator_retry_seconds <= 0:
        raise ValueError(f"coordinator_retry_seconds must be positive, got {coordinator_retry_seconds}")
    client = CoordinatorClient(coordinator, token=writer_token, retry_seconds=coordinator_retry_seconds)
    try:
        registration = client.register_writer(
            sink,
            table,
            checkpointed,
            arrow_schema=serialize_schema(arrow_schema),
            partition_by=partition_by,
            key_columns=key_columns,
        )
        if registration.key_columns != tuple(key_columns):
            raise SinkRefusedError(
                f"the coordinator at {coordinator} registered sink {sink} with the key {list(registration.key_columns)}"
                f", not {list(key_columns)}: it predates keyed sinks, and would append their rows as new ones. "
                "Upgrade it"
            )
        fan_out = None
        if routes is not None:
            fan_out = FanOut(
                client,
                sink,
                registration.writer_term,
                routes,
                table,
                registration.table_location,
                partition_by,
                files,
                nested_namespaces=registration.nested_namespaces,
                key_columns=tuple(key_columns),
                tasks=tasks,
            )
            fan_out.start(arrow_schema)
    except BaseException:
        client.close()
        raise
    log.info(
        "writer registered",
        sink=sink,
        table=table,
        writer_term=registration.writer_term,
        checkpointed_epoch=checkpointed,
        aborted_epochs=list(registration.aborted_epochs),
        recommitting_epochs=list(registration.recommitting_epochs),
        table_location=registration.table_location,
    )
    options = SinkOptions(sink, tuple(partition_by), target_file_size_bytes, evolve_schema, files, bool(key_columns))
    reporter = CheckpointReporter(client, sink, registration.writer_term, checkpoint, checkpointed)

    batch_writer = MicroBatchWriter(client, registration, options, checkpoint, reporter, transform, fan_out, tasks)
    writer = df.writeStream.foreachBatch(batch_writer).option("checkpointLocation", checkpoint_location)
    if query_name is not None:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time is not None:
        writer = writer.trigger(processingTime=processing_time)
    try:
        query = writer.start()
    except BaseException:
        reporter.close()
        client.close()
        raise
    reporter.on_refused(query.stop)
    return IcebergSinkQuery(query, registration, batch_writer, reporter, client)
