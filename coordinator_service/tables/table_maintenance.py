"""Keeping an Iceberg table healthy, on pyiceberg; blocking (the caller runs it in worker threads).

Snapshot expiration that also deletes the files only the expired snapshots referenced (data and delete files),
compaction of small files and of files with position deletes as a `replace` snapshot (the rows read stay exactly the
same: the files are rewritten with their position deletes applied, and a delete file no live data file is left to
refer to is dropped in the same snapshot), and the files under the table's location that nothing references. What may be
expired, rewritten or deleted is the caller's decision (coordinator_service.engine.maintenance): it knows the commit
log, the table does not.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent, ManifestFile
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ExpireSnapshots

from coordinator_service.tables.file_listing import listed_files
from coordinator_service.tables.iceberg import without_retries
from coordinator_service.tables.markers import MARKER_EPOCH, SinkIdentity
from coordinator_service.tables.pyiceberg_internals import (
    data_files_of,
    deleted_positions,
    partition_values,
    replace_files,
)

# Files smaller than this share of the target size are compacted (Iceberg's rewrite default, 75 %).
SMALL_FILE_SHARE = 0.75
# The summary property of the coordinator's compaction snapshots (they carry no sink marker).
COMPACTION_MARKER = "sink-coordinator.maintenance"
# A table's metadata file: a directory whose metadata/ holds one is a table's location.
METADATA_FILE_SUFFIX = ".metadata.json"


@dataclass
class Reachable:
    """The files a set of snapshots reaches: manifest lists, manifests and live data files."""

    manifest_lists: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)
    data_files: set[str] = field(default_factory=set)

    def __sub__(self, other: Reachable) -> Reachable:
        return Reachable(
            self.manifest_lists - other.manifest_lists,
            self.manifests - other.manifests,
            self.data_files - other.data_files,
        )

    def all(self) -> set[str]:
        return self.manifest_lists | self.manifests | self.data_files


@dataclass(frozen=True)
class SmallFile:
    """What compaction planning needs of a live data or delete file (rows: a position delete file's rows are the
    rows it deletes)."""

    path: str
    size: int
    spec_id: int
    partition: tuple[object, ...]
    rows: int = 0
    content: DataFileContent = DataFileContent.DATA


def as_small_file(data_file: DataFile) -> SmallFile:
    return SmallFile(
        path=data_file.file_path,
        size=data_file.file_size_in_bytes,
        spec_id=data_file.spec_id,
        partition=tuple(data_file.partition[index] for index in range(len(data_file.partition))),
        rows=data_file.record_count,
        content=data_file.content,
    )


@dataclass(frozen=True)
class ManifestFiles:
    """A manifest's live entries: every file's path, and its data and delete files as compaction plans them."""

    paths: frozenset[str]
    data: tuple[SmallFile, ...]
    deletes: tuple[SmallFile, ...]
    # Its position delete files whole, to be read when compaction plans with them (deleted_from).
    position_deletes: tuple[DataFile, ...]


class _ManifestEntries:
    """The live files of each manifest read, by manifest path: a manifest never changes once written, so a table's
    reachable files (and the files compaction plans with) are read again only where new manifests came (bounded,
    least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._files: OrderedDict[str, ManifestFiles] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, io: FileIO, manifest: ManifestFile) -> ManifestFiles:
        with self._lock:
            files = self._files.get(manifest.manifest_path)
            if files is not None:
                self._files.move_to_end(manifest.manifest_path)
                return files
        entries = [entry.data_file for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)]
        files = ManifestFiles(
            paths=frozenset(data_file.file_path for data_file in entries),
            data=tuple(as_small_file(f) for f in entries if f.content == DataFileContent.DATA),
            deletes=tuple(as_small_file(f) for f in entries if f.content != DataFileContent.DATA),
            position_deletes=tuple(f for f in entries if f.content == DataFileContent.POSITION_DELETES),
        )
        with self._lock:
            self._files[manifest.manifest_path] = files
            while len(self._files) > self._capacity:
                self._files.popitem(last=False)
        return files


_MANIFEST_ENTRIES = _ManifestEntries(capacity=20_000)


