"""`python -m bench.keyed_compaction [--quick]`: what a keyed table's position delete files cost a full scan, and what
maintenance gives back (issue 29's goal: a full scan of an upsert table before compaction at most 1.5 x the same
after compaction).

A keyed table of 1,000,000 rows (ids 0.., files of 50,000 rows, as bench.key_resolution builds it), then epochs of
10,000 upserts each, keys spread uniformly over the table, each committed as a row delta (its rows in a new data file,
the keys' old rows deleted by one position delete file: what a keyed sink's commit does), until the commit after which
maintenance's plan with the default policy (COMPACTION_TARGET_FILE_BYTES: the table's file size, so that its files
are not small) would act (the commit that asks for a run: the most delete files a maintained table reads between
runs, at a commit rate above the maintenance clock's). A full scan of every live row (pyiceberg's `scan().to_arrow()`
and DuckDB's Iceberg extension, position deletes applied) is timed there; then after the run that policy makes (its
delete files merged into one: no data file has the ratio of its rows deleted yet), and after a compaction that applies
every delete (every data file with a deleted row rewritten, the delete files dropped, one `replace` snapshot), the
same scans timed again. The rows are checked equal each time; each repetition scans every state with every reader
in turn.

pyiceberg is timed twice: as installed, and with its row range built by numpy, as pyiceberg itself built it until
0.8 (numpy_row_range: that one line changed). For every data file a delete file applies to, pyiceberg 0.12 builds a
Python range of the file's row numbers and filters it by the deletes (apache/iceberg-python#1270 traded np.arange for
it to drop numpy; #1271, open, tracks what it costs): a cost that follows the rows of the files with a delete,
however few their deletes. The second timing is the same reader without it.

Writes bench/results/keyed_compaction.md and keyed_compaction.json. A pyiceberg SQL catalog on SQLite and local files:
the catalog is not what is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyiceberg.io.pyarrow as pyiceberg_arrow
from pydantic import ByteSize
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from bench.infra import machine_facts, spread, temp_root
from bench.key_resolution import RESULTS, build_table, timed, upsert_epoch
from coordinator_service.engine.maintenance_steps.compaction import policy_plan
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.row_deltas import commit_row_delta
from tests.fixtures.duckdb_reader import iceberg_connection

TABLE = "bench.keyed_compaction"
KEYS_PER_EPOCH = 10_000
# Epochs committed at most before the plan must have asked for a compaction.
MAX_EPOCHS = 50
# The goal: a full scan before compaction at most this many times the same after it.
GOAL = 1.5
# A deleted-rows ratio that makes every data file with a deleted row due for a rewrite.
APPLY_EVERY_DELETE = 1e-9


def full_scan(table: Table) -> int:
    rows: int = table.scan().to_arrow().num_rows
    return rows


def numpy_range_positions(positional_deletes: list[pa.ChunkedArray], start_index: int, end_index: int) -> pa.Array:
    """pyiceberg 0.12's `_combine_positional_deletes` with its one line that apache/iceberg-python#1271 is about
    changed: the range of the batch's row numbers built by numpy (`np.arange`, as pyiceberg did until 0.8) instead of
    from a Python range. The rows of a batch `start_index`..`end_index` of a data file that no position of
    `positional_deletes` deletes, numbered from the batch's start."""
    if len(positional_deletes) == 1:
        all_chunks = positional_deletes[0]
    else:
        all_chunks = pa.chunked_array(itertools.chain(*[array.chunks for array in positional_deletes]))
    full_range = pa.array(np.arange(start_index, end_index, dtype=np.int64))
    kept = pc.filter(full_range, pc.invert(pc.is_in(full_range, value_set=all_chunks)))
    return pc.subtract(kept, pa.scalar(start_index))


@contextlib.contextmanager
def numpy_row_range() -> Iterator[None]:
    """pyiceberg's scans in this process apply position deletes with numpy_range_positions, until the block ends."""
    installed = pyiceberg_arrow._combine_positional_deletes
    pyiceberg_arrow._combine_positional_deletes = numpy_range_positions
    try:
        yield
    finally:
        pyiceberg_arrow._combine_positional_deletes = installed


def numpy_range_full_scan(table: Table) -> int:
    with numpy_row_range():
        return full_scan(table)


def duckdb_full_scan(connection: duckdb.DuckDBPyConnection, table: Table) -> int:
    """Every live row as DuckDB's Iceberg extension reads it (the second reader of the tests), into Arrow."""
    path = table.metadata_location.removeprefix("file://")
    rows: int = connection.execute(f"SELECT * FROM iceberg_scan('{path}')").fetch_arrow_table().num_rows
    return rows


