"""Which small files compaction merges, over a table's whole life: a partition fed a few files at every commit and
compacted after each (as the commit's threshold check asks), its files modelled by their sizes. Two bounds hold
whatever the sizes: each byte is rewritten only about log2(target / the smallest file) times (merging every small
file each time rewrote a low-volume partition's whole growing file at every commit), and the small files left
between compactions stay few."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables.table_maintenance import SmallFile

PARTITION = ("eu",)
NO_BUDGET = 1 << 50


@dataclass
class Partition:
    """A partition's live files, what compaction rewrote of them, and what came in."""

    target_bytes: int
    min_files: int
    files: list[SmallFile] = field(default_factory=list)
    ingested: int = 0
    rewritten: int = 0
    names: itertools.count[int] = field(default_factory=itertools.count)

    def append(self, sizes: Sequence[int]) -> None:
        self.files += [self._file(size) for size in sizes]
        self.ingested += sum(sizes)

    def compact(self) -> bool:
        """One compaction run, each group into one file (the sizes add up; no compression); whether it merged any."""
        groups = cp.compaction_groups(
            self.files, target_bytes=self.target_bytes, min_files=self.min_files, max_bytes=NO_BUDGET, spec_id=0
        )
        for group in groups:
            paths = {small.path for small in group}
            assert len(paths) == len(group) > 1
            self.files = [small for small in self.files if small.path not in paths]
            self.files.append(self._file(sum(small.size for small in group)))
            self.rewritten += sum(small.size for small in group)
        return bool(groups)

    def small_files(self) -> int:
        return sum(small.size < self.target_bytes * cp.SMALL_FILE_SHARE for small in self.files)

    def _file(self, size: int) -> SmallFile:
        return SmallFile(path=f"f{next(self.names)}", size=size, spec_id=0, partition=PARTITION)


def rewrites_per_byte_bound(target_bytes: int, smallest: int) -> float:
    """A byte is rewritten while its file is small, and each such rewrite at least doubles that file; the last one
    may instead make a file of the target size."""
    return math.log2(target_bytes * cp.SMALL_FILE_SHARE / smallest) + 2


def test_a_low_volume_partition_is_not_rewritten_whole_at_every_commit() -> None:
    """A sink of 1 KB batches at a 1 s trigger, a commit of ten every 10 s and the default target and min files: 1,000
    commits. Merging every small file each time rewrote the whole growing file at each commit: 5,005,000 KB rewritten
    for 10,000 KB written (500 x)."""
    partition = Partition(target_bytes=128 << 20, min_files=5)
    for _ in range(1_000):
        partition.append([1_000] * 10)
        partition.compact()

    assert partition.rewritten <= partition.ingested * rewrites_per_byte_bound(128 << 20, 1_000)
    assert partition.rewritten / partition.ingested < 12


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.one_of(st.integers(100, 5_000), st.integers(100, 400_000)), min_size=1, max_size=12),
        min_size=1,
        max_size=5,
    ),
    count=st.integers(1, 300),
    min_files=st.integers(2, 8),
    settle=st.booleans(),
)
def test_each_byte_is_rewritten_a_bounded_number_of_times_and_few_small_files_are_left(
    batches: list[list[int]], count: int, min_files: int, settle: bool
) -> None:
    """`count` commits, each of the files of one of `batches` in turn (a stream's batches vary, and repeat)."""
    target_bytes = 4 << 20
    partition = Partition(target_bytes=target_bytes, min_files=min_files)
    for sizes in itertools.islice(itertools.cycle(batches), count):
        partition.append(sizes)
        while partition.compact() and settle:
            pass  # a run, and the runs its own output asks for (or only the one run after the commit)
    smallest = min(size for sizes in batches for size in sizes)

    assert partition.rewritten <= partition.ingested * rewrites_per_byte_bound(target_bytes, smallest)
    while partition.compact():
        pass
    # Left unmerged: fewer than min_files that are worth merging, and files each larger than all the smaller ones
    # together (sizes at least doubling from the smallest up to the target).
    limit = target_bytes * cp.SMALL_FILE_SHARE
    assert partition.small_files() <= min_files - 1 + math.log2(limit / smallest) + 1
