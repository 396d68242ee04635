"""Resets of a fan-out sink while its commit passes die between two tables' appends."""

from __future__ import annotations

import asyncio
from typing import Any

from coordinator_service import failpoints
from tests.torture.races.harness import OWN, RaceRun

SETTINGS: dict[str, Any] = {}
EPOCHS = 10
TABLES = (OWN, "db.eu", "db.us")


async def act(run: RaceRun) -> None:
    run.tables = TABLES
    hit = failpoints.hit

    async def counted(point: failpoints.Failpoint) -> None:
        try:
            await hit(point)
        except failpoints.FailpointError:
            run.facts["passes died between tables"] += 1
            failpoints.configure("")  # one death per arming: the next pass goes on from what the tables hold
            raise

    failpoints.hit = counted  # type: ignore[assignment]
    try:
        await _act(run)
    finally:
        failpoints.hit = hit  # type: ignore[assignment]


async def _act(run: RaceRun) -> None:
    await run.register(-1)

    def some_tables() -> list[str]:
        return [table for table in TABLES if run.rng.random() < 0.5]

    for _ in range(run.rng.randint(1, 2)):
        # A pass dies between two tables at the Nth time one gets there.
        failpoints.configure(f"{failpoints.Failpoint.COMMIT_BETWEEN_TABLES.value}=error@{run.rng.randint(1, 4)}")
        await run.stream(run.checkpoint + run.rng.randint(2, EPOCHS), pause=0.05, tables=some_tables)
        # The committer is at work on the last epochs (or failing between their tables) while the reset comes.
        await asyncio.sleep(run.rng.uniform(0, 0.2))
        await run.reset()
    failpoints.configure("")
    await run.stream(run.checkpoint + 3, tables=some_tables)
