"""bench/verification.py renders its report from its results (timings are not checked: bench/ measures)."""

from __future__ import annotations

from typing import Any

from bench.infra import spread
from bench.verification import render


def layout(full: list[float], ratio: list[float], interval: list[float]) -> dict[str, Any]:
    return {
        "rows": 10_000_000,
        "epochs": 10,
        "full_s": spread(full),
        "full_rows_per_s": 10_000_000 / spread(full)["median"],
        "incremental_epoch_rows": 100_000,
        "commit_s": spread([0.04, 0.05]),
        "incremental_s": spread([0.001, 0.003]),
        "incremental_ratio": spread(ratio),
        "interval_epochs": 20,
        "interval_ratio": spread(interval),
    }


def test_the_report_gives_rows_per_second_and_the_incremental_ratios_against_the_goal() -> None:
    results = {
        "date": "2026-01-01",
        "quick": False,
        "machine": {"cores": 2, "cpu_model": "cpu", "pyiceberg": "0.12.0"},
        "layouts": {
            "sink": layout([8.0, 9.0, 10.0], [0.025, 0.06], [0.03, 0.04]),
            "shuffled": layout([11.0, 12.0], [0.5, 0.7], [0.5, 0.7]),
        },
        "spark": {
            "epoch_records": 100_000,
            "batch_s": spread([0.5, 0.7]),
            "batches_per_epoch": 1,
            "incremental_s": spread([0.02, 0.03]),
            "incremental_ratio": spread([0.04, 0.05]),
            "interval_epochs": 20,
            "interval_ratio": spread([0.06, 0.07]),
        },
    }

    report = render(results)

    assert "| full verification of 10,000,000 rows (10 epochs), s | 9.00 (8.00-10.00) | 11.50 (11.00-12.00) | |" in (
        report
    )
    assert "| deep verification, rows/s | 1,111,111 | 869,565 | 1,000,000 rows/s on 10,000,000 rows: not met |" in (
        report
    )
    assert (
        "| incremental / the coordinator's commit, verified after every epoch | 4.2% (2.5%-6.0%) | "
        "60.0% (50.0%-70.0%) | |" in report
    )
    assert (
        "| incremental / the coordinator's commits, verified once per 20 epochs | 3.5% (3.0%-4.0%) | "
        "60.0% (50.0%-70.0%) | |" in report
    )
    assert (
        "| an epoch's Spark batch (read from Kafka, decode, write, pre-commit), s | 0.600 (0.500-0.700) | |" in report
    )
    assert (
        "| **incremental / the epoch's work, verified after every epoch** | 4.5% (4.0%-5.0%) | <= 5 %: met |" in report
    )
    assert (
        "| **incremental / the epochs' work, verified once per 20 epochs** | 6.5% (6.0%-7.0%) | <= 5 %: not met |"
        in report
    )
