"""A two-writer sink whose first part waits for the second past the orphan grace, beside the sweep."""

from __future__ import annotations

import asyncio
from typing import Any

from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.engine.writer_requests import PreCommitRequest
from tests.torture.races.harness import OWN, SINK, RaceRun, age

SETTINGS: dict[str, Any] = {"orphan_grace_seconds": 1.0, "orphan_sweep_interval_seconds": 1.0}
EPOCHS = 8


async def act(run: RaceRun) -> None:
    run.writer_count = 2
    await run.register(-1)
    sweeper = asyncio.create_task(run.sweep_all_along())
    epoch = 0
    while epoch <= EPOCHS:
        if await _epoch(run, epoch) and await run.commit_checkpoint(epoch):
            epoch += 1
        else:
            await run.restart()
            epoch = run.checkpoint + 1
    sweeper.cancel()
    await asyncio.gather(sweeper, return_exceptions=True)


async def _epoch(run: RaceRun, epoch: int) -> bool:
    """The first writer's part is stored and waits; its file ages past the grace while the sweep runs; then the
    second writer's part completes the epoch."""
    rows = run.records(epoch, OWN)
    first, second = [await run.write(OWN, rows[writer::2]) for writer in range(2)]
    coordinator = run.runtime.coordinator
    waiting = asyncio.create_task(coordinator.pre_commit(PreCommitRequest(SINK, epoch, run.term, (first,))))
    for _ in range(100):
        stored = await run.query("SELECT count(*) FROM epoch_parts WHERE epoch = %s", epoch)
        if stored[0][0] or waiting.done():
            break
        await asyncio.sleep(0.01)
    if run.rng.random() < 0.7:
        await asyncio.to_thread(age, first, 30.0)
        run.facts["parts aged past the grace"] += 1
    await asyncio.sleep(run.rng.uniform(0, 0.5))  # the second writer is slow; the sweep runs meanwhile
    try:
        await asyncio.gather(
            waiting, coordinator.pre_commit(PreCommitRequest(SINK, epoch, run.term, (second,), writer_id=1))
        )
    except CoordinatorError:
        run.facts["pre-commits refused"] += 1
        return False
    run.record(epoch, [OWN])
    return True
