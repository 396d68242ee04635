"""The log's statements on maintenance runs: which sinks are due, a run started and finished, the last runs kept."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.log.models import (
    MaintenanceRun,
    MaintenanceTrigger,
    Sink,
)


async def maintenance_candidates(session: AsyncSession) -> Sequence[tuple[Sink, datetime | None, datetime | None]]:
    """Every sink with the start of its last maintenance run and of its last orphan sweep (None: never)."""
    last_run = select(func.max(MaintenanceRun.started_at)).where(MaintenanceRun.sink_id == Sink.id).scalar_subquery()
    last_sweep = (
        select(func.max(MaintenanceRun.started_at))
        .where(MaintenanceRun.sink_id == Sink.id, MaintenanceRun.swept.is_(True))
        .scalar_subquery()
    )
    rows = await session.execute(select(Sink, last_run, last_sweep).order_by(Sink.id))
    return [(row[0], row[1], row[2]) for row in rows.all()]


async def last_sweep_at(session: AsyncSession, sink_id: int) -> datetime | None:
    statement = select(func.max(MaintenanceRun.started_at)).where(
        MaintenanceRun.sink_id == sink_id, MaintenanceRun.swept.is_(True)
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def start_maintenance_run(session: AsyncSession, sink_id: int, trigger: MaintenanceTrigger) -> MaintenanceRun:
    run = MaintenanceRun(sink_id=sink_id, trigger=trigger)
    session.add(run)
    await session.flush()
    await session.refresh(run)
    return run


async def finish_maintenance_run(session: AsyncSession, run: MaintenanceRun, keep: int) -> None:
    """Record the run's end (the caller set its outcome and counts) and forget runs older than the last `keep`."""
    run.finished_at = datetime.now(UTC)
    merged = await session.merge(run)
    await session.flush()
    oldest_kept = (
        select(MaintenanceRun.id)
        .where(MaintenanceRun.sink_id == merged.sink_id)
        .order_by(MaintenanceRun.id.desc())
        .offset(keep - 1)
        .limit(1)
        .scalar_subquery()
    )
    await session.execute(
        delete(MaintenanceRun).where(MaintenanceRun.sink_id == merged.sink_id, MaintenanceRun.id < oldest_kept)
    )


async def maintenance_runs(session: AsyncSession, sink_id: int, limit: int) -> Sequence[MaintenanceRun]:
    statement = (
        select(MaintenanceRun).where(MaintenanceRun.sink_id == sink_id).order_by(MaintenanceRun.id.desc()).limit(limit)
    )
    return (await session.execute(statement)).scalars().all()
