"""Everything the key index takes from a table (coordinator_service.engine.key_index keeps it in the log): what the
table is (its UUID, name, key and snapshot), what the index must do to follow it, what a snapshot changed, the rows to
load and the positions to remove, a commit's record, and the index's answer as key_resolution gives it. Blocking,
like the rest of this package: the engine runs it in worker threads.

To follow a table the index does nothing (its snapshot is the table's), catches up (its snapshot is an ancestor: each
snapshot after it, oldest first), or is rebuilt from the table's live rows (anything a catch-up cannot follow
exactly). A snapshot's changes are the entries ADDED or DELETED by it in the manifests it wrote (a manifest's
added_snapshot_id; the entries' own snapshot id, since a merged manifest carries older files as EXISTING): its data
files added and removed, its position delete files added and removed. Nothing else of the table is read, so a
catch-up costs what the snapshots changed, not what the table holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from coordinator_service.contract.markers import snapshot_properties
from coordinator_service.log.key_index import IndexedFile, IndexState, NewFile, copy_rows
from coordinator_service.tables.data_file_codec import DataFileDecoder, encode_data_file
from coordinator_service.tables.key_encoding import encode_key_values, encode_keys, key_types
from coordinator_service.tables.key_resolution import (
    POSITION,
    Key,
    KeysUnresolvable,
    LiveRows,
    file_key_rows,
    key_columns,
    live_file_tasks,
    live_key_rows,
)
from coordinator_service.tables.keyed_tables import KEYED_FORMAT_VERSION

# RowNumbers: what deleted_by_path answers, for the engine (which reads tables through this module only).
from coordinator_service.tables.position_deletes import RowNumbers as RowNumbers
from coordinator_service.tables.position_deletes import deleted_rows
from coordinator_service.tables.row_deltas import RowDeltaCommit

# A data file or delete file of the table, as its manifest entry describes it.
TableFile: TypeAlias = DataFile
# What a rebuild reads: the live data files with their delete files.
LiveFileTasks: TypeAlias = list[FileScanTask]
# Rows laid out for COPY in one piece at most (each piece is built in memory).
_COPY_PIECE_ROWS = 500_000


@dataclass(frozen=True)
class IndexedTable:
    """What the key index knows a table by: its UUID (a table replaced under its name is another table), its name,
    its key's columns and their Iceberg types (a promoted type changes the keys' bytes), its current snapshot."""

    table_uuid: uuid.UUID
    name: str
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    snapshot_id: int | None

    def keyed_as(self, index: IndexState) -> bool:
        """Whether the index's keys were encoded for this table's key."""
        return (index.key_columns, index.key_types) == (self.key_columns, self.key_types)


def indexed_table(table: Table) -> IndexedTable:
    """The table as the key index knows it.

    Raises KeysUnresolvable when it is not a keyed format v2 table (no identifier fields, a nested one)."""
    if table.format_version != KEYED_FORMAT_VERSION:
        raise KeysUnresolvable(
            f"table {'.'.join(table.name())} is format v{table.format_version}: only keyed format "
            f"v{KEYED_FORMAT_VERSION} tables have a key index"
        )
    schema = table.schema()
    head = table.current_snapshot()
    return IndexedTable(
        table_uuid=table.metadata.table_uuid,
        name=".".join(table.name()),
        key_columns=key_columns(schema),
        key_types=tuple(str(field_type) for field_type in key_types(schema)),
        snapshot_id=None if head is None else head.snapshot_id,
    )


@dataclass(frozen=True)
class Current:
    """The index holds the live rows of the table's current snapshot."""


@dataclass(frozen=True)
class CatchUp:
    """The index's snapshot is an ancestor of the table's current one (or the index is the empty table's and the
    table's history is whole): these snapshots follow it, oldest first, the current one last."""

    snapshot_ids: tuple[int, ...]


@dataclass(frozen=True)
class Rebuild:
    """Only a rebuild from the table's live rows makes the index true: why."""

    reason: str


@dataclass(frozen=True)
class TableBehind:
    """The table as loaded is older than the index (another commit moved it since it was loaded): the index's
    snapshot is one the table reached since."""

    index_snapshot_id: int


IndexPlan: TypeAlias = Current | CatchUp | Rebuild | TableBehind


