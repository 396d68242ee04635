"""The benchmark code imports and renders its report (timings are not checked: bench/ measures, tests do not)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.e2e import query_time
from bench.infra import latency_stats, spread, top_frames
from bench.report import render


def _cell(value: float) -> dict[str, float]:
    return spread([value, value * 0.9, value * 1.1])


def _fairness_cell(sinks: int, p99_ms: float) -> dict[str, object]:
    return {
        "sinks": sinks,
        "concurrency": 4,
        "interval_seconds": 2.5,
        "batch_seconds": 1.0,
        "seconds": 60.0,
        "epochs": sinks * 60,
        "sink_p99_ms": {"median": p99_ms, "max": p99_ms, "min": p99_ms},
        "sink_p50_ms_median": p99_ms / 2,
        "worst_sink_max_ms": p99_ms,
    }


def _scrape(size: int, series: int) -> dict[str, object]:
    return {
        "bytes": size,
        "series": series,
        "log_series": 100,
        "log_bytes": 1000,
        "per_sink_histogram_series": 100,
        "log_reporter": True,
        "scrape": latency_stats([0.1]),
        "healthz_during_scrapes": latency_stats([0.01]),
    }


def _shape(files: int) -> dict[str, int]:
    return {"metadata_json_bytes": 4096, "snapshots": 5, "manifests": 2, "data_files": files, "rows": 1000}


def test_report_renders_every_part(tmp_path: Path) -> None:
    profile = tmp_path / "profile.txt"
    profile.write_text(
        "serve (coordinator_service/cli.py:10);pre_commit (coordinator_service/engine/protocol.py:20) 7\n"
        "serve (coordinator_service/cli.py:10) 3\n"
    )
    frames = top_frames(profile)
    assert frames[0] == ("cli.py:serve", 1.0)
    stats = latency_stats([0.001, 0.002, 0.003])
    results = {
        "quick": True,
        "parts": [1, 2, 3, 4, 5],
        "wall_seconds": 1.0,
        "machine": {
            "cpu_model": "cpu",
            "cores": 2,
            "ram_gib": 1.0,
            "python": "3",
            "pyiceberg": "x",
            "pyspark": "x",
            "grpcio": "x",
            "psycopg": "x",
            "pyarrow": "x",
        },
        "precommit": {
            "seconds_per_cell": 1.0,
            "repetitions": 3,
            "raw": {
                "1": {
                    "rate": _cell(100),
                    "p50_ms": _cell(1),
                    "p99_ms": _cell(2),
                    "cpu_ms_per_call": {"client": _cell(0.05), "coordinator": _cell(0.01), "postgres": _cell(0.1)},
                }
            },
            "coordinator": [
                {
                    "mode": "one_file",
                    "sinks": 1,
                    "concurrency": 1,
                    "rate": _cell(60),
                    "p50_ms": _cell(2),
                    "p99_ms": _cell(4),
                    "errors": 0,
                    "first_errors": [],
                    "cpu_ms_per_call": {"client": _cell(0.25), "coordinator": _cell(1), "postgres": _cell(0.4)},
                }
            ],
        },
        "commit": {
            "commits": 3,
            "coordinator": stats,
            "raw": stats,
            "coordinator_first_tenth": stats,
            "coordinator_last_tenth": stats,
            "raw_first_tenth": stats,
            "raw_last_tenth": stats,
            "ratio_p50": 1.0,
        },
        "coalescing": {
            "interval_seconds": 1.0,
            "max_epochs": 100,
            "rows": [
                {
                    "offered_epochs_per_s": 5.0,
                    "epochs": 10,
                    "snapshots": 2,
                    "snapshots_per_s": 1.0,
                    "epochs_per_snapshot": 5.0,
                }
            ],
        },
        "e2e": {
            "rows": [
                {
                    "partitions": 1,
                    "records": 10,
                    "batches": 1,
                    "coordinated_rps": _cell(9),
                    "plain_rps": _cell(10),
                    "ratio": _cell(0.9),
                    "coordinated_time": {
                        "wall": _cell(4.0),
                        "before_first_batch": _cell(0.5),
                        "in_batches": _cell(3.0),
                        "between_batches": _cell(0.4),
                        "after_last_batch": _cell(0.1),
                    },
                    "ratio_to_raw_in_batches": _cell(0.85),
                }
            ]
        },
        "recovery": {
            "sinks": 10,
            "tables": 1,
            "rows": 100,
            "pending_rows": 5,
            "file_sinks": 1,
            "serving_s": _cell(1),
            "ready_s": _cell(2),
        },
        "scale": {
            "files_per_epoch": [{"files": 1, "footers": "sent", "precommit": stats, "commit": stats}],
            "big_log": {"c1": {"rate": 1.0, **stats}, "c8": {"rate": 1.0, **stats}},
        },
        "fairness": {
            "alone": _fairness_cell(1, 1000.0),
            "crowd": _fairness_cell(50, 1500.0),
            "ratio_worst_p99_to_alone_p99": 1.5,
        },
        "soak": {
            "commits": 100,
            "raw_commits": 20,
            "rows_per_file": 10,
            "wall_seconds": 9.0,
            "maintenance": {"SINK_COORDINATOR_SNAPSHOT_MAX_COUNT": "100"},
            "coordinator": {"commits": 100, "first_tenth": stats, "last_tenth": stats, "ratio": 1.0},
            "raw": {"commits": 20, "first_tenth": stats, "last_tenth": stats, "ratio": 3.0},
            "table": _shape(20),
            "raw_table": _shape(20),
            "twin_table": _shape(100),
            "scan_seconds": {"maintained": 0.1, "uncompacted_twin": 0.5, "ratio": 0.2},
        },
        "console": {
            "sinks": 1000,
            "setup_seconds": 9.0,
            "page": latency_stats([0.12, 0.13]),
            "api": latency_stats([0.06, 0.07]),
            "ratio_p50": 2.0,
            "page_bytes": 40_000,
            "page_rows": 100,
            "first_paint": latency_stats([0.2, 0.25]),
        },
        "metrics_scrape": {
            "sinks": 1500,
            "scrapes": 20,
            "before": _scrape(5_000_000, 70_000),
            "after": _scrape(2_000_000, 30_000),
            "second_replica": _scrape(1_000_000, 15_000),
            "bytes_ratio": 0.4,
            "series_ratio": 0.43,
            "time_ratio_p50": 0.5,
            "fleet_bytes_ratio": 0.3,
            "fleet_series_ratio": 0.32,
        },
        "profiles": {"precommit": frames},
    }
    markdown = render(results)
    for heading in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6.", "## 7.", "## 10."):
        assert heading in markdown
    assert "Ours: **1.00** — goal met; raw: 3.00 after only 20 commits." in markdown
    assert "Worst sink's p99 / baseline p99: **1.50** — goal met." in markdown
    assert "| one file, footer read | 1 | 1 | 60 (54-66) |" in markdown
    split = "| 1 | 4.00 (3.60-4.40) | 0.50 (0.45-0.55) | 3.00 (2.70-3.30) | 0.40 (0.36-0.44) | 0.10 (0.09-0.11) | 0.85"
    assert split in markdown
    assert "| 1.0 / 2.0 | 0.25 / 1.00 / 0.40 (0.05 / 0.10) | met |" in markdown
    assert "| GET /console | 125 | 130 |  |" in markdown
    assert "| first contentful paint in headless Chromium | 225 | 250 | met |" in markdown
    assert "Page / API at p50: **2.00**." in markdown
    assert "| per-sink histograms (before) | 5,000,000 | 70,000 | 100 | 100 | 100 | 10 |" in markdown


def test_a_querys_time_is_split_by_its_progress_reports() -> None:
    """Two triggers of 1.0 s (0.8 s in addBatch) and 0.5 s (0.3 s), the first 0.25 s after the run began, the run 2 s
    long: 0.25 s before, 1.1 s in batches, 0.4 s between, 0.25 s after."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    started = datetime(2026, 11, 30, 20, 0, 0, tzinfo=UTC).timestamp()

    def report(batch: int, at: str, trigger_ms: int, add_batch_ms: int) -> StreamingQueryProgress:
        return StreamingQueryProgress.fromJson(
            {
                "id": "00000000-0000-0000-0000-000000000000",
                "runId": "00000000-0000-0000-0000-000000000001",
                "name": None,
                "timestamp": at,
                "batchId": batch,
                "batchDuration": trigger_ms,
                "durationMs": {"triggerExecution": trigger_ms, "addBatch": add_batch_ms},
                "eventTime": {},
                "stateOperators": [],
                "sources": [],
                "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
                "numInputRows": 4,
                "inputRowsPerSecond": 0.0,
                "processedRowsPerSecond": 0.0,
                "observedMetrics": {},
            }
        )

    progress = [report(0, "2026-11-30T20:00:00.250Z", 1000, 800), report(1, "2026-11-30T20:00:01.250Z", 500, 300)]
    time = query_time(progress, started, 2.0)
    assert time.wall == 2.0
    assert time.before_first_batch == pytest.approx(0.25)
    assert time.in_batches == pytest.approx(1.1)
    assert time.between_batches == pytest.approx(0.4)
    assert time.after_last_batch == pytest.approx(0.25)
    with pytest.raises(AssertionError, match="do not start at its first batch"):
        query_time(progress[1:], started, 2.0)
