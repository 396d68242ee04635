"""Keeping an Iceberg table healthy, on pyiceberg; blocking (the caller runs it in worker threads).

Snapshot expiration that also deletes the files only the expired snapshots referenced (data and delete files), the
files under the table's location that nothing references, and the reading of manifests they share with compaction
(tables/compaction_plans.py). What may be expired or deleted is the caller's decision
(coordinator_service.engine.maintenance): it knows the commit log, the table does not.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ExpireSnapshots

from coordinator_service.contract.markers import MARKER_EPOCH, SinkIdentity, snapshot_properties
from coordinator_service.tables.file_listing import listed_files
from coordinator_service.tables.iceberg import without_retries
from coordinator_service.tables.pyiceberg_internals import (
    coordinator_transaction,
)

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


def manifest_files(io: FileIO, manifest: ManifestFile) -> ManifestFiles:
    """A manifest's live entries, read once per process (the reads of expiry, the sweep and compaction share them)."""
    return _MANIFEST_ENTRIES.of(io, manifest)


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
        properties = snapshot_properties(snapshot)
        for identity, committed_epoch in sinks:
            if identity.owns(properties) and int(properties[MARKER_EPOCH]) > committed_epoch:
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
    transaction = coordinator_transaction(without_retries(table))
    ExpireSnapshots(transaction).by_ids(sorted(expired_ids)).commit()
    return transaction.commit_transaction(), gone


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
    """What the coordinator sets on tables it maintains: commits merge manifests. (The metadata files a commit
    drops from the metadata log, beyond Iceberg's previous-versions-max, are left to the orphan sweep:
    pyiceberg_internals.coordinator_transaction.)"""
    return {
        TableProperties.MANIFEST_MERGE_ENABLED: "true",
        TableProperties.MANIFEST_MIN_MERGE_COUNT: str(merge_min_count),
    }
