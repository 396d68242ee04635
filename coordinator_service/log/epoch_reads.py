"""The log's reads of epochs (pending_sink_state): one, the newest, those in a range, those not committed, those with
work for the committer."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log.models import (
    EpochRecord,
    Sink,
    SinkTableRecord,
)


async def epoch_row(session: AsyncSession, sink_id: int, epoch: int, *, for_update: bool = False) -> EpochRecord | None:
    statement = select(EpochRecord).where(EpochRecord.sink_id == sink_id, EpochRecord.epoch == epoch)
    if for_update:
        statement = statement.with_for_update()
    return (await session.execute(statement)).scalar_one_or_none()


async def seconds_since_last_snapshot(session: AsyncSession, sink_id: int) -> float | None:
    """Seconds, by the database's clock, since the sink's newest epoch that a snapshot holds was marked COMMITTED (by
    any process or replica); None when the log keeps none (no commit yet, or RETENTION_EPOCHS 0 pruned it)."""
    statement = (
        select(func.extract("epoch", func.now() - EpochRecord.updated_at))
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.status == EpochStatus.COMMITTED,
            EpochRecord.snapshot_id.is_not(None),
        )
        .order_by(EpochRecord.epoch.desc())
        .limit(1)
    )
    seconds = await session.scalar(statement)
    return None if seconds is None else float(seconds)


async def newest_epoch(session: AsyncSession, sink_id: int) -> int | None:
    """The sink's highest epoch in the log; None when it has none."""
    statement = select(func.max(EpochRecord.epoch)).where(EpochRecord.sink_id == sink_id)
    newest: int | None = await session.scalar(statement)
    return newest


async def epochs_between(session: AsyncSession, sink_id: int, above: int, at_or_below: int) -> Sequence[EpochRecord]:
    """Rows with above < epoch <= at_or_below, in epoch order."""
    statement = (
        select(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.epoch > above,
            EpochRecord.epoch <= at_or_below,
        )
        .order_by(EpochRecord.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def sink_and_checkpointed_pending(
    session: AsyncSession, sink_id: int, limit: int
) -> tuple[Sink | None, Sequence[EpochRecord], dict[str, int]]:
    """The sink row, its PENDING epochs at or below its checkpointed epoch, oldest first, at most `limit`, and the
    newest epoch each of its tables holds: what a commit pass starts from, in one statement."""
    tables = (
        select(func.json_object_agg(SinkTableRecord.table_identifier, SinkTableRecord.committed_epoch))
        .where(SinkTableRecord.sink_id == Sink.id)
        .scalar_subquery()
    )
    statement = (
        select(Sink, EpochRecord, tables)
        .outerjoin(
            EpochRecord,
            and_(
                EpochRecord.sink_id == Sink.id,
                EpochRecord.status == EpochStatus.PENDING,
                EpochRecord.epoch <= Sink.checkpointed_epoch,
            ),
        )
        .where(Sink.id == sink_id)
        .order_by(EpochRecord.epoch)
        .limit(limit)
        .execution_options(populate_existing=True)
    )
    rows = (await session.execute(statement)).all()
    if not rows:
        return None, [], {}
    return rows[0][0], [epoch for _, epoch, _ in rows if epoch is not None], dict(rows[0][2] or {})


async def pending_epochs_at_or_below(
    session: AsyncSession, sink_id: int, epoch: int, limit: int
) -> Sequence[EpochRecord]:
    statement = (
        select(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.status == EpochStatus.PENDING,
            EpochRecord.epoch <= epoch,
        )
        .order_by(EpochRecord.epoch)
        .limit(limit)
    )
    return (await session.execute(statement)).scalars().all()


async def pending_epochs_above(session: AsyncSession, sink_id: int, epoch: int) -> Sequence[EpochRecord]:
    statement = (
        select(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.status == EpochStatus.PENDING,
            EpochRecord.epoch > epoch,
        )
        .order_by(EpochRecord.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def epochs_not_committed(session: AsyncSession, sink_id: int) -> Sequence[EpochRecord]:
    statement = (
        select(EpochRecord)
        .where(EpochRecord.sink_id == sink_id, EpochRecord.status != EpochStatus.COMMITTED)
        .order_by(EpochRecord.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def epochs_for_update(session: AsyncSession, sink_id: int, epochs: Sequence[int]) -> dict[int, EpochRecord]:
    """The rows of these epochs (those that still exist), row-locked for the rest of the transaction."""
    statement = (
        select(EpochRecord)
        .where(EpochRecord.sink_id == sink_id, EpochRecord.epoch.in_(epochs))
        .order_by(EpochRecord.epoch)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return {row.epoch: row for row in (await session.execute(statement)).scalars().all()}


async def sink_ids_with_commit_work(session: AsyncSession) -> list[int]:
    """Sinks with a PENDING epoch at or below their recorded checkpoint."""
    statement = (
        select(Sink.id)
        .where(
            select(EpochRecord.epoch)
            .where(
                EpochRecord.sink_id == Sink.id,
                EpochRecord.status == EpochStatus.PENDING,
                EpochRecord.epoch <= Sink.checkpointed_epoch,
            )
            .exists()
        )
        .order_by(Sink.id)
    )
    return list((await session.execute(statement)).scalars().all())


async def epochs_newest_first(
    session: AsyncSession, sink_id: int, status: EpochStatus | None, below_epoch: int | None, limit: int
) -> Sequence[EpochRecord]:
    """A page of the sink's epochs, newest first, without their (possibly large) metadata."""
    statement = (
        select(EpochRecord)
        .options(defer(EpochRecord.metadata_, raiseload=True))
        .where(EpochRecord.sink_id == sink_id)
        .order_by(EpochRecord.epoch.desc())
        .limit(limit)
    )
    if status is not None:
        statement = statement.where(EpochRecord.status == status)
    if below_epoch is not None:
        statement = statement.where(EpochRecord.epoch < below_epoch)
    return (await session.execute(statement)).scalars().all()
