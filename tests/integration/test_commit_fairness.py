"""Many sinks, few commit slots: a busy sink does not starve the others."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.log import sink_rows
from coordinator_service.log.models import Sink
from tests.fixtures.admin import AdminFactory, commit_lock_held, eventually, sink_id_of


async def test_a_busy_sink_does_not_starve_an_idle_one(admin_factory: AdminFactory) -> None:
    """Defect 4: a pass that loops while work keeps coming (sleeping its commit interval inside the slot)."""
    admin = await admin_factory(commit_concurrency=1, commit_interval_seconds=0.5)
    busy = await admin.register("busy")
    idle = await admin.register("idle")
    await admin.pre_commit("busy", busy, 0, 0)
    await admin.checkpoint("busy", busy, 0, wait=False)

    async def keep_busy() -> None:
        """A sink whose next epoch is always checkpointed before its committer looks again."""
        epoch = 1
        while True:
            await admin.pre_commit("busy", busy, epoch, epoch * 10)
            await admin.checkpoint("busy", busy, epoch, wait=False)
            epoch += 1
            await asyncio.sleep(0.1)  # a stream's next micro-batch, not a wait for an effect

    feeder = asyncio.create_task(keep_busy())
    try:
        await admin.pre_commit("idle", idle, 0, 1000)
        # Bounded by a commit interval or two, not by how long the busy sink keeps getting work.
        async with asyncio.timeout(15.0):
            assert await admin.checkpoint("idle", idle, 0) == 0
        assert not feeder.done()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder


async def test_writers_waiting_for_their_commits_are_not_woken_by_the_other_sinks(
    admin_factory: AdminFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity defect: every commit pass in the process, of any sink, woke every writer waiting for its commit
    (CommitCheckpoint with wait: a stop, the end of an availableNow run), and each read its sink from the log again:
    N writers waiting while N sinks commit read N * N rows. A writer waits for its own sink's passes here, and reads
    the log again after one, or every POLL_INTERVAL_SECONDS for a commit by another process."""
    admin = await admin_factory(poll_interval_seconds=600, commit_interval_seconds=0)
    waiting = [f"waiting{number}" for number in range(5)]
    busy = [f"busy{number}" for number in range(5)]
    registrations = {name: await admin.register(name, table=f"db.{name}") for name in waiting + busy}
    reads: Counter[int] = Counter()
    read_sink = sink_rows.sink_by_id

    async def counted_read(session: AsyncSession, sink_id: int) -> Sink | None:
        reads[sink_id] += 1
        return await read_sink(session, sink_id)

    monkeypatch.setattr(sink_rows, "sink_by_id", counted_read)
    waiting_ids = [sink_id_of(database_url, name) for name in waiting]
    async with contextlib.AsyncExitStack() as locks:
        for name, sink_id in zip(waiting, waiting_ids, strict=True):
            await locks.enter_async_context(commit_lock_held(database_url, sink_id))  # their commits cannot land
            await admin.pre_commit(name, registrations[name], 0, 0)
        writers = [asyncio.create_task(admin.checkpoint(name, registrations[name], 0)) for name in waiting]
        try:

            async def all_read() -> bool:
                return all(reads[sink_id] >= 1 for sink_id in waiting_ids)

            await eventually(all_read, "every waiting writer's first read of its sink")
            before = sum(reads[sink_id] for sink_id in waiting_ids)
            for epoch in range(3):
                for name in busy:
                    await admin.pre_commit(name, registrations[name], epoch, epoch * 10)
                    assert await admin.checkpoint(name, registrations[name], epoch) == epoch
            # At most the read that follows each waiting sink's own pass (which finds its lock held), if it had not
            # come yet: not one per pass of the 15 commits of the busy sinks.
            assert sum(reads[sink_id] for sink_id in waiting_ids) - before <= len(waiting)
            assert not any(writer.done() for writer in writers)
        finally:
            for writer in writers:
                writer.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
