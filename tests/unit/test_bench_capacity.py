"""bench/capacity.py: a step's verdict is the issue's bound, the CPU it reads includes the children of a process (a
coordinator of several processes), the report renders each shape, and a shape it does not run is refused (figures
are not checked: bench/ measures)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psutil
import pytest

from bench.capacity import COMMIT_INTERVAL_SECONDS, CpuWindow, capacity, main, passes, render
from bench.infra import cpu_seconds, latency_stats


def test_a_step_passes_only_within_the_interval_plus_three_seconds_and_on_schedule() -> None:
    bound = COMMIT_INTERVAL_SECONDS + 3.0
    on_time = latency_stats([0.01] * 100)
    assert passes(latency_stats([bound] * 100), on_time)
    assert not passes(latency_stats([bound + 0.01] * 100), on_time)
    assert not passes(latency_stats([1.0] * 100), latency_stats([1.0] * 100))  # the writers fell a trigger behind
    assert not passes(latency_stats([]), on_time)  # nothing committed is no pass


def test_the_cpu_read_counts_the_children_of_a_process() -> None:
    # The child burns half a second of CPU, says so, and lives on until its stdin (the parent's) closes.
    burn = (
        "import sys, time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
        "print(1, flush=True)\nsys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == b"1"
        own = psutil.Process(parent.pid).cpu_times()
        assert own.user + own.system < 0.5
        assert cpu_seconds([psutil.Process(parent.pid)]) >= 0.5
    finally:
        parent.communicate(b"", timeout=30)


def test_cpu_seconds_keep_what_a_child_spent_once_it_has_ended() -> None:
    """A PostgreSQL backend whose connection closes, or a serving process restarted, leaves its parent: what it
    spent stays counted (the parent's reaped children's times), so CPU read before and after it ends never goes
    back."""
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}]); print(1, flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == b"1"  # the child has ended, and was waited for
        process = psutil.Process(parent.pid)
        assert process.children() == []
        assert cpu_seconds([process]) >= 0.5
    finally:
        parent.communicate(b"", timeout=30)


def test_the_window_gives_milliseconds_per_sink_second() -> None:
    window = CpuWindow(before=(1.0, 2.0, 3.0), after=(3.0, 3.0, 3.5), seconds=10.0)
    assert window.ms_per_sink_second(100) == (2.0, 1.0, 0.5)


def _step(sinks: int, passed: bool) -> dict[str, Any]:
    return {
        "sinks": sinks,
        "seconds": 40.0,
        "epochs": sinks * 40,
        "checkpoint_to_commit": latency_stats([5.0, 12.0]),
        "writer_lag": latency_stats([0.01, 0.2]),
        "refused_calls": 0,
        "coordinator_cpu_ms_per_sink_second": 4.0,
        "database_cpu_ms_per_sink_second": 1.0,
        "writers_cpu_ms_per_sink_second": 1.5,
        "passed": passed,
    }


def test_the_report_names_each_shapes_capacity_and_the_goal() -> None:
    results = {
        "command": "python -m bench.capacity --sinks 100,200,500",
        "date": "2026-11-28",
        "load_before": 1.0,
        "machine": {"cores": 2},
        "seconds": 40.0,
        "commit_interval_seconds": COMMIT_INTERVAL_SECONDS,
        "shapes": [
            {"shape": "1 process", "steps": [_step(100, True), _step(200, False)], "capacity": 100},
            {"shape": "2 processes (every core)", "steps": [_step(500, True)], "capacity": 500},
        ],
    }
    report = render(results)
    assert report.startswith("# Capacity (part 16)\n\n`python -m bench.capacity --sinks 100,200,500`, 2026-11-28")
    assert "| 1 process | 100 | not met |" in report
    assert "| 2 processes (every core) | 500 | met |" in report
    assert "one core of coordinator carries 250 sinks" in report


def test_a_shape_not_in_the_bench_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("nonsense", "", "1 PROCESS", "1 process ", "1 process; 2 replicas"):
        with pytest.raises(SystemExit) as exit_:
            main(["--shape", name])
        assert exit_.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_the_capacity_is_the_last_step_passed_before_the_first_failure() -> None:
    assert capacity([_step(50, True), _step(100, True), _step(200, False)]) == 100
    assert capacity([_step(50, False), _step(100, True)]) == 0  # with --every-step: a later pass is noise
    assert capacity([]) == 0