def plan_catch_up(table: Table, index: IndexState) -> IndexPlan:
    """What the index must do to hold the live rows of the table's current snapshot.

    When the index's snapshot is one the loaded table does not know, the table is loaded again from its catalog (one
    catalog call): the index is ahead of a stale table (TableBehind), or its snapshot is gone (Rebuild)."""
    indexed = indexed_table(table)
    if not index.built:
        return Rebuild("the table has no index yet, or its index was found wrong")
    if not indexed.keyed_as(index):
        return Rebuild(
            f"the table's key is {_described(indexed.key_columns, indexed.key_types)}, the index's "
            f"{_described(index.key_columns, index.key_types)}"
        )
    if index.snapshot_id == indexed.snapshot_id:
        return Current()
    after: list[Snapshot] = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.snapshot_id == index.snapshot_id:
            return _caught_up_or_rebuilt(table, after)
        after.append(snapshot)
    # The index of the empty table catches up along a history that reaches the table's first snapshot (sequence
    # number 1): expiry leaves the oldest snapshot it keeps without a parent, which looks like a first one.
    if index.snapshot_id is None and after and after[-1].parent_snapshot_id is None and after[-1].sequence_number == 1:
        return _caught_up_or_rebuilt(table, after)
    if index.snapshot_id is not None and table.metadata.snapshot_by_id(index.snapshot_id) is None:
        fresh = table.catalog.load_table(table.name())
        reached = ancestors_of(fresh.current_snapshot(), fresh.metadata)
        if any(snapshot.snapshot_id == index.snapshot_id for snapshot in reached):
            return TableBehind(index.snapshot_id)
        return Rebuild(f"the index's snapshot {index.snapshot_id} is no longer in the table (expired)")
    return Rebuild(
        f"the index's snapshot {index.snapshot_id} is not an ancestor of the table's current one (a rollback, "
        "another branch, or its history expired)"
    )


def _caught_up_or_rebuilt(table: Table, after: list[Snapshot]) -> CatchUp | Rebuild:
    """Catch up with these snapshots (newest first), unless they added more rows than the table holds: a rebuild
    reads fewer (the snapshots' summaries say, where they have the figures)."""
    total = _summary_figure(table.current_snapshot(), "total-records")
    added = sum(_summary_figure(snapshot, "added-records") or 0 for snapshot in after)
    if total is not None and added > max(total, 1):
        return Rebuild(f"the {len(after)} snapshots since the index's added {added} rows, the table holds {total}")
    return CatchUp(tuple(snapshot.snapshot_id for snapshot in reversed(after)))


def _summary_figure(snapshot: Snapshot | None, name: str) -> int | None:
    if snapshot is None:
        return None
    value = snapshot_properties(snapshot).get(name)
    return int(value) if value is not None and value.isdigit() else None


def _described(columns: Sequence[str], types: Sequence[str]) -> str:
    return ", ".join(f"{column} {kind}" for column, kind in zip(columns, types, strict=True)) or "none"


@dataclass(frozen=True)
class SnapshotChanges:
    """What one snapshot changed in the table's files."""

    snapshot_id: int
    added_data: list[TableFile] = field(default_factory=list)
    removed_data: list[TableFile] = field(default_factory=list)
    added_deletes: list[TableFile] = field(default_factory=list)
    removed_deletes: list[TableFile] = field(default_factory=list)

    @property
    def removed_paths(self) -> list[str]:
        return [data_file.file_path for data_file in self.removed_data]


def snapshot_changes(table: Table, snapshot_id: int) -> SnapshotChanges | Rebuild:
    """What the snapshot changed in the table's files, read from the manifests it wrote; Rebuild when it holds what a
    catch-up does not follow (an equality delete file)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"snapshot {snapshot_id} is not in the table"
    changes = SnapshotChanges(snapshot_id)
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id != snapshot_id or entry.status == ManifestEntryStatus.EXISTING:
                continue
            added = entry.status == ManifestEntryStatus.ADDED
            data_file = entry.data_file
            if data_file.content == DataFileContent.DATA:
                (changes.added_data if added else changes.removed_data).append(data_file)
            elif data_file.content == DataFileContent.POSITION_DELETES:
                (changes.added_deletes if added else changes.removed_deletes).append(data_file)
            else:
                return Rebuild(f"snapshot {snapshot_id} holds equality delete file {data_file.file_path}")
    return changes


def files_to_index(table: Table, data_files: Iterable[TableFile]) -> list[NewFile]:
    """These data files of the table as the index names them: path, spec, and manifest description."""
    schema_id = table.metadata.current_schema_id
    return [
        NewFile(data_file.file_path, data_file.spec_id, schema_id, encode_data_file(table.metadata, data_file))
        for data_file in data_files
    ]


def live_files_to_index(table: Table) -> tuple[LiveFileTasks, list[NewFile]]:
    """What a rebuild reads (every live data file of the current snapshot, with its delete files), and those files as
    the index names them."""
    tasks = live_file_tasks(table)
    return tasks, files_to_index(table, [task.file for task in tasks])


def live_pieces(
    table: Table, tasks: LiveFileTasks, index_id: int, numbers: Mapping[str, int]
) -> Generator[tuple[int, list[bytes]]]:
    """The live rows of these files (live_files_to_index) as pieces of the index's COPY, file by file, each file
    numbered as `numbers` says by path: how many rows, and the pieces."""
    for file_rows in live_key_rows(table, tasks):
        number = numbers[file_rows.data_file.file_path]
        yield file_rows.rows.num_rows, _pieces(table, index_id, number, file_rows.rows)


def added_pieces(table: Table, data_file: TableFile, index_id: int, file_id: int) -> tuple[int, list[bytes]]:
    """Every row of a data file a snapshot added (read whole: no earlier snapshot deletes from it) as pieces of the
    index's COPY: how many rows, and the pieces."""
    rows = file_key_rows(table, data_file)
    return rows.num_rows, _pieces(table, index_id, file_id, rows)


