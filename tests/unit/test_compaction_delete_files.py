"""What compaction does with a keyed table's position delete files, over many maintenance runs: a table larger than
one run's byte budget (COMPACTION_MAX_BYTES_PER_RUN), updated at keys spread over all its files, each commit a data
file and a delete file that deletes rows of every file. Its delete files stay few (a partition's are merged into one
at each run), and no data file keeps more than about the ratio's share of its rows deleted (the most deleted are
rewritten first). Applying a partition's delete files by rewriting every data file they delete from could not keep up
with such a table: its delete files were dropped only once every file they named had been rewritten, which a run
short of bytes never did, and they gathered without bound (1,800 after 60 runs of 30 commits)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent

from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables.table_maintenance import SmallFile

TARGET = 128 << 20
BYTES_PER_ROW = 100


@dataclass
class KeyedTable:
    """A keyed table's live files (one partition), modelled by their rows and the rows each delete file deletes."""

    budget: int
    delete_files_min: int = 5
    ratio: float = 0.1
    data: dict[str, SmallFile] = field(default_factory=dict)
    # Delete file path -> (the file, rows it deletes of each data file).
    deletes: dict[str, tuple[SmallFile, dict[str, int]]] = field(default_factory=dict)
    names: itertools.count[int] = field(default_factory=itertools.count)
    bytes_rewritten: int = 0
    # The most a file's deleted share grew in one run's commits.
    most_growth: float = 0.0

    def add_data(self, rows: int) -> None:
        small = self._file(rows * BYTES_PER_ROW, rows, DataFileContent.DATA)
        self.data[small.path] = small

    def commit(self, rows: int) -> None:
        """An epoch of `rows` upserts of keys spread over the table: its rows deleted from every live file as it holds
        rows (the live ones), its new rows in a file of its own."""
        live = {path: small.rows - self.deleted(path) for path, small in self.data.items()}
        total = sum(live.values())
        deleted = {path: max(1, rows * held // total) for path, held in live.items() if held}
        delete_file = self._file(sum(deleted.values()) * 10, sum(deleted.values()), DataFileContent.POSITION_DELETES)
        self.deletes[delete_file.path] = (delete_file, deleted)
        self.add_data(rows)

    def deleted(self, path: str) -> int:
        return sum(counts.get(path, 0) for _, counts in self.deletes.values())

    def maintain(self) -> None:
        """One maintenance run: plan as the coordinator does, then apply the rewrite to the model."""
        files = cp.CompactionInput(
            list(self.data.values()),
            [small for small, _ in self.deletes.values()],
            {path: counts for path, (_, counts) in self.deletes.items()},
        )
        plan = cp.compaction_plan(
            files,
            (),
            target_bytes=TARGET,
            min_files=5,
            max_bytes=self.budget,
            spec_id=0,
            delete_files=self.delete_files_min,
            deleted_rows_ratio=self.ratio,
        )
        replaced = {small.path for group in plan.groups for small in group}
        assert sum(self.data[path].size for path in replaced) <= self.budget
        self.bytes_rewritten += sum(self.data[path].size for path in replaced)
        kept_rows = sum(self.data[path].rows - self.deleted(path) for path in replaced)
        for path in replaced:
            del self.data[path]
        while kept_rows > 0:
            rows = min(kept_rows, TARGET // BYTES_PER_ROW)
            self.add_data(rows)
            kept_rows -= rows
        merged = {small.path for merge in plan.merges for small in merge}
        counts: dict[str, int] = {}
        for path in merged:
            _, deleted = self.deletes.pop(path)
            for data_path, rows in deleted.items():
                if data_path in self.data:
                    counts[data_path] = counts.get(data_path, 0) + rows
        self.deletes = {
            path: (small, deleted)
            for path, (small, deleted) in self.deletes.items()
            if not self.data.keys().isdisjoint(deleted)
        }
        if counts:
            merged_file = self._file(sum(counts.values()) * 10, sum(counts.values()), DataFileContent.POSITION_DELETES)
            self.deletes[merged_file.path] = (merged_file, counts)

    def most_deleted_share(self) -> float:
        return max(self.deleted(path) / small.rows for path, small in self.data.items())

    def _file(self, size: int, rows: int, content: DataFileContent) -> SmallFile:
        path = f"f{next(self.names):06d}"
        return SmallFile(path=path, size=size, spec_id=0, partition=(), rows=rows, content=content)


def run_table(table: KeyedTable, runs: int, commits_per_run: int, epoch_rows: int) -> list[int]:
    """The delete files the table has before each run."""
    before = []
    for _ in range(runs):
        shares = {path: table.deleted(path) / small.rows for path, small in table.data.items()}
        for _ in range(commits_per_run):
            table.commit(epoch_rows)
        growth = max(table.deleted(path) / small.rows - shares.get(path, 0.0) for path, small in table.data.items())
        table.most_growth = max(table.most_growth, growth)
        before.append(len(table.deletes))
        table.maintain()
        # Merged into one, or fewer than a merge waits for.
        assert len(table.deletes) < max(table.delete_files_min, 2)
    return before


def test_a_table_larger_than_a_runs_budget_keeps_few_delete_files_and_few_deleted_rows() -> None:
    """20 files of 1,342,177 rows (2.5 GiB, the default budget 1 GiB), 60 runs of 30 commits of 10,000 upserts (the
    default commit interval and maintenance interval): the old rule rewrote the files the delete files named within
    the budget, never all of them, and kept every delete file: 1,800 after the 60 runs."""
    table = KeyedTable(budget=1 << 30)
    for _ in range(20):
        table.add_data(TARGET // BYTES_PER_ROW)
    before = run_table(table, runs=60, commits_per_run=30, epoch_rows=10_000)

    assert max(before) <= 31  # the run's 30, and the one merged at the run before
    # A file whose deletes reach the ratio waits at most a few runs for its rewrite (the table is 3 budgets).
    assert table.most_deleted_share() < 2 * table.ratio
    # The rewrites stay within the budget each run, and the deletes were applied: the table holds its rows once.
    assert table.bytes_rewritten <= 60 * table.budget


@settings(max_examples=60, deadline=None)
@given(
    files=st.integers(1, 30),
    budget_files=st.integers(1, 12),
    commits_per_run=st.integers(1, 40),
    epoch_rows=st.integers(100, 200_000),
    delete_files_min=st.integers(1, 10),
    ratio=st.sampled_from([0.01, 0.05, 0.1, 0.3, 1.0]),
)
def test_delete_files_and_deleted_rows_stay_bounded_whatever_the_shape(
    files: int,
    budget_files: int,
    commits_per_run: int,
    epoch_rows: int,
    delete_files_min: int,
    ratio: float,
) -> None:
    table = KeyedTable(budget=budget_files * TARGET, delete_files_min=delete_files_min, ratio=ratio)
    for _ in range(files):
        table.add_data(TARGET // BYTES_PER_ROW)
    runs = 25
    before = run_table(table, runs=runs, commits_per_run=commits_per_run, epoch_rows=epoch_rows)

    assert max(before) < max(delete_files_min, 2) + commits_per_run
    # A file due waits at most for the files due before it, the most deleted first: about the table over the budget
    # runs, while each run's commits add at most `most_growth` to its share. A file passed over, run after run, would
    # go beyond.
    waiting_runs = -(-len(table.data) // budget_files) + 2
    assert table.most_deleted_share() <= ratio + waiting_runs * table.most_growth
