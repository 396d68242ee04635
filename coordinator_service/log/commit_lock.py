"""The sink's commit lock: whoever holds it may change what the sink's table holds.

A PostgreSQL session-level advisory lock on a connection of its own. The
committer holds it while it appends; every path that aborts epochs, re-bases
them or deletes their files (RegisterWriter, an operator's abort or reset, the
cleaner) holds it while it looks at the table and decides. Across any number of
coordinator processes on one database, one of them holds a sink at a time.

The lock lives with its connection, and a connection can die alone: a
terminated backend, idle_session_timeout, a failover, a pooler, a TCP reset.
Nothing is trusted on the strength of having taken the lock once: `verify()`
runs right before every step that relies on it, and raises CommitLockLost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator_service.contract.errors import CommitLockLost, Unavailable
from coordinator_service.log import repository
from coordinator_service.log.database import Database

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CommitLock:
    connection: AsyncConnection
    sink_id: int

    async def verify(self) -> None:
        """Raise CommitLockLost unless this session still holds the lock (checked in PostgreSQL's own view)."""
        try:
            held = await repository.holds_commit_lock(self.connection, self.sink_id)
        except DBAPIError as error:
            raise CommitLockLost(f"the commit lock of sink id {self.sink_id} was lost with its connection") from error
        if not held:
            raise CommitLockLost(f"the commit lock of sink id {self.sink_id} is no longer held by this session")


@asynccontextmanager
async def try_holding(database: Database, sink_id: int) -> AsyncIterator[CommitLock | None]:
    """The lock if it is free now, else None (another committer or operator holds the sink)."""
    async with database.connection(autocommit=True) as connection:
        if not await repository.try_commit_lock(connection, sink_id):
            yield None
            return
        try:
            yield CommitLock(connection, sink_id)
        finally:
            await _release(connection, sink_id)


@asynccontextmanager
async def holding(database: Database, sink_id: int, timeout_seconds: float, action: str) -> AsyncIterator[CommitLock]:
    """The lock, waiting at most `timeout_seconds` for its holder; Unavailable (nothing changed) after that."""
    async with database.connection(autocommit=True) as connection:
        if not await repository.wait_commit_lock(connection, sink_id, timeout_seconds):
            raise Unavailable(
                f"{action}: the sink's committer has held its commit lock for more than {timeout_seconds:g} s "
                "(an Iceberg commit in progress), so nothing was changed. Retry; if this persists, look at the "
                "committer's last error in the admin API (GET /api/v1/sinks/<name>)"
            )
        try:
            yield CommitLock(connection, sink_id)
        finally:
            await _release(connection, sink_id)


async def _release(connection: AsyncConnection, sink_id: int) -> None:
    # A lost connection released the lock with it: nothing to release, and the error is not this caller's.
    with suppress(DBAPIError):
        await repository.release_commit_lock(connection, sink_id)