def _pieces(table: Table, index_id: int, file_id: int, rows: pa.Table) -> list[bytes]:
    """One file's rows (key columns and POSITION) as pieces of the index's COPY."""
    pieces = []
    for start in range(0, rows.num_rows, _COPY_PIECE_ROWS):
        part = rows.slice(start, _COPY_PIECE_ROWS)
        positions = part.column(POSITION).combine_chunks()
        pieces.append(copy_rows(index_id, file_id, positions, encode_keys(part, table.schema())))
    return pieces


def deleted_by_path(table: Table, delete_files: Sequence[TableFile]) -> dict[str, RowNumbers]:
    """The positions these position delete files delete together, by data file path, each once and in order
    (position_deletes.deleted_rows)."""
    return deleted_rows(table.io, delete_files)


def encoded_keys(table: Table, keys: Sequence[Key]) -> list[bytes]:
    """The bytes of these keys in the index (key_encoding)."""
    return encode_key_values(keys, table.schema())


def answer(
    table: Table,
    keys: Sequence[Key],
    encoded: Sequence[bytes],
    found: Iterable[tuple[bytes, int, int]],
    files: Iterable[IndexedFile],
) -> LiveRows:
    """The index's answer as key_resolution.live_rows gives it: each of `keys` (encoded as `encoded`) the index found
    (`found`: encoded key, file number, position), with its rows by path and position, and the data files of those
    rows by path (decoded from the index's `files`).

    Raises DescriptionOutdated when a file's description names a spec or schema the table no longer has."""
    decoder = DataFileDecoder(table.metadata)
    data_files = {
        indexed.file_id: decoder.decode(indexed.data_file, indexed.spec_id, indexed.schema_id) for indexed in files
    }
    by_bytes = dict(zip(encoded, keys, strict=True))
    live = LiveRows()
    for key, file_id, position in found:
        data_file = data_files[file_id]
        live.positions.setdefault(by_bytes[key], []).append((data_file.file_path, position))
        live.data_files[data_file.file_path] = data_file
    for rows in live.positions.values():
        rows.sort()
    return live


@dataclass(frozen=True)
class CommitRecord:
    """A committed row delta as the index records it: the table it went to, the snapshot it was resolved at and the
    one it made, the rows it deleted among the table's files (path -> positions: every live row of the keys it
    touched, encoded in `touched`), its new files, and its new rows still live after it (encoded key, path,
    position)."""

    table: IndexedTable
    base_snapshot_id: int | None
    snapshot_id: int
    deleted: dict[str, list[int]]
    touched: list[bytes]
    new_files: list[NewFile]
    new_rows: list[tuple[bytes, str, int]]

    @property
    def deleted_rows(self) -> int:
        return sum(len(rows) for rows in self.deleted.values())

    def pieces(self, index_id: int, numbers: Mapping[str, int]) -> list[bytes]:
        """The new rows as pieces of the index's COPY, their files numbered as `numbers` says by path."""
        pieces = []
        for start in range(0, len(self.new_rows), _COPY_PIECE_ROWS):
            part = self.new_rows[start : start + _COPY_PIECE_ROWS]
            file_ids = [numbers[path] for _, path, _ in part]
            positions = pa.array([position for _, _, position in part], pa.int64())
            keys = pa.array([key for key, _, _ in part], pa.binary())
            pieces.append(copy_rows(index_id, file_ids, positions, keys))
        return pieces


def commit_record(committed: RowDeltaCommit) -> CommitRecord | None:
    """What the index records of a row delta; None when its snapshot's parent is not the snapshot it was resolved at
    (nothing to record: the next catch-up reads it)."""
    table = committed.table
    snapshot = table.metadata.snapshot_by_id(committed.snapshot_id)
    if snapshot is None or snapshot.parent_snapshot_id != committed.base_snapshot_id:
        return None
    new_paths = {data_file.file_path for data_file in committed.new_data_files}
    deleted = {path: list(rows) for path, rows in committed.deleted_positions.items() if path not in new_paths}
    gone = {path: set(committed.deleted_positions[path]) for path in new_paths & set(committed.deleted_positions)}
    alive = [
        (key, path, position) for key, (path, position) in committed.new_rows if position not in gone.get(path, ())
    ]
    encoded = encode_key_values([key for key, _, _ in alive], table.schema())
    return CommitRecord(
        table=indexed_table(table),
        base_snapshot_id=committed.base_snapshot_id,
        snapshot_id=committed.snapshot_id,
        deleted=deleted,
        touched=encode_key_values(list(committed.touched_keys), table.schema()),
        new_files=files_to_index(table, committed.new_data_files),
        new_rows=[(key, path, position) for key, (_, path, position) in zip(encoded, alive, strict=True)],
    )
