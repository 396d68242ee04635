"""The torture report: per fault, the runs, the anomalies and the recovery time, as Markdown and JSON.

Each run's result (RunResult) is one JSON line with the command that replays
it (replay_command); the report is written from those lines.
"""

from __future__ import annotations

import platform
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.torture.fault_kinds import FAULTS
from tests.torture.faults import FaultRecord

KEEP_MARKER = "<!-- everything below this line is kept when the report is rewritten -->"
UPSERT_BEGIN = "<!-- upsert: rewritten by python -m tests.torture --mode upsert -->"
UPSERT_END = "<!-- /upsert -->"


@dataclass
class RunResult:
    seed: int
    faults: list[FaultRecord]
    anomalies: list[str]
    notes: list[str]
    facts: dict[str, Any]
    seconds: float
    work: Path

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "faults": [record.as_json() for record in self.faults],
            "anomalies": self.anomalies,
            "notes": self.notes,
            "facts": self.facts,
            "seconds": round(self.seconds, 2),
            "work": str(self.work),
        }


def replay_command(seed: int, pool: tuple[str, ...], faults_per_run: int | None = None, upsert: bool = False) -> str:
    faults = "" if set(pool) == set(FAULTS) else f" --faults {','.join(pool)}"
    faults += "" if faults_per_run is None else f" --faults-per-run {faults_per_run}"
    return f"python -m tests.torture{' --mode upsert' if upsert else ''} --seed {seed}{faults}"


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return float(statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1])


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for fault in FAULTS:
        runs = [r for r in results if any(f["fault"] == fault for f in r["faults"])]
        if not runs:
            continue
        records = [f for r in runs for f in r["faults"] if f["fault"] == fault]
        recoveries = [f["recovery_seconds"] for f in records if f["recovery_seconds"] is not None]
        rows.append(
            {
                "fault": fault,
                "runs": len(runs),
                "fired": sum(1 for f in records if f["triggered"]),
                "anomalies": sum(len(r["anomalies"]) for r in runs),
                "recovery_p50": percentile(recoveries, 50),
                "recovery_p99": percentile(recoveries, 99),
            }
        )
    return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _batch_line(results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> str:
    failed = [r for r in results if r["anomalies"]]
    return (
        f"`{command}`: {len(results)} runs in {wall_seconds / 60:.1f} min "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node() or 'host'}, "
        f"{platform.python_version()}), {len(failed)} with anomalies, "
        f"{sum(len(r['anomalies']) for r in results)} anomalies in all."
    )


