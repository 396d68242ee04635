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
from psycopg.errors import LockNotAvailable
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator_service.contract.errors import CommitLockLost, Unavailable
from coordinator_service.log.database import Database

COMMIT_LOCK_CLASS = 0x5343


async def try_commit_lock(connection: AsyncConnection, sink_id: int) -> bool:
    """Take the sink's session-level commit lock without waiting; held until released or disconnected."""
    result = await connection.execute(
        text("SELECT pg_try_advisory_lock(:class_id, :sink_id)"),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )
    return bool(result.scalar_one())


async def release_commit_lock(connection: AsyncConnection, sink_id: int) -> None:
    await connection.execute(
        text("SELECT pg_advisory_unlock(:class_id, :sink_id)"),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )


async def wait_commit_lock(connection: AsyncConnection, sink_id: int, timeout_seconds: float) -> bool:
    """Take the sink's session-level commit lock on an autocommit connection, waiting at most timeout_seconds;
    False if it is still held by another session then."""
    # The wait is bounded by lock_timeout alone (not by the session's statement_timeout, maybe shorter).
    await connection.execute(
        text("SELECT set_config('lock_timeout', :timeout, false), set_config('statement_timeout', '0', false)"),
        {"timeout": f"{max(1, int(timeout_seconds * 1000))}ms"},
    )
    try:
        await connection.execute(
            text("SELECT pg_advisory_lock(:class_id, :sink_id)"),
            {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
        )
    except DBAPIError as error:
        if not isinstance(error.orig, LockNotAvailable):
            raise
        return False
    finally:
        await connection.execute(text("RESET lock_timeout"))
        await connection.execute(text("RESET statement_timeout"))
    return True


async def holds_commit_lock(connection: AsyncConnection, sink_id: int) -> bool:
    """Whether this connection's session holds the sink's commit lock, in PostgreSQL's own view of its locks."""
    result = await connection.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND classid = :class_id AND objid = :sink_id AND objsubid = 2 AND granted)"
        ),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )
    return bool(result.scalar_one())


log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CommitLock:
    connection: AsyncConnection
    sink_id: int

    async def verify(self) -> None:
        """Raise CommitLockLost unless this session still holds the lock (checked in PostgreSQL's own view)."""
        try:
            held = await holds_commit_lock(self.connection, self.sink_id)
        except DBAPIError as error:
            raise CommitLockLost(f"the commit lock of sink id {self.sink_id} was lost with its connection") from error
        if not held:
            raise CommitLockLost(f"the commit lock of sink id {self.sink_id} is no longer held by this session")


@asynccontextmanager
async def try_holding(database: Database, sink_id: int) -> AsyncIterator[CommitLock | None]:
    """The lock if it is free now, else None (another committer or operator holds the sink)."""
    async with database.connection(autocommit=True) as connection:
        if not await try_commit_lock(connection, sink_id):
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
        if not await wait_commit_lock(connection, sink_id, timeout_seconds):
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
        await release_commit_lock(connection, sink_id)
