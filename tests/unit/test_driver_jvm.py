"""The driver JVM a session of this process starts (spark_writer.driver_jvm): SIGTERM ignored as PySpark ignores
SIGINT, so that a SIGTERM to the whole process group reaches the Python driver alone; Spark's log in a file."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import java_gateway

from spark_writer.driver_jvm import SparkLog, jvm_ignoring_sigterm

# Says it runs (its signals are then as the command starts with them), and ends when its stdin closes.
WAIT_FOR_STDIN = [sys.executable, "-c", "import sys; print('running', flush=True); sys.stdin.read()"]


def running(child: subprocess.Popen[bytes]) -> int:
    """The pid of `child` once the command runs (a launcher executes it in its place: the same pid)."""
    assert child.stdout is not None
    assert child.stdout.readline() == b"running\n"
    return child.pid


def ignored_signals(pid: int) -> set[int]:
    """The signals a process ignores, from /proc/PID/status (SigIgn: a hexadecimal bit mask, bit N-1 for signal N)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {number for number in range(1, 65) if mask >> (number - 1) & 1}
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


def ignore_sigint() -> None:
    """PySpark's own preexec_fn for its JVM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_jvm_started_within_ignores_sigterm_besides_sigint() -> None:
    with jvm_ignoring_sigterm():
        child = java_gateway.Popen(  # type: ignore[attr-defined]
            WAIT_FOR_STDIN, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=ignore_sigint
        )
    try:
        assert {signal.SIGINT, signal.SIGTERM} <= ignored_signals(running(child))
    finally:
        child.communicate(timeout=30)  # its stdin closes: it ends, as the JVM does when the driver goes
    assert java_gateway.Popen is subprocess.Popen  # type: ignore[attr-defined]
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # the driver itself still takes it


def test_the_jvm_is_started_without_a_preexec_fn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `preexec_fn` makes Python fork the driver, where gRPC has run (the job asks the coordinator first), rather
    than vfork it; such a fork can hang in the child (grpc/grpc#37259). PySpark's own is replaced."""
    launched: list[tuple[list[str], dict[str, Any]]] = []

    def record(command: list[str], **kwargs: Any) -> None:
        launched.append((command, kwargs))

    monkeypatch.setattr(java_gateway, "Popen", record)
    with jvm_ignoring_sigterm():
        java_gateway.Popen(["spark-submit", "pyspark-shell"], stdin=subprocess.PIPE, preexec_fn=ignore_sigint)  # type: ignore[attr-defined]
    [(command, kwargs)] = launched
    assert "preexec_fn" not in kwargs and kwargs["stdin"] is subprocess.PIPE
    assert command[-2:] == ["spark-submit", "pyspark-shell"]


def test_a_process_started_outside_takes_sigterm() -> None:
    child = java_gateway.Popen(WAIT_FOR_STDIN, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # type: ignore[attr-defined]
    try:
        assert signal.SIGTERM not in ignored_signals(running(child))
    finally:
        child.communicate(timeout=30)


def test_the_failure_that_ended_a_run_is_appended_whole(tmp_path: Path) -> None:
    spark_log = SparkLog(tmp_path / "spark.log")
    spark_log.path.write_text("26/11/25 16:21:27 WARN Utils: before\n")
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as error:
        spark_log.append_error(error)
    text = spark_log.path.read_text()
    assert text.startswith("26/11/25 16:21:27 WARN Utils: before\n")
    assert "KeyError: 'inner'" in text
    assert text.rstrip().endswith("RuntimeError: outer")
