"""Log levels for the Python processes Spark starts, which no application configures.

Spark runs this package's code in Python workers (the Kafka source's planning on
the driver, the readers and Parquet writers on the executors). Their structlog
would print every event, debug included. The driver sets SINK_WRITER_LOG_LEVEL
before Spark starts; workers inherit the environment and keep to that level once
configure_worker_logging() ran in them: spark_writer.worker_daemon, which Spark
forks its workers from, calls it first. Importing the package configures nothing
(tests/unit/test_logging_at_import.py).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Final

import structlog

LOG_LEVEL_VARIABLE: Final = "SINK_WRITER_LOG_LEVEL"
DEFAULT_LEVEL: Final = "INFO"


def set_worker_log_level(level: str) -> None:
    """Called by the driver before Spark starts its workers."""
    os.environ[LOG_LEVEL_VARIABLE] = level.upper()


def configure_worker_logging() -> None:
    """Give structlog the environment's level, unless the process configured it itself (a driver does)."""
    if structlog.is_configured():
        return
    level = logging.getLevelNamesMapping().get(os.environ.get(LOG_LEVEL_VARIABLE, DEFAULT_LEVEL).upper(), logging.INFO)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write a line (message and newline): the lines of workers sharing an executor's stderr never mix.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        # Not cached: a driver that configures logging later must take over the loggers created before.
        cache_logger_on_first_use=False,
    )