class _DeletedFrom:
    """The data files each position delete file read deletes rows of, by its path: a delete file never changes once
    written, so each is read once per process (bounded, least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._paths: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, io: FileIO, delete_file: DataFile) -> frozenset[str]:
        with self._lock:
            paths = self._paths.get(delete_file.file_path)
            if paths is not None:
                self._paths.move_to_end(delete_file.file_path)
                return paths
        paths = frozenset(deleted_positions(io, delete_file))
        with self._lock:
            self._paths[delete_file.file_path] = paths
            while len(self._paths) > self._capacity:
                self._paths.popitem(last=False)
        return paths


_DELETED_FROM = _DeletedFrom(capacity=20_000)


def reachable(io: FileIO, snapshots: Iterable[Snapshot]) -> Reachable:
    """Every file the snapshots reference (data and delete files); each manifest is read once, however many
    snapshots share it, and not again while it stays in the process's manifest cache."""
    found = Reachable()
    for snapshot in snapshots:
        found.manifest_lists.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in found.manifests:
                continue
            found.manifests.add(manifest.manifest_path)
            found.data_files.update(_MANIFEST_ENTRIES.of(io, manifest).paths)
    return found


def referenced_files(table: Table) -> set[str]:
    """Every file the table's metadata reaches, each in same_file's spelling: its metadata files (the current one and
    those of its metadata log), statistics files, and every snapshot's manifest list, manifests, data and delete
    files."""
    files = reachable(table.io, table.metadata.snapshots).all() | metadata_files(table)
    files.update(statistics.statistics_path for statistics in table.metadata.statistics)
    files.update(statistics.statistics_path for statistics in table.metadata.partition_statistics)
    return {same_file(uri) for uri in files}


@dataclass(frozen=True)
class StorageRoots:
    """Where a table keeps its files: its location, its data files' directory and its metadata files' directory."""

    location: str
    data: str
    metadata: str


def storage_roots(table: Table) -> StorageRoots:
    provider = table.location_provider()
    return StorageRoots(table.location().rstrip("/"), provider.data_path, provider.metadata_path)


def snapshots_to_expire(
    snapshots: Sequence[Snapshot], *, now_ms: int, max_age_ms: int, max_count: int, keep: set[int]
) -> list[int]:
    """Snapshots older than max_age_ms, or beyond the newest max_count; never one in `keep`."""
    newest_first = sorted(snapshots, key=lambda snapshot: snapshot.timestamp_ms, reverse=True)
    return [
        snapshot.snapshot_id
        for rank, snapshot in enumerate(newest_first)
        if snapshot.snapshot_id not in keep and (rank >= max_count or snapshot.timestamp_ms < now_ms - max_age_ms)
    ]


# The table's own retention properties (Iceberg's names): they win over the coordinator's settings for that table.
MAX_SNAPSHOT_AGE_MS = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
GC_ENABLED = "gc.enabled"


@dataclass(frozen=True)
class Retention:
    """How long a table keeps its snapshots, and whether its files may be garbage-collected at all."""

    max_age_ms: int
    max_count: int
    gc_enabled: bool


def retention_of(table: Table, max_age_ms: int, max_count: int) -> Retention:
    """The coordinator's retention (`max_age_ms`, `max_count`) where the table sets none of its own: the table's
    max-snapshot-age replaces the age, its min-snapshots-to-keep raises the count, gc.enabled=false turns expiration
    and the orphan sweep off (Iceberg's rules). A property that is not a number is ignored."""
    properties = table.metadata.properties
    age = _positive_int(properties.get(MAX_SNAPSHOT_AGE_MS))
    keep = _positive_int(properties.get(MIN_SNAPSHOTS_TO_KEEP))
    return Retention(
        max_age_ms=max_age_ms if age is None else age,
        max_count=max_count if keep is None else max(max_count, keep),
        gc_enabled=properties.get(GC_ENABLED, "true").strip().lower() != "false",
    )


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def protected_by_refs(table: Table) -> set[int]:
    """Branch and tag heads: Iceberg never expires them."""
    return {ref.snapshot_id for ref in table.metadata.refs.values()}


