"""`python -m bench.key_resolution [--quick]`: what resolving an epoch's keys costs as the table grows, by scanning.

Resolving 10,000 keys (coordinator_service.tables.key_resolution.live_rows) on a keyed table of 100,000 rows and on
one of 1,000,000 rows (the same file size, so ten times the files), and committing an epoch of 10,000 upserts as a
row delta (resolve, position delete files, one snapshot) on each; ratios from the same run. Two kinds of keys:
spread uniformly over the table (every file holds some), and the newest ids (the files' id bounds prune the rest).

Writes bench/results/key_resolution.md and key_resolution.json. A pyiceberg SQL catalog on SQLite and local files:
the catalog is not what is measured.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from bench.infra import machine_facts, spread, temp_root
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_resolution import live_rows
from coordinator_service.tables.row_deltas import EpochChange, commit_row_delta

RESULTS = Path(__file__).resolve().parent / "results"
ROWS_PER_FILE = 50_000
KEYS = 10_000
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)


def build_table(gateway: IcebergGateway, identifier: str, rows: int) -> Table:
    """A keyed table of `rows` rows, ids 0.. in order, in files of ROWS_PER_FILE rows (one append each)."""
    gateway.ensure_table(identifier, SCHEMA, (), key=("id",))
    table = gateway.load(identifier)
    for first in range(0, rows, ROWS_PER_FILE):
        table.append(_rows(range(first, min(rows, first + ROWS_PER_FILE)), "v0"))
    return gateway.load(identifier)


def _rows(ids: range | list[int], tag: str) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {"id": ids, "customer": [f"{tag}-{i % 997}" for i in ids], "amount": [i * 0.5 for i in ids]}, schema=SCHEMA
    )


def timed(function: Callable[[], object], repetitions: int) -> list[float]:
    seconds = []
    for _ in range(repetitions):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(gateway: IcebergGateway, identifier: str, rows: int, repetitions: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    table = build_table(gateway, identifier, rows)
    built = time.perf_counter() - started
    chooser = random.Random(seed)
    uniform = [(key,) for key in chooser.sample(range(rows), KEYS)]
    newest = [(key,) for key in range(rows - KEYS, rows)]
    found = live_rows(table, uniform)
    assert len(found.positions) == KEYS, "every key is in the table once"
    result: dict[str, Any] = {
        "rows": rows,
        "files": -(-rows // ROWS_PER_FILE),
        "build_seconds": round(built, 1),
        "resolve_uniform_s": spread(timed(lambda: live_rows(table, uniform), repetitions)),
        "resolve_newest_s": spread(timed(lambda: live_rows(table, newest), repetitions)),
        "files_read_uniform": len(found.data_files),
        "files_read_newest": len(live_rows(table, newest).data_files),
    }
    commits = []
    for repetition in range(max(1, repetitions // 2)):
        keys = chooser.sample(range(rows), KEYS)
        path = f"{table.location()}/data/bench-{uuid.uuid4().hex}.parquet"
        pq.write_table(_rows(keys, f"v{repetition + 1}"), path.removeprefix("file://"))
        entries = gateway.read_data_files(identifier, [path], writer_id=0, evolve_schema=False).entries
        change = EpochChange(entries, pa.table({"id": pa.array(keys, pa.int64())}))
        table = gateway.load(identifier)
        started = time.perf_counter()
        committed = commit_row_delta(table, [change], {"bench": str(repetition)})
        commits.append(time.perf_counter() - started)
        assert committed.deleted_rows == KEYS, committed
    result["commit_upserts_s"] = spread(commits)
    return result


def render(results: dict[str, Any]) -> str:
    small, large = results["tables"]
    growth = large["rows"] / small["rows"]
    uniform_ratio = large["resolve_uniform_s"]["median"] / small["resolve_uniform_s"]["median"]
    lines = [
        "# Resolving keys by scanning the table (bench/key_resolution.py)",
        "",
        f"Run: {results['date']}, {'quick' if results['quick'] else 'full'}, {results['repetitions']} repetitions "
        f"(median (min-max)), {results['machine']['cores']} cores, {results['machine']['cpu_model']}, pyiceberg "
        f"{results['machine']['pyiceberg']}, pyarrow {results['machine']['pyarrow']}; files of "
        f"{ROWS_PER_FILE:,} rows; a SQL catalog on SQLite, local files.",
        "",
        f"| | {small['rows']:,} rows ({small['files']} files) | {large['rows']:,} rows ({large['files']} files) "
        "| ratio |",
        "|---|---|---|---|",
    ]
    for label, name in (
        (f"resolve {KEYS:,} keys spread uniformly (s)", "resolve_uniform_s"),
        (f"resolve the {KEYS:,} newest keys (s)", "resolve_newest_s"),
        (f"commit an epoch of {KEYS:,} upserts (s)", "commit_upserts_s"),
    ):
        a, b = small[name], large[name]
        lines.append(
            f"| {label} | {a['median']:.3f} ({a['min']:.3f}-{a['max']:.3f}) | {b['median']:.3f} "
            f"({b['min']:.3f}-{b['max']:.3f}) | {b['median'] / a['median']:.1f}x |"
        )
    lines += [
        f"| files read, uniform keys / newest keys | {small['files_read_uniform']} / {small['files_read_newest']} | "
        f"{large['files_read_uniform']} / {large['files_read_newest']} | |",
        "",
        f"A resolution by scan reads the key column of every file whose id bounds may hold a key. Keys spread over "
        f"the table are in every file, so the cost is O(table): {growth:.0f}x the rows took "
        f"{uniform_ratio:.1f}x the time here (a fixed part, planning and the set of {KEYS:,} keys, weighs more on "
        "the small table). Keys that arrive in id order (the newest ids) are pruned to the files that hold them by "
        "the files' bounds; what still grows is the planning (reading the manifests of more files). A key index "
        "(issue 29, not built yet) maps a key to its file and position without reading the table's files, so a "
        f"commit would cost O(epoch): {KEYS:,} lookups, however many rows the table holds.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.key_resolution", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tables of 20,000 and 200,000 rows, 2 repetitions")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of key_resolution.md and .json")
    args = parser.parse_args(argv)
    sizes = (20_000, 200_000) if args.quick else (100_000, 1_000_000)
    repetitions = 2 if args.quick else args.repetitions
    root = temp_root()
    try:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=(root / "warehouse").as_uri())
        gateway = IcebergGateway(catalog)
        tables = [measure(gateway, f"bench.keyed_{rows}", rows, repetitions, seed=rows) for rows in sizes]
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "quick": args.quick,
            "repetitions": repetitions,
            "machine": machine_facts(None),
            "tables": tables,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = render(results)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "key_resolution.md").write_text(report)
    (args.output / "key_resolution.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