def markdown(results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> str:
    lines = [
        "# Torture runs: exactly-once under faults",
        "",
        _batch_line(results, command, wall_seconds),
        "",
        "Each run: a real coordinator process, PostgreSQL (embedded; the metastore and the SQL catalog in two "
        "servers), a Kafka-protocol broker and a Spark streaming job (`sink-writer --available-now`, "
        "`local[2]`, a driver subprocess), 300-1,000 keyed records in 6-10 micro-batches, one fault (two in "
        "about a third of the runs) at a random moment; `many_sinks` and `resend_aborted` add sinks written "
        "through the protocol beside the Spark job, and `fan_out` sinks that each write several tables (one "
        "added mid-stream), the coordinator killing itself between two tables' appends in most runs. "
        "`fired`: how many of the planned faults happened "
        "(a fault planned after the job drained, or a failpoint never hit that often, does not fire). "
        "Recovery: from the fault's end (the kill; the restart of what the harness restarts; SIGCONT; the "
        "end of the outage) to the next commit progress (`sinks.committed_epoch` moving), or, when nothing "
        "was left to commit, to the settled state.",
        "",
        *_summary(results, "##"),
    ]
    return "\n".join(lines) + "\n"


def upsert_section(results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> str:
    """The upsert runs' section (tests/torture/upserts.py), between its markers."""
    facts = Counter[str]()
    for result in results:
        facts.update({k: v for k, v in result["facts"].items() if k.startswith(("upsert_", "read", "model_keys"))})
        facts["position_delete_files"] += int(result["facts"].get("position_delete_files", 0))
    equal = sum(
        1
        for result in results
        if "model_keys" in result["facts"]
        and not any(anomaly.startswith(("pyiceberg reads", "DuckDB reads")) for anomaly in result["anomalies"])
    )
    lines = [
        UPSERT_BEGIN,
        "## Upsert streams under every fault (issue 29)",
        "",
        _batch_line(results, command, wall_seconds),
        "",
        "Each run as above, but its stream an upsert stream (`sink-writer --mode upsert --key id`, tests/torture/"
        "upserts.py): 300-1,000 random inserts, updates and deletes (tombstones) of 15-333 overlapping keys, 5-35 % "
        "of them deletes, every record of a key in one partition, the table partitioned by a column keys move "
        "across in half of the runs; the records a fault produces (a load at `latest`, a topic's second life, the "
        "good records around bad ones) are the stream's next changes. Checked, beside the plain runs' checks of "
        "the log, the files and the verifier: every record that had to be read lies in a committed batch's range, "
        "and the table read by pyiceberg and by DuckDB is the model (the last value of each key among the records "
        "of the committed ranges the topic still held, deleted keys absent), no key twice, no equality delete in "
        "any snapshot or metadata file the table has. Every fault kind is drawn; `bad_records` draws its `fail` and "
        "`dead-letter` policies only (a keyed stream refuses `null`, which would write a row without its key). In the "
        'faults\' details below, a record "missing" or "read once" is one left out of, or taken into, the model the '
        "table equals.",
        "",
        f"In all: {facts['upsert_records']} records produced ({facts['upsert_deletes']} deletes), "
        f"{facts['read']} read in committed ranges, {facts['model_keys']} live keys in the models; {equal} of "
        f"{len(results)} tables equal to their model by both readers; {facts['position_delete_files']} live "
        "position delete files at the end.",
        "",
        *_summary(results, "###"),
        UPSERT_END,
    ]
    return "\n".join(lines)


def _summary(results: Sequence[dict[str, Any]], heading: str) -> list[str]:
    """The table per fault, the failpoints, the faults' details, the run times and the runs with anomalies."""
    rows = summarize(results)
    failed = [r for r in results if r["anomalies"]]
    lines = [
        "| fault | runs | fired | anomalies | recovery p50 (s) | recovery p99 (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['fault']} | {row['runs']} | {row['fired']} | {row['anomalies']} | "
            f"{_seconds(row['recovery_p50'])} | {_seconds(row['recovery_p99'])} |"
        )
    points: dict[str, list[int]] = {}
    for result in results:
        for fault in result["faults"]:
            if fault["fault"] in ("coordinator_failpoint", "maintenance_kill"):
                counts = points.setdefault(fault["plan"]["params"]["failpoint"], [0, 0])
                counts[0] += 1
                counts[1] += int(fault["triggered"])
    if points:
        lines += [
            "",
            "Coordinator and maintenance failpoints (planned/fired, `kill@N`): "
            + ", ".join(f"`{name}` {planned}/{fired}" for name, (planned, fired) in sorted(points.items()))
            + ".",
        ]
    details = _details(results)
    if details:
        lines += ["", *details]
    durations = [r["seconds"] for r in results]
    if durations:
        lines += [
            "",
            f"Run time: p50 {percentile(durations, 50) or 0:.1f} s, max {max(durations):.1f} s; "
            f"driver starts per run: p50 {statistics.median(r['facts'].get('driver_starts', 0) for r in results):g}, "
            f"max {max(r['facts'].get('driver_starts', 0) for r in results)}.",
        ]
    if failed:
        lines += ["", f"{heading} Runs with anomalies", ""]
        for result in failed:
            lines.append(f"* seed {result['seed']} (`{result['replay']}`):")
            lines += [f"  * {anomaly.splitlines()[0][:400]}" for anomaly in result["anomalies"]]
    return lines


def _details(results: Sequence[dict[str, Any]]) -> list[str]:
    """What the operator and deployment faults did, beyond fired or not."""

    def fired(kind: str) -> list[dict[str, Any]]:
        return [f for r in results for f in r["faults"] if f["fault"] == kind and f["triggered"]]

    lines = []
    if aborts := fired("operator_abort"):
        forced = [f for f in aborts if f.get("force")]
        answers = Counter((bool(f.get("force")), f.get("status")) for f in aborts)
        statuses = ", ".join(
            f"{'forced' if force else 'without force'} {code}: {count}"
            for (force, code), count in sorted(answers.items(), key=str)
        )
        lost = sum(r["facts"].get("lost_by_operator_abort", 0) for r in results)
        lines.append(
            f"* operator_abort: {len(aborts)} aborts ({len(forced)} forced; answers {statuses}); "
            f"{lost} records lost by design (batches force-aborted after Spark checkpointed them), all of them "
            "and only them missing."
        )
    if resets := fired("operator_reset"):
        aborted = sum(len(f.get("aborted", [])) for f in resets)
        lines.append(f"* operator_reset: {len(resets)} resets, {aborted} PENDING epochs aborted by them.")
    if kills := fired("lock_kill"):
        lines.append(f"* lock_kill: {sum(f.get('terminated', 0) for f in kills)} commit-lock connections terminated.")
    if many := fired("many_sinks"):
        sinks = [int(f.get("sinks", 0)) for f in many]
        lines.append(f"* many_sinks: {min(sinks)}-{max(sinks)} sinks per run.")
    if resends := fired("resend_aborted"):
        later = sum(1 for f in resends if f.get("after_cleanup"))
        rewritten = sum(1 for f in resends if f.get("rewritten"))
        lines.append(
            f"* resend_aborted: {len(resends)} re-sent epochs, {later} after the cleaner deleted the files "
            f"({rewritten} written again under the same names first)."
        )
    if outages := fired("outage_then_idle"):
        pending = sum(1 for f in outages if f.get("report_pending"))
        long = sum(1 for f in outages if f["plan"]["params"]["downtime_seconds"] > 25)
        lines.append(
            f"* outage_then_idle: {len(outages)} outages ({long} longer than the writer's 25 s retry window); "
            f"{pending} caught the last batch's report not yet recorded."
        )
    if restarts := fired("broker_restart"):
        lost = sum(int(f.get("broker_lost", 0)) for f in restarts)
        lines.append(
            f"* broker_restart: {len(restarts)} broker restarts mid-read; the broker itself lost {lost} records "
            f"it had acknowledged (checked by reading the topic back; the table is held to what it keeps)."
        )
    if retentions := fired("retention_before_rerun"):
        deleted = sum(int(f.get("deleted", 0)) for f in retentions)
        checked = [f for f in retentions if "files_kept" in f]
        kept = sum(1 for f in checked if len(set(str(f["files_kept"]).split("/"))) == 1)
        operator = sum(1 for f in retentions if f.get("aborted_by") == "OPERATOR")
        lines.append(
            f"* retention_before_rerun: {len(retentions)} batches cut by retention before their re-run, {deleted} "
            f"records deleted; each re-run failed with the data-loss error first, then (failOnDataLoss=false) "
            f"skipped exactly those; the attempt aborted by recovery still had its files at the re-run in "
            f"{kept} of {len(checked)} ({operator} more were aborted by the operator, who gives their files up)."
        )
    if bad := fired("bad_records"):
        policies = Counter(f"{f['plan']['params']['policy']}->{f.get('final_policy')}" for f in bad)
        counted = sum(int(f.get("counted", 0)) for f in bad)
        letters = sum(int(f.get("dead_letters", 0)) for f in bad)
        lines.append(
            f"* bad_records: {len(bad)} runs ({', '.join(f'{k}: {v}' for k, v in sorted(policies.items()))}), "
            f"{counted} bad records counted once in the committed epochs, {letters} dead letters read back."
        )
    if latest := [r for r in results if any(f["fault"] == "latest_under_load" for f in r["faults"])]:
        skipped = sum(int(r["facts"].get("before_start", 0)) for r in latest)
        lines.append(
            f"* latest_under_load: {len(latest)} runs; {skipped} records produced before the resolved start "
            "(not read, by design), every later one once."
        )
    if recreated := fired("topic_recreated"):
        unread = sum(
            int(r["facts"].get("lost_with_topic", 0))
            for r in results
            if any(f["fault"] == "topic_recreated" and f["triggered"] for f in r["faults"])
        )
        second = sum(int(f.get("second_life", 0)) for f in recreated)
        lines.append(
            f"* topic_recreated: {len(recreated)} topics deleted mid-stream; each job failed with the data-loss "
            f"error, then (failOnDataLoss=false) ran a batch without the topic; {unread} records went with the "
            f"deleted topic unread; all {second} records of the topics' second lives were read from their start, once."
        )
    return lines


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the report's section between `begin` and `end` (the lines `section` starts and ends with), or add it
    at the end; the rest of the report stays as it is."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def write(path: Path, results: Sequence[dict[str, Any]], command: str, wall_seconds: float) -> None:
    kept = ""
    if path.exists():
        text = path.read_text()
        if KEEP_MARKER in text:
            kept = text[text.index(KEEP_MARKER) :]
    path.parent.mkdir(parents=True, exist_ok=True)
    body = markdown(results, command, wall_seconds)
    path.write_text(body + ("\n" + kept if kept else f"\n{KEEP_MARKER}\n"))
