"""bench/key_resolution.py renders its report from its results (timings are not checked: bench/ measures)."""

from __future__ import annotations

from bench.infra import spread
from bench.key_resolution import render


def _table(rows: int, seconds: float) -> dict[str, object]:
    return {
        "rows": rows,
        "files": rows // 50_000,
        "build_seconds": 1.0,
        "resolve_uniform_s": spread([seconds, seconds * 1.1]),
        "resolve_newest_s": spread([0.02, 0.03]),
        "commit_upserts_s": spread([seconds * 2, seconds * 2]),
        "files_read_uniform": rows // 50_000,
        "files_read_newest": 1,
    }


def test_the_report_gives_the_ratio_of_the_large_table_to_the_small_one() -> None:
    results = {
        "date": "2026-01-01",
        "quick": False,
        "repetitions": 2,
        "machine": {"cores": 2, "cpu_model": "cpu", "pyiceberg": "0.12.0", "pyarrow": "x"},
        "tables": [_table(100_000, 0.04), _table(1_000_000, 0.2)],
    }

    report = render(results)

    assert "| 100,000 rows (2 files) | 1,000,000 rows (20 files) | ratio |" in report
    assert "| resolve 10,000 keys spread uniformly (s) | 0.042 (0.040-0.044) | 0.210 (0.200-0.220) | 5.0x |" in report
    assert "10x the rows took 5.0x the time" in report
