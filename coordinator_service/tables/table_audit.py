"""What a verification reads of a table, in neutral types: its snapshots along the current branch with the data files
each added (from the manifests, counted as they are read), and some columns of its live rows (only those columns, of
every live file or of some files only).

The verifier (coordinator_service.engine.verification) decides; this layer only reads."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeAlias

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation, Snapshot, ancestors_of
from pyiceberg.types import StringType

from coordinator_service.contract.markers import snapshot_properties
from coordinator_service.tables.file_columns import data_file_columns
from coordinator_service.tables.format import LoadedTable
from coordinator_service.tables.key_index_reads import SnapshotChanges, snapshot_changes
from coordinator_service.tables.position_deletes import deleted_rows

# The columns a writer's --kafka-metadata adds: where each row's record was in Kafka.
POSITION_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset")
# A data file a snapshot added, as the table format describes it: opaque to the engine, which hands it back.
AddedDataFile: TypeAlias = DataFile
APPEND = "append"
# Data files read at once by appended_columns (their reading releases the GIL).
_READERS = 4


@dataclass(frozen=True)
class SnapshotFacts:
    """One snapshot of a table's current branch: its change, its summary's properties and the data files it added
    (path, record count)."""

    snapshot_id: int
    operation: str
    summary: dict[str, str]
    added_files: tuple[tuple[str, int], ...]
    data_files: tuple[AddedDataFile, ...] = ()
    # A rewrite's: the rows of the data files it removed that position deletes had deleted (a compaction that applies
    # them leaves those rows out); None when delete files it read are gone (the snapshots expiry removed held them).
    deleted_rows_removed: int | None = 0

    @property
    def added_records(self) -> int:
        return sum(records for _, records in self.added_files)


@dataclass
class ReadCount:
    """How much of a table's metadata and data a verification read (the incremental step reads only what is new)."""

    manifests: int = 0
    data_files: int = 0
    rows: int = 0
    files: list[str] = field(default_factory=list)


def snapshots_after(table: LoadedTable, after: int | None, count: ReadCount) -> list[SnapshotFacts] | None:
    """The snapshots of the current branch after `after` (None: all of them), oldest first, each with the data
    files it added; None when `after` is not an ancestor of the current snapshot any more (a rollback, expiry
    of the snapshots in between: start again from the whole table)."""
    current = table.current_snapshot()
    if current is None:
        return [] if after is None else None
    chain = []
    for snapshot in ancestors_of(current, table.metadata):
        if snapshot.snapshot_id == after:
            break
        chain.append(snapshot)
    else:
        if after is not None:
            return None
    facts = []
    for snapshot in reversed(chain):
        added: list[DataFile] = []
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            count.manifests += 1
            added.extend(
                entry.data_file
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id
            )
        summary = snapshot.summary
        facts.append(
            SnapshotFacts(
                snapshot_id=snapshot.snapshot_id,
                operation="" if summary is None else str(summary.operation.value),
                summary=snapshot_properties(snapshot),
                added_files=tuple((data_file.file_path, data_file.record_count) for data_file in added),
                data_files=tuple(added),
                deleted_rows_removed=deleted_rows_removed(table, snapshot, count)
                if summary is not None and summary.operation == Operation.REPLACE
                else 0,
            )
        )
    return facts


def deleted_rows_removed(table: LoadedTable, snapshot: Snapshot, count: ReadCount) -> int | None:
    """The rows of the data files `snapshot` removed that the position delete files live before it deleted (those
    live after it, and those it removed), each row once; None when one of those files is gone from storage (it went
    with the snapshots before this one, expired since)."""
    changes = snapshot_changes(table, snapshot.snapshot_id)
    if not isinstance(changes, SnapshotChanges) or not changes.removed_data:
        return 0  # an equality delete file: no count of the rows it deletes (the rewrite is not the coordinator's)
    removed = set(changes.removed_paths)
    deletes = list(changes.removed_deletes)
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            count.manifests += 1
            deletes.extend(
                entry.data_file
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                if entry.data_file.content == DataFileContent.POSITION_DELETES
            )
    if not all(table.io.new_input(delete_file.file_path).exists() for delete_file in deletes):
        return None
    return sum(rows.size for path, rows in deleted_rows(table.io, deletes).items() if path in removed)


def column_names(table: LoadedTable) -> frozenset[str]:
    return frozenset(field.name for field in table.schema().fields)


def identifier_columns(table: LoadedTable) -> tuple[str, ...]:
    """A keyed table's key: its identifier fields, by name (none: not keyed)."""
    schema = table.schema()
    return tuple(schema.find_column_name(field_id) or "" for field_id in schema.identifier_field_ids)


def live_columns(
    table: LoadedTable,
    columns: Sequence[str],
    count: ReadCount,
    snapshot_id: int,
    files: Collection[str] | None = None,
) -> pa.Table:
    """The `columns` of the rows live at `snapshot_id` (deleted rows left out), of every data file live then or only
    of `files`; only those columns are read."""
    scan = table.scan(selected_fields=tuple(columns), snapshot_id=snapshot_id)
    tasks = [task for task in scan.plan_files() if files is None or task.file.file_path in files]
    count.data_files += len(tasks)
    count.files.extend(task.file.file_path for task in tasks)
    rows = ArrowScan(table.metadata, table.io, scan.projection(), AlwaysTrue()).to_table(tasks)
    count.rows += rows.num_rows
    return rows


def appended_columns(
    table: LoadedTable, snapshots: Sequence[SnapshotFacts], columns: Sequence[str], count: ReadCount
) -> pa.Table | None:
    """The `columns` of the rows `snapshots` appended (string columns as dictionary arrays: a topic's name on each
    row), read from their files without planning a scan of the whole table; None unless every one of them is a
    plain append (then each of those rows is live at the newest of them: no later one removed any, and deletes
    written before a file apply to files written before them)."""
    if any(snapshot.operation != APPEND for snapshot in snapshots):
        return None
    data_files = [data_file for snapshot in snapshots for data_file in snapshot.data_files]
    count.data_files += len(data_files)
    count.files.extend(data_file.file_path for data_file in data_files)
    schema = table.schema()
    strings = [name for name in columns if isinstance(schema.find_type(name), StringType)]
    with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="verification") as readers:
        rows = data_file_columns(table, data_files, columns, dictionary=strings, read=readers.map)
    count.rows += rows.num_rows
    return rows


def plain_strings(rows: pa.Table) -> pa.Table:
    """`rows` with dictionary columns as plain ones (to concatenate them with rows read otherwise)."""
    return pa.table(
        {
            name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
            for name, column in zip(rows.column_names, rows.columns, strict=True)
        }
    )