def protected_by_markers(table: Table, sinks: Sequence[tuple[SinkIdentity, int]]) -> set[int]:
    """Snapshots whose marker the recovery walk may still need: a sink's own marker above the newest epoch of the
    sink the log records this table holds (an append whose record has not happened yet); `sinks` are the sinks
    writing the table, each with that epoch."""
    protected = set()
    for snapshot in table.metadata.snapshots:
        if snapshot.summary is None:
            continue
        for identity, committed_epoch in sinks:
            if identity.owns(snapshot.summary) and int(str(snapshot.summary.get(MARKER_EPOCH))) > committed_epoch:
                protected.add(snapshot.snapshot_id)
    return protected


def snapshots_of(table: Table) -> Sequence[Snapshot]:
    """The table's snapshots, for snapshots_to_expire."""
    return table.metadata.snapshots


def default_spec_id(table: Table) -> int:
    """The partition spec new files are written with (a compaction's output)."""
    return table.metadata.default_spec_id


def expire(table: Table, snapshot_ids: Sequence[int]) -> tuple[Table, Reachable]:
    """Remove the snapshots from the table's metadata; return the committed table and the files that only
    they referenced (for the caller to delete once the commit stands)."""
    expired_ids = set(snapshot_ids) - protected_by_refs(table)
    snapshots = table.metadata.snapshots
    kept = reachable(table.io, (s for s in snapshots if s.snapshot_id not in expired_ids))
    gone = reachable(table.io, (s for s in snapshots if s.snapshot_id in expired_ids)) - kept
    transaction = without_retries(table).transaction()
    ExpireSnapshots(transaction).by_ids(sorted(expired_ids)).commit()
    return transaction.commit_transaction(), gone


def compaction_groups(
    files: Sequence[SmallFile],
    *,
    target_bytes: int,
    min_files: int,
    max_bytes: int,
    spec_id: int,
    with_deletes: Collection[str] = frozenset(),
) -> list[list[SmallFile]]:
    """Groups of files of one partition of the current spec, each about target_bytes in all.

    A file is rewritten when it is small (under 3/4 of target_bytes) in a partition with at least min_files small
    files, or when it is one of `with_deletes` (its position deletes are due to be applied), whatever its size; then
    its partition's small files are merged too. A partition's files with deletes come first, then its small files,
    smallest first; a group of one file is left alone unless it has deletes. The groups together rewrite at most
    max_bytes (the partitions with deletes to apply first, then the largest): a run short of bytes still rewrites
    files its delete files delete from, so that the next can drop them.
    """
    limit = target_bytes * SMALL_FILE_SHARE
    small_files: dict[tuple[object, ...], list[SmallFile]] = defaultdict(list)
    deleted_from: dict[tuple[object, ...], list[SmallFile]] = defaultdict(list)
    for file in files:
        if file.spec_id != spec_id:
            continue
        if file.path in with_deletes:
            deleted_from[file.partition].append(file)
        elif file.size < limit:
            small_files[file.partition].append(file)
    by_size = functools.partial(sorted, key=lambda small: (small.size, small.path))
    candidates = sorted(
        (
            (bool(deleted_from[partition]), [*by_size(deleted_from[partition]), *by_size(small_files[partition])])
            for partition in small_files.keys() | deleted_from.keys()
            if deleted_from[partition] or len(small_files[partition]) >= min_files
        ),
        key=lambda candidate: (not candidate[0], -sum(small.size for small in candidate[1])),
    )
    groups: list[list[SmallFile]] = []
    budget = max_bytes
    for _, partition_files in candidates:
        group: list[SmallFile] = []
        size = 0
        for small in partition_files:
            if small.size > budget:
                break
            group.append(small)
            size += small.size
            budget -= small.size
            if size >= target_bytes:
                groups.append(group)
                group, size = [], 0
        if len(group) > 1 or any(small.path in with_deletes for small in group):
            groups.append(group)
        if budget <= 0:
            break
    return groups


