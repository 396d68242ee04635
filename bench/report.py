"""latest.md from the results of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPTIMISATIONS = Path(__file__).resolve().parent / "OPTIMISATIONS.md"


def _f(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _spread(cell: dict[str, float], digits: int = 0) -> str:
    return f"{_f(cell['median'], digits)} ({_f(cell['min'], digits)}-{_f(cell['max'], digits)})"


def _goal(ok: bool) -> str:
    return "met" if ok else "NOT met"


def render(results: dict[str, Any]) -> str:
    lines: list[str] = ["# sink-coordinator benchmarks", ""]
    machine = results["machine"]
    lines += [
        f"Run: {'--quick' if results.get('quick') else 'full'}, parts {results.get('parts')}, "
        f"{_f(results.get('wall_seconds', 0), 0)} s wall.",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPU | {machine['cpu_model']} |",
        f"| cores / RAM | {machine['cores']} / {machine['ram_gib']} GiB |",
        f"| Python | {machine['python']} |",
        f"| PostgreSQL | {machine.get('postgresql', '?')} {machine.get('postgresql_settings', '')} |",
        f"| pyiceberg / PySpark / grpcio / psycopg / pyarrow | {machine['pyiceberg']} / {machine['pyspark']} / "
        f"{machine['grpcio']} / {machine['psycopg']} / {machine['pyarrow']} |",
        "",
        "Cells are medians over repetitions with (min-max) beside them; latencies are per-request p50/p99 "
        "measured by the client. The machine is shared and noisy: compare ratios, not absolute figures.",
        "",
    ]
    if "precommit" in results:
        lines += _precommit(results["precommit"])
    if "commit" in results:
        lines += _commit(results["commit"], results.get("coalescing"))
    if "e2e" in results:
        lines += _e2e(
            results["e2e"],
            "## 3. End to end: Kafka → Spark → Iceberg, records/s, coordinated vs plain foreachBatch + "
            "pyiceberg append",
        )
    if "recovery" in results:
        lines += _recovery(results["recovery"])
    if "scale" in results:
        lines += _scale(results["scale"], results)
    if "fairness" in results:
        lines += _fairness(results["fairness"])
    if "soak" in results:
        lines += _soak(results["soak"])
    if "soak_defaults" in results:
        lines += _soak_defaults(results["soak_defaults"])
    if "object_storage" in results:
        lines += _object_storage(results["object_storage"])
    if "e2e_cluster_s3" in results:
        lines += _e2e(
            results["e2e_cluster_s3"],
            "## 9. End to end where tables live: a Spark standalone cluster, S3 and a REST catalog (SeaweedFS), "
            "records/s",
        )
    if "console" in results:
        lines += _console(results["console"])
    if "metrics_scrape" in results:
        lines += _metrics_scrape(results["metrics_scrape"])
    if "profiles" in results:
        lines += ["## Profiles (py-spy, share of samples in which a function is on the stack)", ""]
        for name, frames in results["profiles"].items():
            lines += [f"{name}: " + ", ".join(f"{label} {share:.0%}" for label, share in frames[:8]), ""]
    if OPTIMISATIONS.exists():
        lines += [OPTIMISATIONS.read_text().strip(), ""]
    return "\n".join(lines) + "\n"


def _precommit(part: dict[str, Any]) -> list[str]:
    lines = [
        "## 1. Pre-commit path (PreCommit over gRPC until PERSISTED) vs raw INSERT … COMMIT",
        "",
        f"{part['seconds_per_cell']} s per cell, {part['repetitions']} repetitions, interleaved with the raw "
        "baseline. Goal: rate ≥ 0.5 x raw at every concurrency; p99 < 10 ms at 8 writers.",
        "",
        "| epochs | sinks | writers | PreCommit/s | raw commits/s | ratio | p50 ms | p99 ms | raw p50/p99 ms | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in part["coordinator"]:
        raw = part["raw"][str(cell["concurrency"])]
        ratio = cell["rate"]["median"] / raw["rate"]["median"]
        ok = ratio >= 0.5 and (cell["concurrency"] != 8 or cell["p99_ms"]["median"] < 10)
        lines.append(
            f"| {cell['mode'].replace('_', ' ')} | {cell['sinks']} | {cell['concurrency']} | {_spread(cell['rate'])} | "
            f"{_spread(raw['rate'])} | {ratio:.2f} | {_f(cell['p50_ms']['median'], 1)} | "
            f"{_spread(cell['p99_ms'], 1)} | {_f(raw['p50_ms']['median'], 1)} / {_f(raw['p99_ms']['median'], 1)} | "
            f"{_goal(ok)} |"
        )
        if cell["errors"]:
            lines.append(f"| | | | errors: {cell['errors']} {cell['first_errors']} | | | | | | |")
    return [*lines, ""]


def _commit(part: dict[str, Any], coalescing: dict[str, Any] | None) -> list[str]:
    coordinator, raw = part["coordinator"], part["raw"]
    lines = [
        "## 2. Commit path: CommitCheckpoint(wait=True) until COMMITTED vs raw pyiceberg fast append",
        "",
        f"{part['commits']} commits of one 100-row file each, interleaved. Goal: ≤ 1.2 x raw at p50.",
        "",
        "| | p50 ms | p99 ms | first 10 % p50 | last 10 % p50 |",
        "|---|---|---|---|---|",
        f"| coordinator | {_f(coordinator['p50_ms'], 1)} | {_f(coordinator['p99_ms'], 1)} | "
        f"{_f(part['coordinator_first_tenth']['p50_ms'], 1)} | {_f(part['coordinator_last_tenth']['p50_ms'], 1)} |",
        f"| raw load + fast append | {_f(raw['p50_ms'], 1)} | {_f(raw['p99_ms'], 1)} | "
        f"{_f(part['raw_first_tenth']['p50_ms'], 1)} | {_f(part['raw_last_tenth']['p50_ms'], 1)} |",
        "",
        f"Ratio at p50: **{part['ratio_p50']:.2f}** — goal {_goal(part['ratio_p50'] <= 1.2)}.",
        "",
    ]
    if coalescing:
        lines += [
            f"Coalescing (COMMIT_INTERVAL_SECONDS={coalescing['interval_seconds']}, "
            f"COMMIT_MAX_EPOCHS={coalescing['max_epochs']}): epochs offered vs snapshots written.",
            "",
            "| epochs/s offered | epochs | snapshots | snapshots/s | epochs per snapshot |",
            "|---|---|---|---|---|",
        ]
        for row in coalescing["rows"]:
            lines.append(
                f"| {_f(row['offered_epochs_per_s'], 1)} | {row['epochs']} | {row['snapshots']} | "
                f"{_f(row['snapshots_per_s'], 2)} | {_f(row['epochs_per_snapshot'], 1)} |"
            )
        lines.append("")
    return lines


def _e2e(part: dict[str, Any], title: str) -> list[str]:
    lines = [
        title,
        "",
        "Goals: ≥ 0.9 x the plain job; ≥ 0.5 x the raw read rate of the same topic (a confluent-kafka consumer "
        "and pyarrow's JSON parse of the same columns, no Spark: bench/source_limit.py).",
        "",
        "| partitions | records | batches | raw read rec/s | coordinated rec/s | plain rec/s | ratio to plain | goal "
        "| ratio to raw read | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in part["rows"]:
        to_raw = row.get("ratio_to_raw")
        lines.append(
            f"| {row['partitions']} | {row['records']:,} | {row['batches']} | "
            + (_spread(row["raw_rps"]) if "raw_rps" in row else "")
            + f" | {_spread(row['coordinated_rps'])} | {_spread(row['plain_rps'])} | {_spread(row['ratio'], 2)} | "
            f"{_goal(row['ratio']['median'] >= 0.9)} | "
            + (f"{_spread(to_raw, 2)} | {_goal(to_raw['median'] >= 0.5)} |" if to_raw else " | |")
        )
    fresh = part.get("freshness")
    if fresh:
        lines += [
            "",
            f"Freshness, produce → visible in the table: {fresh['records']:,} records sent at {fresh['rate']:,}/s "
            f"for {fresh['seconds']} s over 4 partitions, the coordinated query on a 1 s trigger.",
            "",
            "| p50 ms | p99 ms | max ms |",
            "|---|---|---|",
            f"| {_f(fresh['p50_ms'], 0)} | {_f(fresh['p99_ms'], 0)} | {_f(fresh['max_ms'], 0)} |",
        ]
    return [*lines, ""]


def _recovery(part: dict[str, Any]) -> list[str]:
    ready = part["ready_s"]
    return [
        "## 4. Recovery: restart until gRPC SERVING and the backlog committed",
        "",
        f"{part['sinks']:,} sinks on {part['tables']} tables, {part['rows']:,} rows in the log, "
        f"{part['pending_rows']:,} PENDING at or below the checkpoint ({part['file_sinks']} sinks with one file "
        "per pending epoch, the rest empty). Goal: ready < 3 s.",
        "",
        "| SERVING s | backlog committed (ready) s | goal |",
        "|---|---|---|",
        f"| {_spread(part['serving_s'], 2)} | {_spread(ready, 2)} | {_goal(ready['median'] < 3.0)} |",
        "",
    ]


def _console(part: dict[str, Any]) -> list[str]:
    page, api, paint = part["page"], part["api"], part.get("first_paint")
    # The first render is the browser's first contentful paint; without Chromium, the page's fetch stands in.
    painted = (
        f"| first contentful paint in headless Chromium | {_f(paint['p50_ms'])} | {_f(paint['p99_ms'])} | "
        f"{_goal(paint['p50_ms'] < 300)} |"
        if paint
        else "| first contentful paint | no Chromium on this machine: the fetch is judged | | |"
    )
    return [
        f"## 10. The console: the sink list of {part['sinks']:,} sinks",
        "",
        f"GET /console: every sink read, filtered and sorted, the first {part['page_rows']} shown "
        f"({part['page_bytes'] / 1024:,.0f} KiB of HTML), beside GET /api/v1/sinks (every sink as JSON), "
        f"interleaved, {page['n']} loads each after a warm-up; then fresh loads in headless Chromium. Goal: first "
        "render (the browser's first contentful paint) < 300 ms at p50.",
        "",
        "| | p50 ms | p99 ms | goal |",
        "|---|---|---|---|",
        f"| GET /console | {_f(page['p50_ms'])} | {_f(page['p99_ms'])} | "
        f"{'' if paint else _goal(page['p50_ms'] < 300)} |",
        f"| GET /api/v1/sinks (baseline) | {_f(api['p50_ms'])} | {_f(api['p99_ms'])} | |",
        painted,
        "",
        f"Page / API at p50: **{part['ratio_p50']:.2f}**.",
        "",
    ]


def _metrics_scrape(part: dict[str, Any]) -> list[str]:
    rows = [
        ("per-sink histograms (before)", part["before"]),
        ("histograms aggregated, the log reporter (after)", part["after"]),
        ("a second replica (after: no log gauges)", part["second_replica"]),
    ]
    lines = [
        f"## 11. The /metrics scrape at {part['sinks']:,} sinks",
        "",
        "Each sink pre-committed and committed an epoch through the scraped process; every scrape reads the "
        f"metastore; {part['scrapes']} scrapes per row after a warm-up, /healthz asked every 20 ms meanwhile. "
        "Issue 27 measured 70,675 series, 5 MB and up to 0.9 s a scrape at 1,502 sinks, on every replica.",
        "",
        "| scrape | bytes | series | per-sink histogram series | p50 ms | max ms | /healthz max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, cell in rows:
        lines.append(
            f"| {label} | {cell['bytes']:,} | {cell['series']:,} | {cell['per_sink_histogram_series']:,} | "
            f"{_f(cell['scrape']['p50_ms'])} | {_f(cell['scrape']['max_ms'])} | "
            f"{_f(cell['healthz_during_scrapes']['max_ms'])} |"
        )
    lines += [
        "",
        f"After / before, one replica: bytes **{part['bytes_ratio']:.2f}**, series **{part['series_ratio']:.2f}**, "
        f"scrape time at p50 **{part['time_ratio_p50']:.2f}**; two replicas that both serve every sink (before: "
        "each exported everything; after: the second one all but the log's gauges): "
        f"bytes **{part['fleet_bytes_ratio']:.2f}**, series **{part['fleet_series_ratio']:.2f}**.",
        "",
    ]
    return lines


def _object_storage(part: dict[str, Any]) -> list[str]:
    delay = part["delay_ms_each_way"]
    lines = [
        "## 8. Pre-commit on far object storage",
        "",
        f"S3 (SeaweedFS) behind a TCP proxy adding {_f(delay)} ms each way to every exchange; 10-row files "
        f"written beforehand; {part['epochs_per_cell']} epochs per cell, the footer modes alternating: read by the "
        "coordinator, sent (a HEAD per file), listed (sent, the files in the epoch's directory, which the "
        "coordinator lists once: the Spark writer's way on an object store).",
        "",
        "Baseline: the same files' HEAD requests from the benchmark through the same proxy, as many at a time "
        "as the coordinator makes them, before each epoch with footers sent.",
        "",
        "| files | footers | PreCommit p50 / p99 ms | baseline HEADs p50 ms | PreCommit / baseline | "
        "CommitCheckpoint(wait) p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    p50 = {(row["files"], row["footers"]): row["precommit"]["p50_ms"] for row in part["rows"]}
    for row in part["rows"]:
        baseline = row.get("baseline_heads")
        lines.append(
            f"| {row['files']} | {row['footers']} | "
            f"{_f(row['precommit']['p50_ms'], 1)} / {_f(row['precommit']['p99_ms'], 1)} | "
            + (
                f"{_f(baseline['p50_ms'], 1)} | {row['precommit']['p50_ms'] / baseline['p50_ms']:.2f} | "
                if baseline
                else "| | "
            )
            + f"{_f(row['commit']['p50_ms'], 1)} / {_f(row['commit']['p99_ms'], 1)} |"
        )
    most, fewest = max(files for files, _ in p50), min(files for files, _ in p50)
    lines.append("")
    for mode in ("listed", "sent", "read"):
        if (most, mode) in p50 and (fewest, mode) in p50:
            ratio = p50[(most, mode)] / p50[(fewest, mode)]
            goal = f" (goal ≤ 2: {_goal(ratio <= 2)})" if mode == "listed" else ""
            lines.append(f"* footers {mode}: PreCommit p50 of {most} files = {ratio:.2f} x that of {fewest}{goal}.")
    heads = {row["files"]: row["baseline_heads"]["p50_ms"] for row in part["rows"] if "baseline_heads" in row}
    if most in heads and fewest in heads:
        lines.append(
            f"* the baseline's own growth: {most} files' HEADs = {heads[most] / heads[fewest]:.2f} x one file's; "
            f"what PreCommit (footers sent) adds to them: {p50[(most, 'sent')] / heads[most]:.2f} x at {most} files."
        )
    lines.append("")
    return lines


def _scale(part: dict[str, Any], results: dict[str, Any]) -> list[str]:
    lines = [
        "## 5. Scale",
        "",
        "Files per epoch (one writer, 10-row files on the local file system; footers read by the coordinator, "
        "or sent by the writer with the paths and checked with one metadata request per file):",
        "",
        "| files | footers | PreCommit p50 / p99 ms | CommitCheckpoint(wait) p50 / p99 ms |",
        "|---|---|---|---|",
    ]
    for row in part["files_per_epoch"]:
        lines.append(
            f"| {row['files']} | {row['footers']} | "
            f"{_f(row['precommit']['p50_ms'], 1)} / {_f(row['precommit']['p99_ms'], 1)} | "
            f"{_f(row['commit']['p50_ms'], 1)} / {_f(row['commit']['p99_ms'], 1)} |"
        )
    lines.append("")
    if "big_log" in part and "precommit" in results:
        small = {
            c["concurrency"]: c
            for c in results["precommit"]["coordinator"]
            if c["mode"] == "one_file" and c["sinks"] == 1
        }
        big = part["big_log"]
        recovery = results.get("recovery", {})
        lines += [
            f"Log size (one-file pre-commits of one sink; big log = {recovery.get('sinks', '?'):,} sinks, "
            f"{recovery.get('rows', '?'):,} rows):",
            "",
            "| log | writers | PreCommit/s | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
        ]
        for concurrency, key in ((1, "c1"), (8, "c8")):
            if concurrency in small:
                cell = small[concurrency]
                lines.append(
                    f"| part 1 (1 sink) | {concurrency} | {_f(cell['rate']['median'])} | "
                    f"{_f(cell['p50_ms']['median'], 1)} | {_f(cell['p99_ms']['median'], 1)} |"
                )
            lines.append(
                f"| big | {concurrency} | {_f(big[key]['rate'])} | {_f(big[key]['p50_ms'], 1)} | "
                f"{_f(big[key]['p99_ms'], 1)} |"
            )
        lines.append("")
    commit = results.get("commit")
    if commit:
        lines += [
            "Table history: the commit path's p50 over its first and last 10 % of commits is in part 2 (the metadata "
            "file and its snapshot list grow with every commit, for the coordinator and the raw append alike).",
            "",
        ]
    return lines


def _fairness(part: dict[str, Any]) -> list[str]:
    alone, crowd = part["alone"], part["crowd"]
    lines = [
        "## 6. Fairness: many busy sinks, few commit slots",
        "",
        f"{crowd['sinks']} sinks, a one-file epoch each every {crowd['batch_seconds']:g} s for {crowd['seconds']:g} s, "
        f"COMMIT_CONCURRENCY={crowd['concurrency']}, COMMIT_INTERVAL_SECONDS={crowd['interval_seconds']:g}. "
        "Latency: from an epoch's CommitCheckpoint to the commit of the snapshot that holds it. Baseline: one "
        "sink alone on the same settings, in the same run. Goal: every sink bounded (worst sink's p99 within "
        "2 x the baseline's).",
        "",
        "| | sinks | epochs | p50 ms (median sink) | p99 ms: median sink | p99 ms: worst sink | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, cell in (("alone (baseline)", alone), ("crowd", crowd)):
        lines.append(
            f"| {label} | {cell['sinks']} | {cell['epochs']:,} | {_f(cell['sink_p50_ms_median'])} | "
            f"{_f(cell['sink_p99_ms']['median'])} | {_f(cell['sink_p99_ms']['max'])} | "
            f"{_f(cell['worst_sink_max_ms'])} |"
        )
    ratio = part["ratio_worst_p99_to_alone_p99"]
    lines += ["", f"Worst sink's p99 / baseline p99: **{ratio:.2f}** — goal {_goal(ratio <= 2.0)}.", ""]
    return lines


def _soak_defaults(part: dict[str, Any]) -> list[str]:
    settings = ", ".join(f"{key.removeprefix('SINK_COORDINATOR_')}={value}" for key, value in part["settings"].items())
    lines = [
        "## 12. Soak at the default settings, a commit per epoch",
        "",
        f"{part['commits']:,} commits of one {part['rows_per_file']}-row file each, every setting at its default but "
        f"{settings} ({part['wall_seconds']:,.0f} s in all): maintenance's own clock (300 s) is far too slow for "
        "this rate, so only the commits' triggers (a commit past SNAPSHOT_MAX_COUNT=500 snapshots, or leaving "
        "enough small files to compact) keep the table within its bounds. Goal: the snapshots never pass the bound "
        "by more than what commits while a run works, and the p50 levels off.",
        "",
        "| commits | p50 ms | p99 ms | snapshots | manifests | live data files |",
        "|---|---|---|---|---|---|",
    ]
    for window in part["windows"]:
        lines.append(
            f"| {window['commits']:,} | {_f(window['p50_ms'], 1)} | {_f(window['p99_ms'], 1)} | "
            f"{window['snapshots']:,} | {window['manifests']:,} | {window['data_files']:,} |"
        )
    lines += [
        "",
        f"Most snapshots at a window's end: **{part['max_snapshots']:,}**; p50 of the last window / the first: "
        f"{part['p50_last_over_first_window']:.2f}.",
        "",
    ]
    return lines


def _soak(part: dict[str, Any]) -> list[str]:
    ours, raw = part["coordinator"], part["raw"]
    settings = ", ".join(
        f"{key.removeprefix('SINK_COORDINATOR_')}={value}" for key, value in part["maintenance"].items()
    )
    lines = [
        "## 7. Soak: a table that takes a commit every second for months, with maintenance",
        "",
        f"{part['commits']:,} commits of one {part['rows_per_file']}-row file each through the coordinator "
        f"(CommitCheckpoint(wait) until COMMITTED), its maintenance on and scheduled tightly "
        f"({settings}), "
        f"beside {part['raw_commits']:,} raw pyiceberg fast appends with no maintenance, interleaved with the first "
        f"of ours ({part['wall_seconds']:,.0f} s in all). Goal: our last 10 % p50 ≤ 1.2 x our first 10 % (flat).",
        "",
        "| | commits | p50 ms, first 10 % | p50 ms, last 10 % | last / first |",
        "|---|---|---|---|---|",
    ]
    for label, cell in (("coordinator, maintenance on", ours), ("raw pyiceberg, no maintenance", raw)):
        lines.append(
            f"| {label} | {cell['commits']:,} | {_f(cell['first_tenth']['p50_ms'], 1)} | "
            f"{_f(cell['last_tenth']['p50_ms'], 1)} | {cell['ratio']:.2f} |"
        )
    lines += [
        "",
        f"Ours: **{ours['ratio']:.2f}** — goal {_goal(ours['ratio'] <= 1.2)}; raw: {raw['ratio']:.2f} after only "
        f"{raw['commits']:,} commits.",
        "",
        "| at the end | metadata.json | snapshots | manifests | live data files | rows |",
        "|---|---|---|---|---|---|",
    ]
    for label, shape in (
        ("maintained table", part["table"]),
        ("raw table", part["raw_table"]),
        ("uncompacted twin", part["twin_table"]),
    ):
        lines.append(
            f"| {label} | {shape['metadata_json_bytes'] / 1024:,.0f} KiB | {shape['snapshots']:,} | "
            f"{shape['manifests']:,} | {shape['data_files']:,} | {shape['rows']:,} |"
        )
    scans = part["scan_seconds"]
    lines += [
        "",
        f"Full scan of the final table: {scans['maintained']:.2f} s maintained vs {scans['uncompacted_twin']:.2f} s "
        f"for the same rows in the original small files ({scans['ratio']:.2f} x).",
        "",
    ]
    return lines
