"""The metastore's connection pool: a call that finds no free connection is UNAVAILABLE (a retry), and counted."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import pytest
from sqlalchemy import text

from coordinator_service import metrics
from coordinator_service.contract.errors import Unavailable
from coordinator_service.log.database import ConnectionOptions, Database, normalize_url
from coordinator_service.metrics import scrape as metrics_scrape


async def test_no_free_connection_is_unavailable_within_the_pool_timeout_and_counted(database_url: str) -> None:
    """On-call review: DATABASE_POOL_TIMEOUT_SECONDS says the call answers UNAVAILABLE, but SQLAlchemy's pool
    timeout reached the gRPC adapter as an unknown error (UNKNOWN, which the writer does not retry)."""
    database = Database(normalize_url(database_url), ConnectionOptions(pool_size=1, pool_timeout_seconds=0.2))
    timeouts = metrics.METASTORE_POOL_TIMEOUTS._value.get()  # type: ignore[attr-defined]
    try:
        async with AsyncExitStack() as held:
            for _ in range(2):  # the pool's connection and its one overflow
                await held.enter_async_context(database.connection())
            assert database.pool_gauges() == metrics_scrape.PoolGauges(in_use=2, idle=0, most=2)
            started = time.monotonic()
            with pytest.raises(Unavailable, match=r"no free metastore connection within 0\.2 s"):
                async with database.transaction() as session:
                    await session.execute(text("SELECT 1"))
            assert time.monotonic() - started < 2
        assert metrics.METASTORE_POOL_TIMEOUTS._value.get() == timeouts + 1  # type: ignore[attr-defined]
        async with database.transaction() as session:  # free again
            await session.execute(text("SELECT 1"))
    finally:
        await database.dispose()


async def test_a_transaction_cancelled_with_its_connection_busy_ends_cancelled(database_url: str) -> None:
    """A task cancelled while its connection is busy (the key index's COPY started when the coordinator closed
    under a commit pass) ends cancelled. The rollback then fails ("another command is already in progress"), and
    was taken for a metastore outage, which the key index's record tolerates: the pass swallowed its cancellation
    and went on to the next step, where the closing coordinator waited for it forever. The pool's next caller gets
    a working connection."""
    database = Database(normalize_url(database_url), ConnectionOptions(pool_size=1, pool_timeout_seconds=5))
    busy = asyncio.Event()

    async def copy_never_ended() -> None:
        async with database.transaction() as session:
            await session.execute(text("CREATE TEMPORARY TABLE copied (value integer)"))
            connection = await session.connection()
            driver = (await connection.get_raw_connection()).driver_connection
            driver.pgconn.send_query(b"COPY copied FROM STDIN")  # the COPY is started, never ended
            busy.set()
            await asyncio.Event().wait()

    try:
        task = asyncio.create_task(copy_never_ended())
        await busy.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with database.transaction() as session:
            assert (await session.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await database.dispose()