@dataclass(frozen=True)
class CompactionInput:
    """The current snapshot's live data files and delete files, as compaction plans them."""

    data: list[SmallFile]
    deletes: list[SmallFile]
    # The data files each position delete file deletes rows of, by its path.
    deleted_from: dict[str, frozenset[str]] = field(default_factory=dict)

    def partitions_with_equality_deletes(self) -> set[tuple[int, tuple[object, ...]]]:
        """(spec id, partition) of every equality delete file (another engine's); an unpartitioned spec's delete files
        apply to its whole table."""
        return {
            (small.spec_id, small.partition)
            for small in self.deletes
            if small.content == DataFileContent.EQUALITY_DELETES
        }

    def partitions_due_for_deletes(
        self, *, delete_files: int, deleted_rows_ratio: float
    ) -> set[tuple[int, tuple[object, ...]]]:
        """(spec id, partition) of every partition with no equality delete file whose position delete files are at
        least `delete_files`, or delete at least `deleted_rows_ratio` of its data files' rows."""
        delete_counts: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
        deleted: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
        for small in self.deletes:
            if small.content == DataFileContent.POSITION_DELETES:
                delete_counts[(small.spec_id, small.partition)] += 1
                deleted[(small.spec_id, small.partition)] += small.rows
        rows: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
        for small in self.data:
            rows[(small.spec_id, small.partition)] += small.rows
        return {
            partition
            for partition, count in delete_counts.items()
            if count >= delete_files or deleted[partition] >= deleted_rows_ratio * rows[partition]
        } - self.partitions_with_equality_deletes()


def compaction_input(table: Table) -> CompactionInput:
    """The table's live files as compaction plans them; only the manifests and position delete files the process has
    not read yet are read (after a commit: the manifest it wrote, or the one its merge wrote, and its delete files)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return CompactionInput([], [])
    data: list[SmallFile] = []
    deletes: list[SmallFile] = []
    deleted_from: dict[str, frozenset[str]] = {}
    for manifest in snapshot.manifests(table.io):
        files = _MANIFEST_ENTRIES.of(table.io, manifest)
        data.extend(files.data)
        deletes.extend(files.deletes)
        for delete_file in files.position_deletes:
            deleted_from[delete_file.file_path] = _DELETED_FROM.of(table.io, delete_file)
    return CompactionInput(data, deletes, deleted_from)


def compaction_plan(
    files: CompactionInput,
    held: Collection[str],
    *,
    target_bytes: int,
    min_files: int,
    max_bytes: int,
    spec_id: int,
    delete_files: int,
    deleted_rows_ratio: float,
) -> list[list[SmallFile]]:
    """What a compaction would rewrite (compaction_groups): the small files of each partition, and every file that
    the position delete files of a partition due for them (partitions_due_for_deletes) delete rows of; never a file
    `held` (by an epoch that is not COMMITTED: the log still has to settle it by that very file) nor a file of a
    partition with equality deletes (another engine's: the coordinator does not apply them, and a rewrite without them
    would bring deleted rows back). Position deletes are applied by the rewrite (write_compacted)."""
    with_equality_deletes = files.partitions_with_equality_deletes()
    due = files.partitions_due_for_deletes(delete_files=delete_files, deleted_rows_ratio=deleted_rows_ratio)
    with_deletes = {
        path
        for delete_file in files.deletes
        if (delete_file.spec_id, delete_file.partition) in due
        for path in files.deleted_from.get(delete_file.path, ())
    }
    return compaction_groups(
        [
            file
            for file in files.data
            if file.path not in held and (file.spec_id, file.partition) not in with_equality_deletes
        ],
        target_bytes=target_bytes,
        min_files=min_files,
        max_bytes=max_bytes,
        spec_id=spec_id,
        with_deletes=with_deletes,
    )


@dataclass(frozen=True)
class LiveFiles:
    """The current snapshot's live data files and delete files (position or equality)."""

    data: list[DataFile]
    deletes: list[DataFile]


def live_files(table: Table) -> LiveFiles:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return LiveFiles([], [])
    files = [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]
    return LiveFiles(
        data=[file for file in files if file.content == DataFileContent.DATA],
        deletes=[file for file in files if file.content != DataFileContent.DATA],
    )


@dataclass(frozen=True)
class Rewrite:
    """A compaction's change of the table: the data files `replaced` by those `written` (the same rows, their position
    deletes applied), and the position delete files dropped (no data file left live that they refer to)."""

    replaced: list[DataFile]
    written: list[DataFile]
    deletes_dropped: list[DataFile] = field(default_factory=list)


