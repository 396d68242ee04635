"""python -m tests.torture.races --runs N [--seed S] [--kinds a,b]: the races of issue 23, then a report section.

Run i uses seed S+i and the kinds in turn; each run's result is one JSON line on stdout; the report's section goes
into bench/results/torture.md (--report), below the main harness's table, between its own markers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from coordinator_service.log.embedded import start_embedded_postgres, stop_embedded_postgres
from tests.torture.races import KINDS
from tests.torture.races.report import write_races
from tests.torture.races.run import race

DEFAULT_REPORT = Path("bench/results/torture.md")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture.races", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=len(KINDS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="Markdown report ('-': none)")
    args = parser.parse_args(argv)
    kinds = tuple(kind for kind in args.kinds.split(",") if kind)
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        parser.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="races-") as work:
        postgres_url = start_embedded_postgres(Path(work) / "postgres")
        try:
            for index in range(args.runs):
                kind = kinds[index % len(kinds)]
                result = asyncio.run(race(kind, first + index, postgres_url, Path(work)))
                results.append(result)
                print(json.dumps(result), flush=True)
                if result["anomalies"]:
                    print(f"ANOMALY: {result['replay']}\n  " + "\n  ".join(result["anomalies"]), file=sys.stderr)
        finally:
            stop_embedded_postgres(Path(work) / "postgres")
    wall = time.monotonic() - started
    if str(args.report) != "-":
        write_races(args.report, results, "python -m tests.torture.races " + " ".join(argv), wall)
    failed = sum(1 for result in results if result["anomalies"])
    print(f"{len(results)} runs in {wall:.0f} s, {failed} with anomalies", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
