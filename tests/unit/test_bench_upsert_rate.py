"""bench/upsert_rate.py: the stream it measures is what the issue's goal names (half the records updates of keys
spread uniformly, each key created by its first record), and the report says whether the goal is met (rates are
not checked: bench/ measures)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bench.infra import spread
from bench.upsert_rate import render, stream


@given(st.integers(min_value=2, max_value=2_000), st.integers(min_value=0, max_value=10**6))
def test_half_the_stream_updates_keys_written_before(records: int, seed: int) -> None:
    orders = stream(records, seed)
    assert len(orders) == records
    keys = Counter(key for key, _ in orders)
    assert set(keys) == set(range(records // 2))  # every key created; an update only of a key that exists
    assert sum(count - 1 for count in keys.values()) == records - records // 2  # the updates
    assert all(order["order_id"] == key for key, order in orders)
    assert stream(records, seed) == orders  # a seed gives the same stream


def _results(append: list[float], upsert: list[float]) -> dict[str, Any]:
    ratios = [u / a for u, a in zip(upsert, append, strict=True)]
    part = {
        "records": 1000,
        "keys": 500,
        "partitions": 4,
        "batches": 5,
        "append_rps": spread(append),
        "upsert_rps": spread(upsert),
        "ratio": spread(ratios),
        "ratios": ratios,
    }
    return {
        "date": "2026-11-28",
        "quick": True,
        "repetitions": 2,
        "load_before": 1.0,
        "machine": {"cores": 2},
        "part": part,
    }


def test_the_report_says_whether_the_goal_is_met() -> None:
    assert "0.60 x (0.60-0.60), goal at least 0.5 x: met" in render(_results([1000, 2000], [600, 1200]))
    assert "0.40 x (0.40-0.40), goal at least 0.5 x: not met" in render(_results([1000, 2000], [400, 800]))
