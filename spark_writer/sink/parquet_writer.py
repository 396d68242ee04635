"""The executor side of the sink: each Spark task writes its rows as Parquet data files under the table.

A task's rows arrive as Arrow record batches (``mapInArrow``). They are grouped
by Iceberg partition, buffered into row groups and written with pyarrow; a file
is closed and a new one started once it reaches the target size. File names
carry the batch id, the Spark partition and task attempt, and a random part, so
two attempts of a task (a retry, a speculative copy, a re-run of the batch after
a crash) never write the same file. The task yields one row per file it wrote,
with the file's Parquet footer (serialized), which the driver sends with the
path so that the coordinator need not read it from storage; the driver
pre-commits exactly those files, so files of a failed attempt never reach the
table (the attempt deletes them when it fails by an exception). A task given a
decoding (``DataFileTarget.decoding``) receives Kafka records, or the offset ranges it
reads them from itself (``DataFileTarget.ranges``: kafka.range_source), and decodes them into
table rows itself (``spark_writer.formats.record_decoding.RecordDecoding``), and also yields
the count of the records that did not fit and the latest record timestamp of each
Kafka topic-partition it read (spark_writer.kafka.positions). A task given routes
(``DataFileTarget.routing``, fan-out) splits its rows by route first
(``spark_writer.routing.split``) and writes each table's rows under that table's own
location; its file rows name the table (null: the sink's own), and it also yields
the tables it had rows for but no location, and the values no route took. An upsert or change stream's tasks
(spark_writer.mutations.tasks) write through the same files, and also the keys an epoch touched as key files
(`key_file` in their rows, "-keys-" in their names).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from pyspark import TaskContext
from pyspark.sql import DataFrame, Row
from pyspark.sql.pandas.types import from_arrow_schema

from coordinator_service.contract.client import PreCommitFile
from spark_writer.formats.record_decoding import DecodingSummary
from spark_writer.kafka.options import KafkaSourceOptions
from spark_writer.kafka.range_source import range_records
from spark_writer.routing.split import TaskRouting, UnroutedTally, record_origin, split_by_route
from spark_writer.sink.partitioning import PartitionField, PartitionKey, split_by_partition
from spark_writer.sink.storage import Storage

log = structlog.get_logger(__name__)

DATA_DIRECTORY: Final = "data"
# Larger row groups mean fewer, better compressed column chunks; this bounds a task's memory per partition.
MAX_ROW_GROUP_BYTES: Final = 64 * 1024 * 1024
PARQUET_COMPRESSION: Final = "zstd"

# What every task yields: one row per data file (with its table when routed to another than the sink's own);
# without a path, one carrying the count of the records that did not fit the schema when there were any, one per
# Kafka topic-partition read with its latest record timestamp, and with routes one per table it had rows for but
# no location (`table`, its records in `record_count`) and one per value no route took (`unrouted`: the value as a
# message describes it, its records and where the first came from). A key file's row (an upsert or change stream)
# has `key_file` set and its keys in `record_count`. The row of the records that did not fit also carries the Kafka
# records the task read (`records_read`). WRITTEN_FILES_STRUCT, its Spark form, is mapInArrow's output
# schema.
WRITTEN_FILES_SCHEMA: Final = pa.schema(
    [
        pa.field("path", pa.string()),
        pa.field("record_count", pa.int64()),
        pa.field("size_bytes", pa.int64()),
        pa.field("parquet_footer", pa.binary()),
        pa.field("bad_records", pa.int64()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("latest_timestamp_ms", pa.int64()),
        pa.field("table", pa.string()),
        pa.field("unrouted", pa.string()),
        pa.field("unrouted_records", pa.int64()),
        pa.field("unrouted_origin", pa.string()),
        pa.field("key_file", pa.bool_()),
        pa.field("records_read", pa.int64()),
    ]
)

WRITTEN_FILES_STRUCT: Final = from_arrow_schema(WRITTEN_FILES_SCHEMA)

TaskWriter = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class TaskDecoder(Protocol):
    """One task's turning of its input batches into table rows
    (spark_writer.formats.record_decoding.RecordDecodingTask)."""

    def rows(self, batch: pa.RecordBatch) -> pa.Table: ...

    def finish(self) -> DecodingSummary:
        """After the last batch: the records that did not fit, the latest timestamps read."""
        ...


class TaskDecoding(Protocol):
    """Shipped with the target; gives each task its own decoder."""

    def start(self) -> TaskDecoder: ...


@dataclass(frozen=True)
class WrittenFile:
    path: str
    record_count: int
    size_bytes: int
    # The file's footer as a standalone Parquet metadata file (pyarrow's FileMetaData.write_metadata_file).
    parquet_footer: bytes


@dataclass(frozen=True)
class DataFileTarget:
    """Everything a task needs to write one micro-batch's files; pickled to the executors."""

    table_location: str
    batch_id: int
    schema: pa.Schema
    partition_fields: tuple[PartitionField, ...]
    target_file_size_bytes: int
    storage: Storage = field(default_factory=Storage)
    # How a task turns its input (Kafka records) into table rows; None: the input rows are the table's.
    decoding: TaskDecoding | None = None
    # The Kafka options the task reads its records with when its input is offset ranges (kafka.range_source) rather
    # than the records themselves; None: the input is the records (or the table's rows).
    ranges: KafkaSourceOptions | None = None
    # Fan-out: which table each row goes to, and the tables' locations; None: every row to `table_location`.
    routing: TaskRouting | None = None
    # Set in the names of files of another kind than data files ("keys": an upsert or change stream's key files).
    file_tag: str = ""

    @property
    def row_group_bytes(self) -> int:
        return min(self.target_file_size_bytes, MAX_ROW_GROUP_BYTES)

    @property
    def files_directory(self) -> str:
        """On an object store, the batch's own directory, data/<batch id>/, which the coordinator lists once to
        check all of its files (PreCommit's files_directory); elsewhere "" (the files go in data/ itself, where
        a directory per batch would stay behind after compaction)."""
        data = data_directory_uri(self.table_location)
        return f"{data}/{self.batch_id:08d}" if Storage.is_object_store(data) else ""

    def at(self, table_location: str) -> DataFileTarget:
        """The same batch's files under another table's location (a route's)."""
        return dataclasses.replace(self, table_location=table_location)