def files_of(table: Table) -> dict[str, int]:
    live = cp.live_files(table)
    return {"data_files": len(live.data), "delete_files": len(live.deletes)}


def plan(table: Table, policy: MaintenancePolicy) -> cp.CompactionPlan:
    """What a maintenance run with `policy` would compact (nothing held)."""
    return policy_plan(table, cp.compaction_input(table), policy, set())


def compact(table: Table, policy: MaintenancePolicy) -> tuple[Table, float, cp.Rewrite]:
    """Compact the table as a maintenance run with `policy` would; the seconds it took."""
    started = time.perf_counter()
    rewrite = cp.write_compacted(table, plan(table, policy), policy.compaction_target_file_bytes)
    committed = cp.commit_compaction(table, rewrite)
    return committed, time.perf_counter() - started, rewrite


def measure(gateway: IcebergGateway, rows: int, repetitions: int, seed: int) -> dict[str, Any]:
    chooser = random.Random(seed)
    built = build_table(gateway, TABLE, rows)
    # The built files are the target size (not small): what is compacted is what the epochs added.
    target = int(statistics.median(data_file.file_size_in_bytes for data_file in cp.live_files(built).data))
    policy = MaintenancePolicy(compaction_target_file_bytes=ByteSize(target))
    commits: list[float] = []
    while not plan(gateway.load(TABLE), policy):
        assert len(commits) < MAX_EPOCHS, "the default policy never asked for a compaction"
        keys = chooser.sample(range(rows), KEYS_PER_EPOCH)
        change = upsert_epoch(gateway, TABLE, keys, f"v{len(commits) + 1}")
        started = time.perf_counter()
        commit_row_delta(gateway.load(TABLE), [change], {"bench.epoch": str(len(commits))})
        commits.append(time.perf_counter() - started)
    before_table = gateway.load(TABLE)
    before_rows = before_table.scan().to_arrow().sort_by("id")
    assert before_rows.num_rows == rows, "an upsert table keeps one row per key"
    tables: dict[str, tuple[Table, dict[str, float] | None]] = {"before": (before_table, None)}
    merged_table, merge_seconds, merge = compact(before_table, policy)
    tables["merged"] = (merged_table, {"seconds": merge_seconds, **rewrite_facts(merge)})
    applied_policy = policy.model_copy(update={"compaction_deleted_rows_ratio": APPLY_EVERY_DELETE})
    after_table, compaction_seconds, rewrite = compact(merged_table, applied_policy)
    tables["after"] = (after_table, {"seconds": compaction_seconds, **rewrite_facts(rewrite)})
    states: dict[str, Any] = {name: {**files_of(state), "change": facts} for name, (state, facts) in tables.items()}
    with iceberg_connection() as connection:  # the extension loaded once, not in what is timed
        readers: dict[str, Callable[[Table], int]] = {
            "scan_seconds": full_scan,
            "numpy_range_scan_seconds": numpy_range_full_scan,
            "duckdb_scan_seconds": functools.partial(duckdb_full_scan, connection),
        }
        for name, (state, _) in tables.items():
            assert state.scan().to_arrow().sort_by("id").equals(before_rows), f"{name}: the rows changed"
            with numpy_row_range():
                assert state.scan().to_arrow().sort_by("id").equals(before_rows), f"{name}: numpy's range reads others"
            assert duckdb_full_scan(connection, state) == rows, f"{name}: DuckDB reads another table"
        # Each repetition scans every state with every reader in turn: a machine that slows down during the run
        # slows them alike, not the states or readers timed last.
        seconds: dict[tuple[str, str], list[float]] = {(name, reader): [] for name in tables for reader in readers}
        for _ in range(repetitions):
            for name, (state, _) in tables.items():
                for reader, scan in readers.items():
                    seconds[name, reader].extend(timed(functools.partial(scan, state), 1))
    for (name, reader), times in seconds.items():
        states[name][reader] = spread(times)
    before, after = states["before"], states["after"]
    return {
        "rows": rows,
        "epochs": len(commits),
        "keys_per_epoch": KEYS_PER_EPOCH,
        "target_file_bytes": target,
        "commit_seconds": spread(commits),
        **states,
        "ratio": before["scan_seconds"]["median"] / after["scan_seconds"]["median"],
        "numpy_range_ratio": before["numpy_range_scan_seconds"]["median"] / after["numpy_range_scan_seconds"]["median"],
        "duckdb_ratio": before["duckdb_scan_seconds"]["median"] / after["duckdb_scan_seconds"]["median"],
    }


