"""The report's sections on what grows: files per epoch and the log (part 5), many sinks sharing commit slots
(part 6), a long history (the soaks: parts 7 and 12), the console and the /metrics scrape at many sinks (parts 10
and 11)."""

from __future__ import annotations

from typing import Any

from bench.report_cells import figure, goal_met


def scale(part: dict[str, Any], results: dict[str, Any]) -> list[str]:
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
            f"{figure(row['precommit']['p50_ms'], 1)} / {figure(row['precommit']['p99_ms'], 1)} | "
            f"{figure(row['commit']['p50_ms'], 1)} / {figure(row['commit']['p99_ms'], 1)} |"
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
                    f"| part 1 (1 sink) | {concurrency} | {figure(cell['rate']['median'])} | "
                    f"{figure(cell['p50_ms']['median'], 1)} | {figure(cell['p99_ms']['median'], 1)} |"
                )
            lines.append(
                f"| big | {concurrency} | {figure(big[key]['rate'])} | {figure(big[key]['p50_ms'], 1)} | "
                f"{figure(big[key]['p99_ms'], 1)} |"
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


def fairness(part: dict[str, Any]) -> list[str]:
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
            f"| {label} | {cell['sinks']} | {cell['epochs']:,} | {figure(cell['sink_p50_ms_median'])} | "
            f"{figure(cell['sink_p99_ms']['median'])} | {figure(cell['sink_p99_ms']['max'])} | "
            f"{figure(cell['worst_sink_max_ms'])} |"
        )
    ratio = part["ratio_worst_p99_to_alone_p99"]
    lines += ["", f"Worst sink's p99 / baseline p99: **{ratio:.2f}** — goal {goal_met(ratio <= 2.0)}.", ""]
    return lines


def soak_defaults(part: dict[str, Any]) -> list[str]:
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
            f"| {window['commits']:,} | {figure(window['p50_ms'], 1)} | {figure(window['p99_ms'], 1)} | "
            f"{window['snapshots']:,} | {window['manifests']:,} | {window['data_files']:,} |"
        )
    lines += [
        "",
        f"Most snapshots at a window's end: **{part['max_snapshots']:,}**; p50 of the last window / the first: "
        f"{part['p50_last_over_first_window']:.2f}.",
        "",
    ]
    return lines


def soak(part: dict[str, Any]) -> list[str]:
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
            f"| {label} | {cell['commits']:,} | {figure(cell['first_tenth']['p50_ms'], 1)} | "
            f"{figure(cell['last_tenth']['p50_ms'], 1)} | {cell['ratio']:.2f} |"
        )
    lines += [
        "",
        f"Ours: **{ours['ratio']:.2f}** — goal {goal_met(ours['ratio'] <= 1.2)}; raw: {raw['ratio']:.2f} after only "
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


def console(part: dict[str, Any]) -> list[str]:
    page, api, paint = part["page"], part["api"], part.get("first_paint")
    # The first render is the browser's first contentful paint; without Chromium, the page's fetch stands in.
    painted = (
        f"| first contentful paint in headless Chromium | {figure(paint['p50_ms'])} | {figure(paint['p99_ms'])} | "
        f"{goal_met(paint['p50_ms'] < 300)} |"
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
        f"| GET /console | {figure(page['p50_ms'])} | {figure(page['p99_ms'])} | "
        f"{'' if paint else goal_met(page['p50_ms'] < 300)} |",
        f"| GET /api/v1/sinks (baseline) | {figure(api['p50_ms'])} | {figure(api['p99_ms'])} | |",
        painted,
        "",
        f"Page / API at p50: **{part['ratio_p50']:.2f}**.",
        "",
    ]


def metrics_scrape(part: dict[str, Any]) -> list[str]:
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
            f"{figure(cell['scrape']['p50_ms'])} | {figure(cell['scrape']['max_ms'])} | "
            f"{figure(cell['healthz_during_scrapes']['max_ms'])} |"
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
