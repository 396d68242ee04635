"""latest.md from the results of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import report_growth, report_paths
from bench.report_cells import figure

# The benches with reports of their own (parts 13-16), summed up by hand; then what the profiles found.
STANDALONE = Path(__file__).resolve().parent / "STANDALONE.md"
OPTIMISATIONS = Path(__file__).resolve().parent / "OPTIMISATIONS.md"


def render(results: dict[str, Any]) -> str:
    lines: list[str] = ["# sink-coordinator benchmarks", ""]
    machine = results["machine"]
    lines += [
        f"Run: {'--quick' if results.get('quick') else 'full'}, parts {results.get('parts')}, "
        f"{figure(results.get('wall_seconds', 0), 0)} s wall.",
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
        lines += report_paths.precommit(results["precommit"])
    if "precommit_every_core" in results:
        lines += report_paths.precommit(results["precommit_every_core"])
    if "commit" in results:
        lines += report_paths.commit(results["commit"], results.get("coalescing"))
    if "e2e" in results:
        lines += report_paths.e2e(
            results["e2e"],
            "## 3. End to end: Kafka → Spark → Iceberg, records/s, coordinated vs plain foreachBatch + "
            "pyiceberg append",
        )
    if "recovery" in results:
        lines += report_paths.recovery(results["recovery"])
    if "scale" in results:
        lines += report_growth.scale(results["scale"], results)
    if "fairness" in results:
        lines += report_growth.fairness(results["fairness"])
    if "soak" in results:
        lines += report_growth.soak(results["soak"])
    if "soak_defaults" in results:
        lines += report_growth.soak_defaults(results["soak_defaults"])
    if "object_storage" in results:
        lines += report_paths.object_storage(results["object_storage"])
    if "e2e_cluster_s3" in results:
        lines += report_paths.e2e(
            results["e2e_cluster_s3"],
            "## 9. End to end where tables live: a Spark standalone cluster, S3 and a REST catalog (SeaweedFS), "
            "records/s",
        )
    if "console" in results:
        lines += report_growth.console(results["console"])
    if "metrics_scrape" in results:
        lines += report_growth.metrics_scrape(results["metrics_scrape"])
    if "profiles" in results:
        lines += ["## Profiles (py-spy, share of samples in which a function is on the stack)", ""]
        for name, frames in results["profiles"].items():
            lines += [f"{name}: " + ", ".join(f"{label} {share:.0%}" for label, share in frames[:8]), ""]
    for closing in (STANDALONE, OPTIMISATIONS):
        if closing.exists():
            lines += [closing.read_text().strip(), ""]
    return "\n".join(lines) + "\n"
