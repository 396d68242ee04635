"""The metastore's connection pool: a call that finds no free connection is UNAVAILABLE (a retry), and counted."""

from __future__ import annotations

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