def rewrite_facts(rewrite: cp.Rewrite) -> dict[str, int]:
    return {
        "data_files_replaced": len(rewrite.replaced),
        "data_files_written": len(rewrite.written),
        "delete_files_dropped": len(rewrite.deletes_dropped),
        "delete_files_written": len(rewrite.deletes_written),
    }


def render(results: dict[str, Any]) -> str:
    table = results["table"]
    ratio, numpy_ratio, duckdb_ratio = table["ratio"], table["numpy_range_ratio"], table["duckdb_ratio"]
    names = {
        "before": "before the run",
        "merged": "after the run (default policy: its delete files merged)",
        "after": "after a compaction that applies every delete",
    }
    return "\n".join(
        [
            "# A keyed table's full scan before and after maintenance",
            "",
            f"`python -m bench.keyed_compaction{' --quick' if results['quick'] else ''}`, {results['date']}, "
            f"{results['machine']['cores']} cores, median of {results['repetitions']} full scans into Arrow by each "
            "reader (pyiceberg `scan().to_arrow()`, DuckDB's Iceberg extension `SELECT * FROM iceberg_scan(...)`), "
            "position deletes applied. pyiceberg is timed as installed, and with the range of a data file's row "
            "numbers it filters by its deletes built by numpy, as pyiceberg built it until 0.8 "
            "(apache/iceberg-python#1271: a Python range since), the rows checked the same.",
            "",
            f"{table['rows']:,} rows, then {table['epochs']} epochs of {table['keys_per_epoch']:,} upserts of keys "
            "spread uniformly, each committed as a row delta (a data file and a position delete file), up to the "
            "commit after which the default maintenance policy asks for a run (COMPACTION_DELETE_FILES_MIN=5, "
            "COMPACTION_DELETED_ROWS_RATIO=0.1, COMPACTION_MIN_FILES=5; COMPACTION_TARGET_FILE_BYTES="
            f"{table['target_file_bytes']:,}, the size of the table's files, so that they are not small). The run "
            "merges the delete files into one (no data file has a tenth of its rows deleted yet); then a compaction "
            "that applies every delete (every data file with a deleted row rewritten, the delete files dropped, one "
            "`replace` snapshot).",
            "",
            "| | data files | delete files | pyiceberg full scan (median, min-max) | pyiceberg, numpy's range "
            "| DuckDB full scan | change |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
            *(
                f"| {label} | {table[name]['data_files']} | {table[name]['delete_files']} "
                f"| {_cell(table[name]['scan_seconds'])} | {_cell(table[name]['numpy_range_scan_seconds'])} "
                f"| {_cell(table[name]['duckdb_scan_seconds'])} "
                f"| {_change(table[name]['change'])} |"
                for name, label in names.items()
            ),
            "",
            f"A commit of an epoch (resolved by the scan): {_cell(table['commit_seconds'])}.",
            "",
            f"**Before the run / after a compaction that applies every delete: {ratio:.2f} x with pyiceberg "
            f"({_verdict(ratio)}), {numpy_ratio:.2f} x with pyiceberg and numpy's range ({_verdict(numpy_ratio)}), "
            f"{duckdb_ratio:.2f} x with DuckDB ({_verdict(duckdb_ratio)})** (goal: at most {GOAL} x).",
            "",
        ]
    )


def _change(change: dict[str, Any] | None) -> str:
    if change is None:
        return ""
    return (
        f"{change['data_files_replaced']} data files rewritten into {change['data_files_written']}, "
        f"{change['delete_files_dropped']} delete files dropped, {change['delete_files_written']} written, "
        f"{change['seconds']:.2f} s"
    )


def _verdict(ratio: float) -> str:
    return "met" if ratio <= GOAL else "not met"


def _cell(seconds: dict[str, float]) -> str:
    return f"{seconds['median']:.3f} s ({seconds['min']:.3f}-{seconds['max']:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keyed_compaction", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a table of 100,000 rows, 2 repetitions")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of keyed_compaction.md and .json")
    args = parser.parse_args(argv)
    rows = 100_000 if args.quick else 1_000_000
    repetitions = 2 if args.quick else args.repetitions
    root = temp_root()
    try:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=(root / "warehouse").as_uri())
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "quick": args.quick,
            "repetitions": repetitions,
            "machine": machine_facts(None),
            "table": measure(IcebergGateway(catalog), rows, repetitions, seed=rows),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = render(results)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "keyed_compaction.md").write_text(report)
    (args.output / "keyed_compaction.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
