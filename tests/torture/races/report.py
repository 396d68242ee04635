"""The races' section of the torture report: per kind, runs, anomalies, what the actors did."""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.torture.races import KINDS
from tests.torture.report import write_section

BEGIN, END = "<!-- races: rewritten by python -m tests.torture.races -->", "<!-- /races -->"


def section(results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> str:
    failed = [result for result in results if result["anomalies"]]
    lines = [
        BEGIN,
        "## Races of the coordinator's own paths (issue 23)",
        "",
        f"`{command}`: {len(results)} runs in {wall_seconds / 60:.1f} min ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node() or 'host'}, {platform.python_version()}), {len(failed)} with anomalies. In one process: "
        "a real PostgreSQL and SQL catalog, the coordinator's runtime with its background work running, actors at "
        "random moments from each run's seed (tests/torture/races/).",
        "",
        "| kind | runs | anomalies | epochs | run time p50 (s) | what happened (sums) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for kind in KINDS:
        runs = [result for result in results if result["kind"] == kind]
        if not runs:
            continue
        facts: Counter[str] = Counter()
        for result in runs:
            facts.update(result["facts"])
        seconds = sorted(result["seconds"] for result in runs)
        lines.append(
            f"| {kind} | {len(runs)} | {sum(len(result['anomalies']) for result in runs)} | "
            f"{sum(result['epochs'] for result in runs)} | {seconds[len(seconds) // 2]:.1f} | "
            + ", ".join(f"{name}: {count}" for name, count in sorted(facts.items()) if count)
            + " |"
        )
    for result in failed:
        lines += ["", f"* `{result['replay']}`:", *(f"  * {anomaly}" for anomaly in result["anomalies"])]
    return "\n".join([*lines, END])


def write_races(path: Path, results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> None:
    write_section(path, BEGIN, END, section(results, command, wall_seconds))