def data_directory_uri(table_location: str) -> str:
    return f"{table_location.rstrip('/')}/{DATA_DIRECTORY}"


@dataclass
class _OpenFile:
    uri: str
    stream: pa.NativeFile
    writer: pq.ParquetWriter
    # Receives the file's footer when the writer closes.
    footer: list[pq.FileMetaData]
    record_count: int = 0
    pending: list[pa.Table] = field(default_factory=list)
    pending_bytes: int = 0


class RollingParquetFiles:
    """The files one task attempt writes: one open file per partition, rolled at the target size."""

    def __init__(self, target: DataFileTarget, task_label: str) -> None:
        self._target = target
        self._directory = target.files_directory or data_directory_uri(target.table_location)
        if not target.files_directory:  # an object store has no directories to make
            filesystem, directory_path = target.storage.filesystem(self._directory)
            filesystem.create_dir(directory_path, recursive=True)
        tag = f"-{target.file_tag}" if target.file_tag else ""
        self._prefix = f"{target.batch_id:08d}-{task_label}-{uuid.uuid4().hex[:12]}{tag}"
        self._open: dict[PartitionKey, _OpenFile] = {}
        self._closed: list[WrittenFile] = []
        self._started: list[str] = []

    def write(self, key: PartitionKey, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        current = self._open.get(key) or self._start_file(key)
        current.pending.append(rows)
        current.pending_bytes += rows.nbytes
        if current.pending_bytes >= self._target.row_group_bytes:
            self._flush_row_group(current)
            if current.stream.tell() >= self._target.target_file_size_bytes:
                self._close(key)

    def close(self) -> list[WrittenFile]:
        for key in list(self._open):
            self._flush_row_group(self._open[key])
            self._close(key)
        return self._closed

    def abort(self) -> None:
        """Close and delete every file this attempt started (best effort: the attempt is failing anyway)."""
        for current in self._open.values():
            with contextlib.suppress(Exception):
                current.writer.close()
                current.stream.close()
        self._open.clear()
        delete_files(self._started, self._target.storage)

    def _start_file(self, key: PartitionKey) -> _OpenFile:
        uri = f"{self._directory}/{self._prefix}-{len(self._started):04d}.parquet"
        self._started.append(uri)
        filesystem, path = self._target.storage.filesystem(uri)
        stream = filesystem.open_output_stream(path)
        footer: list[pq.FileMetaData] = []
        writer = pq.ParquetWriter(
            stream, self._target.schema, compression=PARQUET_COMPRESSION, metadata_collector=footer
        )
        self._open[key] = _OpenFile(uri, stream, writer, footer)
        return self._open[key]

    def _flush_row_group(self, current: _OpenFile) -> None:
        if not current.pending:
            return
        rows = pa.concat_tables(current.pending)
        current.writer.write_table(rows, row_group_size=rows.num_rows)
        current.record_count += rows.num_rows
        current.pending, current.pending_bytes = [], 0

    def _close(self, key: PartitionKey) -> None:
        current = self._open.pop(key)
        current.writer.close()
        size = current.stream.tell()
        current.stream.close()
        (footer,) = current.footer
        self._closed.append(WrittenFile(current.uri, current.record_count, size, serialize_footer(footer)))


class TaskFiles:
    """A task attempt's files by table: the sink's own (key None) or, with routes, each route table's under its
    location, started at the table's first rows."""

    def __init__(self, target: DataFileTarget, task_label: str) -> None:
        self._target = target
        self._label = task_label
        self.unknown: dict[str, int] = {}
        self.unrouted = UnroutedTally()
        self._files: dict[str | None, RollingParquetFiles] = {}
        if target.routing is None:
            self._files[None] = RollingParquetFiles(target, task_label)

    def write(self, rows: pa.Table, task_input: pa.RecordBatch | None) -> None:
        """Write rows (of the target's schema); `task_input`: the Kafka records they were decoded from, if any."""
        routing = self._target.routing
        if routing is None:
            self._write_partitions(self._files[None], rows)
            return
        split = split_by_route(rows, routing)
        for table, table_rows in split.tables.items():
            key = None if table == routing.own_table else table
            files = self._files.get(key)
            if files is None:
                files = self._files[key] = RollingParquetFiles(self._target.at(routing.locations[table]), self._label)
            self._write_partitions(files, table_rows)
        for table, records in split.unknown.items():
            self.unknown[table] = self.unknown.get(table, 0) + records
        for value in split.unrouted:
            origin = record_origin(rows, value.first_row, task_input) or f"Spark task {self._label}"
            self.unrouted.add(value.description, value.records, origin)

    def _write_partitions(self, files: RollingParquetFiles, rows: pa.Table) -> None:
        for key, part in split_by_partition(rows, self._target.partition_fields):
            files.write(key, part)

    def close(self) -> list[tuple[str | None, WrittenFile]]:
        return [(table, written) for table, files in self._files.items() for written in files.close()]

    def abort(self) -> None:
        for files in self._files.values():
            files.abort()


def task_label() -> str:
    """The running task attempt's part of its file names: its partition and attempt ids ("driver" outside a task)."""
    context = TaskContext.get()
    return "driver" if context is None else f"{context.partitionId():05d}-{context.taskAttemptId()}"


def task_results(
    written: Sequence[tuple[str | None, WrittenFile]],
    summary: DecodingSummary,
    routed: TaskFiles,
    key_files: Sequence[tuple[str | None, WrittenFile]] = (),
) -> pa.RecordBatch:
    """A task's WRITTEN_FILES_SCHEMA rows: its data files, its key files, what its decoding saw, and what `routed`
    (the files whose rows were routed) found without a location or a route."""
    nothing = {"record_count": 0, "size_bytes": 0, "bad_records": 0}
    results: list[dict[str, object]] = [{**asdict(file), "bad_records": 0, "table": table} for table, file in written]
    results.extend({**asdict(file), "bad_records": 0, "table": table, "key_file": True} for table, file in key_files)
    if summary.bad_records or summary.records_read:
        results.append({**nothing, "bad_records": summary.bad_records, "records_read": summary.records_read})
    results.extend(
        {**nothing, "topic": topic, "partition": partition, "latest_timestamp_ms": latest}
        for (topic, partition), latest in summary.latest_timestamps.items()
    )
    results.extend({**nothing, "table": table, "record_count": records} for table, records in routed.unknown.items())
    results.extend(
        {**nothing, "unrouted": value, "unrouted_records": records, "unrouted_origin": origin}
        for value, (records, origin) in routed.unrouted.values.items()
    )
    return pa.RecordBatch.from_pylist(results, schema=WRITTEN_FILES_SCHEMA)


def task_writer(target: DataFileTarget) -> TaskWriter:
    """The ``mapInArrow`` function writing one task's rows of a micro-batch; yields WRITTEN_FILES_SCHEMA rows."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files = TaskFiles(target, task_label())
        decoder = None if target.decoding is None else target.decoding.start()
        inputs = batches if target.ranges is None else range_records(batches, target.ranges)
        try:
            for batch in inputs:
                rows = pa.Table.from_batches([batch]) if decoder is None else decoder.rows(batch)
                files.write(rows.cast(target.schema), None if decoder is None else batch)
            summary = DecodingSummary() if decoder is None else decoder.finish()
            written = files.close()
        except BaseException:
            files.abort()
            raise
        yield task_results(written, summary, files)

    return write


class BatchTasks(Protocol):
    """How a batch's tasks write its files: the DataFrame of their WRITTEN_FILES rows, for the driver to collect."""

    def __call__(self, frame: DataFrame, target: DataFileTarget) -> DataFrame: ...


def precommit_files(written: Sequence[Row]) -> tuple[list[PreCommitFile], list[PreCommitFile]]:
    """The files of the tasks' WRITTEN_FILES rows (those with a path) as PreCommit sends them: data files, key files."""
    files: tuple[list[PreCommitFile], list[PreCommitFile]] = ([], [])
    for row in written:
        files[bool(row.key_file)].append(
            PreCommitFile(row.path, bytes(row.parquet_footer), row.size_bytes, row.table or "")
        )
    return files


def append_tasks(frame: DataFrame, target: DataFileTarget) -> DataFrame:
    """An append stream's: each task writes the rows of its input (spark_writer.mutations.tasks has the others)."""
    return frame.mapInArrow(task_writer(target), WRITTEN_FILES_STRUCT)


def serialize_footer(footer: pq.FileMetaData) -> bytes:
    """A footer as PreCommit sends it: a standalone Parquet metadata file (pq.read_metadata reads it back)."""
    buffer = pa.BufferOutputStream()
    footer.write_metadata_file(buffer)
    return bytes(buffer.getvalue().to_pybytes())


def delete_files(uris: Sequence[str], storage: Storage) -> None:
    """Delete data files by URI; a file already gone is fine."""
    for uri in uris:
        filesystem, path = storage.filesystem(uri)
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(path)
