"""Importing the packages configures no logging: the commands (and Spark's worker daemon) do, when they start.

A library that configures logging when imported takes the choice from the program that imports it (a user's own
Spark job, the tests) and does it again in every process that unpickles one of its classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator_service", "spark_writer", "sink_coordinator_demo")

# Every module but the ones that run something when imported: `python -m` entry points and Alembic's env.py.
IMPORT_ALL = f"""
import importlib
import json
import logging
import pkgutil

import structlog

imported = []
for package in {PACKAGES!r}:
    imported.append(importlib.import_module(package).__name__)
    for module in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if not module.name.endswith(".__main__") and ".migrations" not in module.name:
            imported.append(importlib.import_module(module.name).__name__)
root = logging.getLogger()
ours = {{
    name: logging.getLevelName(logger.level)
    for name, logger in logging.Logger.manager.loggerDict.items()
    if isinstance(logger, logging.Logger)
    and name.partition(".")[0] in {PACKAGES!r}
    and (logger.level != logging.NOTSET or logger.handlers)
}}
print(json.dumps({{
    "imported": imported,
    "structlog_configured": structlog.is_configured(),
    "root_handlers": len(root.handlers),
    "root_level": logging.getLevelName(root.level),
    "our_loggers_configured": ours,
}}))
"""


def test_importing_the_packages_configures_no_logging() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IMPORT_ALL)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(finished.stdout.strip().splitlines()[-1])
    assert {"spark_writer.job", "coordinator_service.cli", "sink_coordinator_demo.local_services"} <= set(
        found["imported"]
    )
    assert found["structlog_configured"] is False
    assert (found["root_handlers"], found["root_level"]) == (0, "WARNING")
    assert found["our_loggers_configured"] == {}


def test_the_kafka_sources_planning_process_takes_the_jobs_log_level() -> None:
    """Spark plans a Python stream in a process of its own, which no worker daemon configured."""
    program = textwrap.dedent(
        """
        import structlog
        from spark_writer.kafka.source import KafkaDataSource

        source = KafkaDataSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "orders"})
        source.streamReader(source.schema())
        structlog.get_logger("planner").info("an info line the job's level hides")
        structlog.get_logger("planner").warning("a warning line it shows")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={"SINK_WRITER_LOG_LEVEL": "WARNING", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "a warning line it shows" in result.stderr
    assert "an info line the job's level hides" not in result.stderr + result.stdout
