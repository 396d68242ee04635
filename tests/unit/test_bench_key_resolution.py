"""bench/key_resolution.py renders its report from its results (timings are not checked: bench/ measures)."""

from __future__ import annotations

from typing import Any

from bench.infra import spread
from bench.key_resolution import COMMIT_PARTS, render


def _index(rows: int, index_seconds: float) -> dict[str, Any]:
    return {
        "rebuild_s": rows / 300_000,
        "size_bytes": rows * 120,
        "heap_pages": rows // 146,
        "lookup_uniform_s": spread([0.05, 0.06]),
        "commit_upserts_s": {part: spread([index_seconds / 4, index_seconds / 4]) for part in COMMIT_PARTS}
        | {"total": spread([index_seconds, index_seconds])},
        "commit_wal_bytes": spread([rows * 10.0, rows * 12.0]),
        "commit_small_s": spread([0.05, 0.05]),
        "catch_up_and_lookup_s": spread([0.2, 0.25]),
    }


def _table(rows: int, scan_seconds: float, index_seconds: float) -> dict[str, Any]:
    return {
        "rows": rows,
        "files": rows // 50_000,
        "build_seconds": 1.0,
        "scan": {
            "resolve_uniform_s": spread([scan_seconds, scan_seconds * 1.1]),
            "resolve_newest_s": spread([0.02, 0.03]),
            "commit_upserts_s": spread([scan_seconds * 2, scan_seconds * 2]),
            "files_read_uniform": rows // 50_000,
            "files_read_newest": 1,
        },
        # The server sized for it twice as fast.
        "index": {"defaults": _index(rows, index_seconds), "sized": _index(rows, index_seconds / 2)},
    }


def test_the_report_gives_each_table_and_the_ratio_of_the_largest_to_the_one_before() -> None:
    results = {
        "date": "2026-01-01",
        "quick": False,
        "repetitions": 2,
        "machine": {"cores": 2, "cpu_model": "cpu", "pyiceberg": "0.12.0", "pyarrow": "x", "postgresql": "18.1"},
        "tables": [_table(100_000, 0.04, 0.3), _table(1_000_000, 0.2, 0.4), _table(10_000_000, 2.0, 0.5)],
    }

    report = render(results)

    assert (
        "| | 100,000 rows (2 files) | 1,000,000 rows (20 files) | 10,000,000 rows (200 files) "
        "| 10,000,000 / 1,000,000 |" in report
    )
    assert (
        "| scan: resolve 10,000 keys spread uniformly | 0.042 (0.040-0.044) | 0.210 (0.200-0.220) "
        "| 2.100 (2.000-2.200) | 10.00x |" in report
    )
    assert (
        "| **index, PostgreSQL's defaults: commit an epoch of 10,000 upserts** | 0.300 (0.300-0.300) "
        "| 0.400 (0.400-0.400) | 0.500 (0.500-0.500) | 1.25x |" in report
    )
    assert (
        "| **index, a server sized for it: commit an epoch of 10,000 upserts** | 0.150 (0.150-0.150) "
        "| 0.200 (0.200-0.200) | 0.250 (0.250-0.250) | 1.25x |" in report
    )
    assert "| index: size in PostgreSQL, bytes a row | 11 MiB, 120 | 114 MiB, 120 | 1,144 MiB, 120 | |" in report
    assert "10x the rows took 10.0x the time from 1,000,000 to 10,000,000 rows" in report
    assert "(at 1,000,000 rows about 5,259 of its 6,849 heap pages)" in report
    assert "(9,304 of 68,493 at 10,000,000; 9,927 of 684,930 at ten times that)" in report
    assert "| &nbsp;&nbsp;WAL a commit writes, MB | 1.1 | 11.0 | 110.0 | |" in report
    assert (
        "on PostgreSQL's defaults, 0.50 s, 1.25x the same on 1,000,000 rows (met); on a server sized for it, 0.25 s, "
        "1.25x the same on 1,000,000 rows (met)" in report
    )
    assert "a commit wrote 11.0 MB of WAL at 1,000,000 rows and 110.0 MB at 10,000,000, which fills max_wal_size" in (
        report
    )
    assert "(1GB) every 9 commits" in report
    assert "110.0 MB a commit at 10,000,000 rows, uncompressed, in 0.25 s against 0.50 s on the defaults" in report
