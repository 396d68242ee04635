"""The console's memory of commits: the last hour per sink, bounded, and drawn as a chart of that hour."""

from __future__ import annotations

import time

from coordinator_service.admin.console_charts import CHART_HEIGHT, CHART_WIDTH, line_chart
from coordinator_service.engine.commit_history import CommitHistory


def test_samples_older_than_the_window_are_left_out_and_each_sink_keeps_its_newest() -> None:
    history = CommitHistory(window_seconds=60, max_samples=3)
    now = time.time()
    history.record("orders", 0.5, 1, 0, at=now - 120)
    for second in range(4):
        history.record("orders", 0.1 * second, 1, second, at=now - 10 + second)
    history.record("payments", 0.2, 2, 5, at=now)

    assert [sample.lag_epochs for sample in history.samples("orders", now)] == [1, 2, 3]
    assert [sample.epochs for sample in history.samples("payments", now)] == [2]
    assert history.samples("unknown", now) == []


def test_a_chart_spans_the_window_and_scales_to_its_top_value() -> None:
    now = time.time()
    chart = line_chart([(now - 3600, 10.0), (now - 1800, 40.0), (now, 20.0)], "ms", 3600)

    xs = [x for x, _ in chart.points]
    ys = [y for _, y in chart.points]
    assert abs(xs[0]) < 1 and abs(xs[1] - CHART_WIDTH / 2) < 1 and abs(xs[2] - CHART_WIDTH) < 1
    assert min(ys) == ys[1] and all(0 <= y <= CHART_HEIGHT for y in ys)  # the top value is highest on screen
    assert (chart.top, chart.unit) == ("40", "ms")
    assert line_chart([], "ms", 3600).points == ()
