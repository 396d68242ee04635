"""Writers that reuse the deterministic names of orphans the sweep is deleting."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.torture.races.harness import OWN, RaceRun, age

SETTINGS: dict[str, Any] = {"orphan_grace_seconds": 1.0, "orphan_sweep_interval_seconds": 1.0}
EPOCHS = 12


async def act(run: RaceRun) -> None:
    await run.register(-1)
    sweeper = asyncio.create_task(run.sweep_all_along())
    epoch, planted = 0, -1
    while epoch <= EPOCHS:
        name = f"epoch-{run.numbering}-{epoch}-task-0"
        if planted < epoch:
            # A killed task's file under the name the next attempt uses, older than the grace: an orphan.
            orphan = await run.write(OWN, [10**9 + epoch], name)
            await asyncio.to_thread(age, orphan, 30.0)
            planted = epoch
            await asyncio.sleep(run.rng.uniform(0, 0.3))  # the sweep may be deleting it now
        if await run.pre_commit(epoch, [OWN], {f"0/{OWN}": name}) and await run.commit_checkpoint(epoch):
            epoch += 1
        else:
            await asyncio.sleep(0.2)  # a Spark job's restart takes longer
            await run.restart()
            epoch = run.checkpoint + 1
    sweeper.cancel()
    await asyncio.gather(sweeper, return_exceptions=True)
