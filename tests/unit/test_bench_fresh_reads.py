"""bench/fresh_reads.py renders its report from its results (timings are not checked: bench/ measures)."""

from __future__ import annotations

from bench.fresh_reads import render
from bench.infra import spread


def test_the_report_gives_staleness_and_the_time_ratio_against_their_goals() -> None:
    results = {
        "date": "2026-01-01",
        "quick": False,
        "reads": 3,
        "rate": 2_000,
        "table_records": 500_000,
        "machine": {"cores": 2, "cpu_model": "cpu"},
        "missing": [0, 0, 1],
        "table_lag_s": spread([1.0, 1.2, 1.4]),
        "tail_records": spread([2_000.0, 2_400.0, 3_000.0]),
        "fresh_s": spread([0.5, 0.6, 0.7]),
        "baseline_s": spread([0.4, 0.5, 0.6]),
        "ratio": spread([1.1, 1.2, 1.3]),
    }

    report = render(results)

    assert "| records acknowledged before a read began and missing from it (all reads) | 1 | 0: not met |" in report
    lag = "| the table's own lag at the read (the oldest acknowledged record it lacks), s | 1.20 (1.00-1.40) | |"
    assert lag in report
    assert "| fresh / (table + tail) | 1.20 (1.10-1.30) | <= 1.5: met |" in report
