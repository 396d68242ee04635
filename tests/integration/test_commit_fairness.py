"""Many sinks, few commit slots: a busy sink does not starve the others."""

from __future__ import annotations

import asyncio
import contextlib

from tests.fixtures.admin import AdminFactory


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