def write_compacted(table: Table, groups: Sequence[Sequence[SmallFile]], target_bytes: int) -> Rewrite:
    """Rewrite each group into files of about target_bytes with pyiceberg's own writer (the table's schema with
    its field ids, the partition, the statistics), the position delete files of the group's partition applied by
    pyiceberg's reader as its scans apply them; return the rewrite. Nothing is committed: the files written are
    unreferenced until commit_compaction."""
    live = live_files(table)
    by_path = {data_file.file_path: data_file for data_file in live.data}
    deletes_of: dict[tuple[int, tuple[object, ...]], set[DataFile]] = defaultdict(set)
    for delete_file in live.deletes:
        if delete_file.content == DataFileContent.POSITION_DELETES:
            deletes_of[(delete_file.spec_id, partition_values(delete_file.partition))].add(delete_file)
    table = without_retries(table)
    table.metadata = table.metadata.model_copy(
        update={
            "properties": {**table.metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES: str(target_bytes)}
        }
    )
    replaced = [by_path[small.path] for group in groups for small in group]
    written: list[DataFile] = []
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    for group in groups:
        tasks = [
            FileScanTask(data_file, delete_files=deletes_of[(data_file.spec_id, partition_values(data_file.partition))])
            for data_file in (by_path[small.path] for small in group)
        ]
        written.extend(data_files_of(table.metadata, scan.to_table(tasks), table.io))
    still_live = by_path.keys() - {data_file.file_path for data_file in replaced}
    touched = {(data_file.spec_id, partition_values(data_file.partition)) for data_file in replaced}
    dropped = [
        delete_file
        for partition in touched
        for delete_file in deletes_of[partition]
        if still_live.isdisjoint(_DELETED_FROM.of(table.io, delete_file))
    ]
    return Rewrite(replaced, written, dropped)


def commit_compaction(table: Table, rewrite: Rewrite) -> Table:
    """One `replace` snapshot: the replaced data files and the dropped delete files out, the written ones in (on the
    table they were planned on: a commit in between fails this one, and the next run plans again)."""
    return replace_files(
        without_retries(table),
        rewrite.replaced,
        rewrite.written,
        {COMPACTION_MARKER: "compaction"},
        deletes_dropped=rewrite.deletes_dropped,
    )


@dataclass(frozen=True)
class StoredFile:
    uri: str
    modified_ms: int


def stored_files(table: Table, directory: str) -> list[StoredFile]:
    """Every file under a directory of the table's storage (a URI), with its modification time (object stores: the
    upload's); symbolic links are neither listed nor followed."""
    listed = listed_files(table.io, directory)
    if listed is None:
        raise NotImplementedError(f"listing files needs pyiceberg's PyArrowFileIO, the table uses {type(table.io)}")
    return [
        StoredFile(uri=uri, modified_ms=-(-file.mtime_ns // 1_000_000))  # never earlier than written
        for uri, file in listed.items()
        if file.mtime_ns is not None
    ]


def metadata_files(table: Table) -> set[str]:
    """The table's current metadata file and those its metadata log still names."""
    files = {entry.metadata_file for entry in table.metadata.metadata_log}
    files.add(table.metadata_location)
    return files


def holds_table_metadata(table: Table, directory: str) -> bool:
    """Whether a directory of the table's storage is a table's location: its metadata/ holds a *.metadata.json."""
    listed = listed_files(table.io, f"{directory}/metadata") or {}
    return any(uri.endswith(METADATA_FILE_SUFFIX) for uri in listed)


def delete_stored_file(table: Table, path: str) -> None:
    """Delete one file through the table's own storage; gone already is deleted. Only
    coordinator_service.engine.file_deletion calls it, once a deletion is proven (docs/architecture.md)."""
    with contextlib.suppress(FileNotFoundError):
        table.io.delete(path)


def same_file(uri: str) -> str:
    """One spelling per file for comparisons: file:/x, file:///x and /x are the same local file."""
    parsed = urlparse(uri)
    scheme = parsed.scheme or "file"
    return f"{scheme}://{parsed.netloc}{parsed.path}"


def table_properties_for(merge_min_count: int) -> Mapping[str, str]:
    """What the coordinator sets on tables it maintains: commits merge manifests, and metadata files of
    older versions go with the commit that supersedes them (Iceberg keeps previous-versions-max of them)."""
    return {
        TableProperties.MANIFEST_MERGE_ENABLED: "true",
        TableProperties.MANIFEST_MIN_MERGE_COUNT: str(merge_min_count),
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
    }
