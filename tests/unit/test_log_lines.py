"""Log lines of processes that share one stderr (a supervisor's serving processes) stay whole lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from spark_writer.worker_logging import LOG_LEVEL_VARIABLE

# A serving process's logging: many lines, as fast as it can.
_LOGGING = """
import structlog
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
configure_logging(LogLevel.INFO, LogFormat.JSON, process={index})
for line in range({lines}):
    structlog.get_logger().info("a line of the process", line=line, padding="x" * 200)
"""
LINES = 3000


def _shared_stderr(template: str) -> str:
    """What two processes running `template` (with their index) wrote to the one stderr they inherited."""
    codes = [template.format(index=index, lines=LINES) for index in range(2)]
    parent = "\n".join(
        [
            "import subprocess, sys",
            f"children = [subprocess.Popen([sys.executable, '-c', code]) for code in {codes!r}]",
            "sys.exit(max(child.wait() for child in children))",
        ]
    )
    # At INFO whatever level an earlier test of this process left to its workers (set_worker_log_level).
    environment = {**os.environ, LOG_LEVEL_VARIABLE: "INFO"}
    return subprocess.run(
        [sys.executable, "-c", parent], stderr=subprocess.PIPE, text=True, check=True, env=environment
    ).stderr


def test_lines_of_processes_sharing_stderr_never_mix() -> None:
    # Two processes writing to the one pipe they inherited, as a supervisor's serving processes do.
    shared = _shared_stderr(_LOGGING)
    records = [json.loads(line) for line in shared.splitlines()]
    assert sorted(record["process"] for record in records) == [0] * LINES + [1] * LINES


# A Spark Python worker's logging (the writer's tasks): the workers of an executor share its stderr too.
_WORKER_LOGGING = """
import structlog
from spark_writer.worker_logging import configure_worker_logging
configure_worker_logging()
for line in range({lines}):
    structlog.get_logger().info("a line of worker {index}", line=line, padding="x" * 200)
"""


def test_lines_of_the_writers_workers_sharing_stderr_never_mix() -> None:
    lines = _shared_stderr(_WORKER_LOGGING).splitlines()
    assert len(lines) == 2 * LINES
    # Each line is one whole line of one worker: its event once, its padding whole.
    assert all(line.count("a line of worker") == 1 and line.count("x" * 200) == 1 for line in lines)
    assert sorted(line.split("a line of worker ")[1][0] for line in lines) == ["0"] * LINES + ["1"] * LINES
