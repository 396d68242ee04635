"""The log's statements on the parts of a multi-writer epoch (epoch_parts): stored, read, dropped."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.log import path_claims
from coordinator_service.log.models import (
    EpochPart,
)


async def store_part(
    session: AsyncSession, sink_id: int, epoch: int, writer_id: int, writer_term: int, metadata: bytes
) -> list[bytes]:
    """Keep one writer's part of an epoch (replacing its earlier one); return the epoch's parts of that term."""
    await session.execute(
        insert(EpochPart)
        .values(sink_id=sink_id, epoch=epoch, writer_id=writer_id, writer_term=writer_term, metadata_=metadata)
        .on_conflict_do_update(
            index_elements=[EpochPart.sink_id, EpochPart.epoch, EpochPart.writer_id],
            set_={"writer_term": writer_term, "metadata": metadata, "created_at": func.now()},
        )
    )
    statement = (
        select(EpochPart.metadata_)
        .where(EpochPart.sink_id == sink_id, EpochPart.epoch == epoch, EpochPart.writer_term == writer_term)
        .order_by(EpochPart.writer_id)
    )
    return list((await session.execute(statement)).scalars().all())


async def part_of(session: AsyncSession, sink_id: int, epoch: int, writer_id: int) -> bytes | None:
    """The writer's stored part of the epoch, if any."""
    statement = select(EpochPart.metadata_).where(
        EpochPart.sink_id == sink_id, EpochPart.epoch == epoch, EpochPart.writer_id == writer_id
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def drop_parts(session: AsyncSession, sink_id: int, epoch: int | None = None) -> None:
    """Forget the parts of an epoch once it is persisted (its attempt took their paths over), or every part of the
    sink: a new writer term, whose parts' paths are garbage."""
    statement = delete(EpochPart).where(EpochPart.sink_id == sink_id)
    if epoch is not None:
        statement = statement.where(EpochPart.epoch == epoch)
    else:
        await path_claims.discard_parts(session, sink_id)
    await session.execute(statement)
