"""bench/keyed_compaction.py: its second pyiceberg reader keeps the rows pyiceberg's own keeps, only for the block it
is asked in, and its report renders every reader (timings are not checked: bench/ measures)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyiceberg.io.pyarrow as pyiceberg_arrow
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.infra import spread
from bench.keyed_compaction import numpy_range_positions, numpy_row_range, render

INSTALLED = pyiceberg_arrow._combine_positional_deletes

positions = st.lists(st.integers(min_value=0, max_value=300), max_size=40)


@given(
    deletes=st.lists(st.lists(positions, min_size=1, max_size=3), min_size=1, max_size=3),
    start=st.integers(min_value=0, max_value=200),
    length=st.integers(min_value=1, max_value=120),
)
def test_numpy_s_range_keeps_the_rows_pyiceberg_s_own_keeps(
    deletes: list[list[list[int]]], start: int, length: int
) -> None:
    """Duplicates, positions outside the batch, several delete files of several chunks: the same rows, numbered
    alike."""
    arrays = [pa.chunked_array([pa.array(chunk, pa.int64()) for chunk in chunks]) for chunks in deletes]

    expected = INSTALLED(arrays, start, start + length).to_pylist()

    assert numpy_range_positions(arrays, start, start + length).to_pylist() == expected


def test_numpy_s_range_is_pyiceberg_s_only_inside_the_block() -> None:
    inside = []

    def failing_scan() -> None:
        inside.append(pyiceberg_arrow._combine_positional_deletes)
        raise RuntimeError("a scan failed")

    def scan_with_numpy_s_range() -> None:
        with numpy_row_range():
            failing_scan()

    with pytest.raises(RuntimeError, match="a scan failed"):
        scan_with_numpy_s_range()

    assert inside == [numpy_range_positions]
    assert pyiceberg_arrow._combine_positional_deletes is INSTALLED


def _state(data_files: int, delete_files: int, pyiceberg: float, numpy_range: float, duckdb: float) -> dict[str, Any]:
    return {
        "data_files": data_files,
        "delete_files": delete_files,
        "scan_seconds": spread([pyiceberg, pyiceberg]),
        "numpy_range_scan_seconds": spread([numpy_range, numpy_range]),
        "duckdb_scan_seconds": spread([duckdb, duckdb]),
        "change": None,
    }


def test_the_report_gives_each_reader_s_scans_and_verdict() -> None:
    results = {
        "date": "2026-01-01",
        "quick": False,
        "repetitions": 2,
        "machine": {"cores": 2},
        "table": {
            "rows": 1_000_000,
            "epochs": 5,
            "keys_per_epoch": 10_000,
            "target_file_bytes": 600_000,
            "commit_seconds": spread([0.15, 0.16]),
            "before": _state(25, 5, 0.2, 0.06, 0.055),
            "merged": _state(23, 1, 0.19, 0.055, 0.053),
            "after": _state(43, 0, 0.05, 0.05, 0.05),
            "ratio": 4.0,
            "numpy_range_ratio": 1.2,
            "duckdb_ratio": 1.1,
        },
    }

    report = render(results)

    assert (
        "| before the run | 25 | 5 | 0.200 s (0.200-0.200) | 0.060 s (0.060-0.060) | 0.055 s (0.055-0.055) |  |"
        in report
    )
    assert (
        "4.00 x with pyiceberg (not met), 1.20 x with pyiceberg and numpy's range (met), 1.10 x with DuckDB (met)"
        in report
    )
