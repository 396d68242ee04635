"""The commit lock lost in the middle of an append, and forced aborts by another holder, with no cleanup delay."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from coordinator_service.log.commit_lock import COMMIT_LOCK_CLASS
from coordinator_service.log.database import libpq_url
from tests.torture.races.harness import RaceRun

SETTINGS: dict[str, Any] = {"cleanup_delay_seconds": 0.0}
EPOCHS = 25


async def act(run: RaceRun) -> None:
    tables = run.runtime.iceberg
    append = tables.append

    def slow_append(*args: Any, **kwargs: Any) -> int:
        # After the committer verified its lock: a window in which the lock can vanish.
        time.sleep(run.rng.uniform(0, 0.25))
        return append(*args, **kwargs)

    tables.append = slow_append  # type: ignore[method-assign]
    await run.register(-1)
    writer = asyncio.create_task(run.stream(EPOCHS, pause=0.05))
    while not writer.done():
        await asyncio.sleep(run.rng.uniform(0.02, 0.15))
        if run.rng.random() < 0.6:
            run.facts["commit locks terminated"] += await _terminate_lock_holder(run)
        pending = await run.pending_epochs()
        if pending and run.rng.random() < 0.4:
            await run.force_abort(run.rng.choice(pending))
    await writer
    tables.append = append  # type: ignore[method-assign]


async def _terminate_lock_holder(run: RaceRun) -> int:
    async with await psycopg.AsyncConnection.connect(libpq_url(run.database_url), autocommit=True) as db:
        cursor = await db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND granted",
            (COMMIT_LOCK_CLASS,),
        )
        return sum(1 for (terminated,) in await cursor.fetchall() if terminated)
