"""Compaction of an Iceberg table, on pyiceberg; blocking (the caller runs it in worker threads): small files, and
files with many rows deleted by position deletes, rewritten as one `replace` snapshot (the rows read stay exactly the
same: the files are rewritten with their position deletes applied, and a delete file no live data file is left to
refer to is dropped in the same snapshot); in the same snapshot, a partition's many position delete files merged into
one (Iceberg's rewrite of position delete files), which costs what the deletes hold, not what the table holds. What
may be rewritten is the caller's decision (coordinator_service.engine.maintenance_steps.compaction); the reading of
manifests it shares with expiry and the sweep is table_maintenance's."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask, Table, TableProperties

from coordinator_service.tables.iceberg import without_retries
from coordinator_service.tables.position_deletes import deleted_positions, deleted_rows, write_position_deletes
from coordinator_service.tables.pyiceberg_internals import data_files_of, partition_values, replace_files
from coordinator_service.tables.table_maintenance import SmallFile, manifest_files

# Files smaller than this share of the target size are compacted (Iceberg's rewrite default, 75 %).
SMALL_FILE_SHARE = 0.75
# The summary property of the coordinator's compaction snapshots (they carry no sink marker).
COMPACTION_MARKER = "sink-coordinator.maintenance"


class _DeletedFrom:
    """How many rows of each data file a position delete file deletes, by the delete file's path: a delete file never
    changes once written, so each is read once per process (bounded, least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._counts: OrderedDict[str, Mapping[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, io: FileIO, delete_file: DataFile) -> Mapping[str, int]:
        with self._lock:
            counts = self._counts.get(delete_file.file_path)
            if counts is not None:
                self._counts.move_to_end(delete_file.file_path)
                return counts
        counts = {path: len(positions) for path, positions in deleted_positions(io, delete_file).items()}
        with self._lock:
            self._counts[delete_file.file_path] = counts
            while len(self._counts) > self._capacity:
                self._counts.popitem(last=False)
        return counts


_DELETED_FROM = _DeletedFrom(capacity=20_000)


def compaction_groups(
    files: Sequence[SmallFile],
    *,
    target_bytes: int,
    min_files: int,
    max_bytes: int,
    spec_id: int,
    with_deletes: Mapping[str, float] | None = None,
) -> list[list[SmallFile]]:
    """Groups of files of one partition of the current spec, each about target_bytes in all.

    A file is rewritten when it is one of `with_deletes` (its position deletes are due to be applied: the share of
    its rows they delete, by path), whatever its size, the most deleted first; or when it is small (under 3/4 of
    target_bytes) and worth merging: a partition's small files are merged smallest first, as many as keep the largest
    of them no larger than the others of its group together (`_worth_merging`), once at least min_files of them are
    (or with files rewritten for their deletes). So a byte rewritten at least doubles the file it is in, and is
    rewritten at most about log2(target / the smallest file's size) times before its file is no longer small: merging
    every small file each time would rewrite a low-volume partition's whole growing file at every compaction. A group
    of one file is left alone unless it has deletes. The groups together rewrite at most max_bytes (the partitions
    with deletes to apply first, then the largest).
    """
    with_deletes = with_deletes or {}
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
        rewritten = sorted(deleted_from[partition], key=lambda due: (-with_deletes[due.path], due.size, due.path))
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


# A partition of a spec: (spec id, partition values).
SpecPartition = tuple[int, tuple[object, ...]]


@dataclass(frozen=True)
class CompactionInput:
    """The current snapshot's live data files and delete files, as compaction plans them."""

    data: list[SmallFile]
    deletes: list[SmallFile]
    # How many rows of each data file each position delete file deletes, by the delete file's path.
    deleted_from: dict[str, Mapping[str, int]] = field(default_factory=dict)

    def partitions_with_equality_deletes(self) -> set[SpecPartition]:
        """(spec id, partition) of every equality delete file (another engine's); an unpartitioned spec's delete files
        apply to its whole table."""
        return {
            (small.spec_id, small.partition)
            for small in self.deletes
            if small.content == DataFileContent.EQUALITY_DELETES
        }

    def files_due_for_deletes(self, deleted_rows_ratio: float) -> dict[str, float]:
        """The data files whose position deletes delete at least `deleted_rows_ratio` of their rows (the share each,
        by path), of partitions with no equality delete file."""
        deleted: dict[str, int] = defaultdict(int)
        for counts in self.deleted_from.values():
            for path, rows in counts.items():
                deleted[path] += rows
        equality = self.partitions_with_equality_deletes()
        return {
            small.path: deleted[small.path] / small.rows
            for small in self.data
            if small.rows
            and deleted.get(small.path, 0) >= deleted_rows_ratio * small.rows
            and (small.spec_id, small.partition) not in equality
        }

    def delete_merges(self, delete_files: int, held: Collection[str]) -> list[list[SmallFile]]:
        """The position delete files of each partition (no equality delete file among its files) that has at least
        `delete_files` of them (and two), to be merged into one; a delete file `held` (by an epoch the log has not
        settled) stays as it is."""
        by_partition: dict[SpecPartition, list[SmallFile]] = defaultdict(list)
        for small in self.deletes:
            if small.content == DataFileContent.POSITION_DELETES and small.path not in held:
                by_partition[(small.spec_id, small.partition)].append(small)
        equality = self.partitions_with_equality_deletes()
        return [
            sorted(files, key=lambda small: small.path)
            for partition, files in by_partition.items()
            if len(files) >= max(delete_files, 2) and partition not in equality
        ]


def compaction_input(table: Table) -> CompactionInput:
    """The table's live files as compaction plans them; only the manifests and position delete files the process has
    not read yet are read (after a commit: the manifest it wrote, or the one its merge wrote, and its delete files)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return CompactionInput([], [])
    data: list[SmallFile] = []
    deletes: list[SmallFile] = []
    deleted_from: dict[str, Mapping[str, int]] = {}
    for manifest in snapshot.manifests(table.io):
        files = manifest_files(table.io, manifest)
        data.extend(files.data)
        deletes.extend(files.deletes)
        for delete_file in files.position_deletes:
            deleted_from[delete_file.file_path] = _DELETED_FROM.of(table.io, delete_file)
    return CompactionInput(data, deletes, deleted_from)


@dataclass(frozen=True)
class CompactionPlan:
    """What one compaction rewrites: groups of data files (compaction_groups), each into files of about the target
    size, and the position delete files of some partitions, each partition's merged into one."""

    groups: list[list[SmallFile]] = field(default_factory=list)
    merges: list[list[SmallFile]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.groups or self.merges)


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
) -> CompactionPlan:
    """What a compaction would rewrite: the small files of each partition and the data files due for their deletes
    (files_due_for_deletes), grouped by compaction_groups; and the position delete files of each partition that has
    `delete_files` of them, merged (delete_merges). Never a file `held` (by an epoch that is not COMMITTED: the log
    still has to settle it by that very file) nor a data file of a partition with equality deletes (another engine's:
    the coordinator does not apply them, and a rewrite without them would bring deleted rows back). Position deletes
    are applied by the rewrite (write_compacted).

    A partition's delete files are merged, not applied by rewriting every data file they delete from: a table's
    updates spread over all its files, and rewriting them all whenever a few delete files gathered cost the table's
    size at each run; a table larger than max_bytes never had them all rewritten, so its delete files were never
    dropped and gathered without bound. A data file is rewritten for its deletes once they delete
    `deleted_rows_ratio` of its rows, the most deleted first."""
    with_equality_deletes = files.partitions_with_equality_deletes()
    groups = compaction_groups(
        [
            file
            for file in files.data
            if file.path not in held and (file.spec_id, file.partition) not in with_equality_deletes
        ],
        target_bytes=target_bytes,
        min_files=min_files,
        max_bytes=max_bytes,
        spec_id=spec_id,
        with_deletes=files.files_due_for_deletes(deleted_rows_ratio),
    )
    return CompactionPlan(groups, files.delete_merges(delete_files, held))


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
    deletes applied), the position delete files dropped (merged, or no data file left live that they refer to), and
    those written (a partition's merged delete files: the rows they deleted of the data files still live)."""

    replaced: list[DataFile]
    written: list[DataFile]
    deletes_dropped: list[DataFile] = field(default_factory=list)
    deletes_written: list[DataFile] = field(default_factory=list)

    @property
    def files_written(self) -> list[DataFile]:
        """Every file the rewrite wrote (nobody's until it is committed)."""
        return [*self.written, *self.deletes_written]


def write_compacted(table: Table, plan: CompactionPlan, target_bytes: int) -> Rewrite:
    """Rewrite each group into files of about target_bytes with pyiceberg's own writer (the table's schema with
    its field ids, the partition, the statistics), the position delete files of the group's partition applied by
    pyiceberg's reader as its scans apply them; merge each merge's delete files into one, which deletes the rows they
    deleted of the data files still live after the rewrite (none left: no file); return the rewrite. Nothing is
    committed: the files written are unreferenced until commit_compaction."""
    live = live_files(table)
    by_path = {data_file.file_path: data_file for data_file in live.data}
    deletes_of: dict[SpecPartition, set[DataFile]] = defaultdict(set)
    for delete_file in live.deletes:
        if delete_file.content == DataFileContent.POSITION_DELETES:
            deletes_of[(delete_file.spec_id, partition_values(delete_file.partition))].add(delete_file)
    table = without_retries(table)
    table.metadata = table.metadata.model_copy(
        update={
            "properties": {**table.metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES: str(target_bytes)}
        }
    )
    replaced = [by_path[small.path] for group in plan.groups for small in group]
    written: list[DataFile] = []
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    for group in plan.groups:
        tasks = [
            FileScanTask(data_file, delete_files=deletes_of[(data_file.spec_id, partition_values(data_file.partition))])
            for data_file in (by_path[small.path] for small in group)
        ]
        written.extend(data_files_of(table.metadata, scan.to_table(tasks), table.io))
    still_live = by_path.keys() - {data_file.file_path for data_file in replaced}
    live_deletes = {delete_file.file_path: delete_file for delete_file in live.deletes}
    merges = [[live_deletes[small.path] for small in merge] for merge in plan.merges]
    deletes_written = [merged for merge in merges for merged in _merged(table, merge, still_live, by_path)]
    merged = [delete_file for merge in merges for delete_file in merge]
    touched = {(data_file.spec_id, partition_values(data_file.partition)) for data_file in replaced}
    merged_paths = {delete_file.file_path for delete_file in merged}
    dropped = merged + [
        delete_file
        for partition in touched
        for delete_file in deletes_of[partition]
        if delete_file.file_path not in merged_paths and still_live.isdisjoint(_DELETED_FROM.of(table.io, delete_file))
    ]
    return Rewrite(replaced, written, dropped, deletes_written)


def _merged(
    table: Table, delete_files: Sequence[DataFile], still_live: Collection[str], data_files: Mapping[str, DataFile]
) -> list[DataFile]:
    """The position delete file that deletes what `delete_files` (of one partition) delete of the `still_live` data
    files, written (none when that is nothing)."""
    positions = {path: rows for path, rows in deleted_rows(table.io, delete_files).items() if path in still_live}
    return write_position_deletes(table, positions, data_files) if positions else []


def commit_compaction(table: Table, rewrite: Rewrite) -> Table:
    """One `replace` snapshot: the replaced data files and the dropped delete files out, the written data and delete
    files in (on the table they were planned on: a commit in between fails this one, and the next run plans again)."""
    return replace_files(
        without_retries(table),
        rewrite.replaced,
        rewrite.written,
        {COMPACTION_MARKER: "compaction"},
        deletes_dropped=rewrite.deletes_dropped,
        deletes_added=rewrite.deletes_written,
    )
