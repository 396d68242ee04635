"""Compaction of an Iceberg table, on pyiceberg; blocking (the caller runs it in worker threads): small files, and
files with position deletes, rewritten as one `replace` snapshot (the rows read stay exactly the same: the files are
rewritten with their position deletes applied, and a delete file no live data file is left to refer to is dropped in
the same snapshot). What may be rewritten is the caller's decision (coordinator_service.engine.maintenance_steps.
compaction); the reading of manifests it shares with expiry and the sweep is table_maintenance's."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask, Table, TableProperties

from coordinator_service.tables.iceberg import without_retries
from coordinator_service.tables.pyiceberg_internals import (
    data_files_of,
    deleted_positions,
    partition_values,
    replace_files,
)
from coordinator_service.tables.table_maintenance import SmallFile, manifest_files

# Files smaller than this share of the target size are compacted (Iceberg's rewrite default, 75 %).
SMALL_FILE_SHARE = 0.75
# The summary property of the coordinator's compaction snapshots (they carry no sink marker).
COMPACTION_MARKER = "sink-coordinator.maintenance"


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

    A file is rewritten when it is one of `with_deletes` (its position deletes are due to be applied), whatever its
    size, or when it is small (under 3/4 of target_bytes) and worth merging: a partition's small files are merged
    smallest first, as many as keep the largest of them no larger than the others of its group together
    (`_worth_merging`), once at least min_files of them are (or with files rewritten for their deletes). So a
    byte rewritten at least doubles the file it is in, and is rewritten at most about log2(target / the smallest
    file's size) times before its file is no longer small: merging every small file each time would rewrite a
    low-volume partition's whole growing file at every compaction. A group of one file is left alone unless it has
    deletes. The groups together rewrite at most max_bytes (the partitions with deletes to apply first, then the
    largest): a run short of bytes still rewrites files its delete files delete from, so that the next can drop them.
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
    partitions = []
    for partition in small_files.keys() | deleted_from.keys():
        rewritten = by_size(deleted_from[partition])
        merged = _worth_merging(by_size(small_files[partition]), _bytes(rewritten))
        if rewritten or len(merged) >= min_files:
            partitions.append((bool(rewritten), [*rewritten, *merged]))
    groups: list[list[SmallFile]] = []
    budget = max_bytes
    for _, partition_files in sorted(partitions, key=lambda candidate: (not candidate[0], -_bytes(candidate[1]))):
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
        # What is left of the partition (after groups of the target size, or short of the budget) is held to the
        # same rule: its largest files are not rewritten into a file hardly larger.
        forced = [small for small in group if small.path in with_deletes]
        merged = _worth_merging(group[len(forced) :], _bytes(forced))
        budget += _bytes(group) - _bytes(forced) - _bytes(merged)
        if forced or len(merged) > 1:
            groups.append([*forced, *merged])
        if budget <= 0:
            break
    return groups


def _worth_merging(small_files: Sequence[SmallFile], rewritten: int) -> list[SmallFile]:
    """The longest run of `small_files` (smallest first) whose largest file is no larger than the others of the run
    and the `rewritten` bytes merged with them together: the output is at least twice any file in it."""
    count = 0
    total = rewritten
    for index, small in enumerate(small_files):
        if small.size <= total:
            count = index + 1
        total += small.size
    return list(small_files[:count])


def _bytes(files: Sequence[SmallFile]) -> int:
    return sum(small.size for small in files)


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
        files = manifest_files(table.io, manifest)
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
