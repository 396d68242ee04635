"""Which replica reports the gauges read from the log: one at a time, so that sum() over replicas counts each sink
once.

Every replica reads the same log, so every replica's pending epochs, committed epoch or last commit of a sink are
the same numbers: exported by all of them, `sum(sink_coordinator_pending_epochs)` would count each sink once per
replica (and the scrape would carry them once per replica). The lease is a PostgreSQL session-level advisory lock
on a connection of its own: a scrape takes it if it is free, the replica holding it reports the log's gauges, and
the others report only what is theirs (their committers, pools, loops).

The lease goes with its connection (the replica died, the connection broke, a failover) and the next replica
scraped takes it; it is given up after METRICS_REPORTER_IDLE_SECONDS without a scrape, so that a replica nobody
scrapes (taken out of the Service, a process started by hand against the same metastore) does not keep it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg
import structlog

from coordinator_service.log.database import Database

log = structlog.get_logger(__name__)

# Advisory lock class of the lease ("SM"), apart from the commit lock's and the admission lock's classes.
REPORTER_LOCK_CLASS: Final = 0x534D
REPORTER_LOCK_KEY: Final = 0

# Held already by this session, or taken now if free; pg_try_advisory_lock again would stack a second hold.
_TAKE: Final = """
    SELECT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
          AND classid = %(class_id)s AND objid = %(key)s AND objsubid = 2
    ) OR pg_try_advisory_lock(%(class_id)s, %(key)s)
"""

_GIVE_UP: Final = "SELECT pg_advisory_unlock(%(class_id)s, %(key)s)"


class ReporterLease:
    def __init__(self, database: Database, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: seconds from any origin, for the time since the last scrape (a test's own clock)."""
        self._database = database
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._held = False
        self._last_scrape = 0.0
        # One take at a time: a scrape that gave up on a stalled one leaves it running.
        self._taking = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._give_up_when_idle(), name="reporter-lease")

    async def stop(self) -> None:
        """Give the lease up at once (another replica takes it at its next scrape)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.release()

    @property
    def held(self) -> bool:
        """Whether this replica held the lease at its last scrape."""
        return self._held

    async def take(self) -> bool:
        """At a scrape: whether this replica reports the log's gauges (taking the lease if it is free). A failure
        to reach the metastore is the caller's (the lease is then not held)."""
        self._last_scrape = self._clock()
        async with self._taking:
            return await self._take()

    async def _take(self) -> bool:
        try:
            if self._connection is None or self._connection.closed:
                self._connection = await psycopg.AsyncConnection.connect(
                    self._database.libpq_url, autocommit=True, **self._database.options.libpq()
                )
            cursor = await self._connection.execute(_TAKE, {"class_id": REPORTER_LOCK_CLASS, "key": REPORTER_LOCK_KEY})
            row = await cursor.fetchone()
        except BaseException:
            await self.release(unlock=False)
            raise
        held = bool(row and row[0])
        if held != self._held:
            log.info("this replica reports the log's gauges" if held else "another replica reports the log's gauges")
        self._held = held
        return held

    async def _give_up_when_idle(self) -> None:
        while True:
            await asyncio.sleep(self._idle_seconds / 4)
            if self._held and self._clock() - self._last_scrape > self._idle_seconds:
                log.info("not scraped for a while: another replica may report the log's gauges")
                await self.release()

    async def release(self, unlock: bool = True) -> None:
        """Give the lease up and close its connection. `unlock`: say so to the server first, so that the next replica
        scraped takes it at once (a closed connection's lock goes only when its server process has ended, a moment
        later); not after a failure on that connection."""
        held, self._held = self._held, False
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if unlock and held and not connection.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._database.options.stall_seconds):
                    await connection.execute(_GIVE_UP, {"class_id": REPORTER_LOCK_CLASS, "key": REPORTER_LOCK_KEY})
        with contextlib.suppress(Exception):
            await connection.close()
