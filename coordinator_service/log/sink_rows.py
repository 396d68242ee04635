"""The log's statements on sinks: find, create, delete, suspend; the overviews (counts of each sink's epochs, who
writes which table); when writers last called."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import aliased

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log.models import (
    EpochRecord,
    Sink,
    SinkTableRecord,
    VerificationRecord,
)


class RowLock(enum.Enum):
    """A row lock a read takes for the rest of its transaction."""

    # FOR UPDATE: the transaction changes the row; others wait to change or lock it.
    UPDATE = enum.auto()
    # FOR SHARE: the row must not change until the transaction ends; others may share it.
    SHARE = enum.auto()


async def sink_by_name(session: AsyncSession, name: str, *, lock: RowLock | None = None) -> Sink | None:
    """The sink row, with `lock` taken on it for the rest of the transaction."""
    statement = select(Sink).where(Sink.name == name)
    if lock is not None:
        statement = statement.with_for_update(read=lock is RowLock.SHARE)
    return (await session.execute(statement)).scalar_one_or_none()


async def sink_by_id(session: AsyncSession, sink_id: int, *, lock: bool = False) -> Sink | None:
    """The sink row, read again; with lock, row-locked (FOR UPDATE) for the rest of the transaction."""
    return await session.get(Sink, sink_id, populate_existing=True, with_for_update=lock or None)


async def all_sinks(session: AsyncSession) -> Sequence[Sink]:
    return (await session.execute(select(Sink).order_by(Sink.name))).scalars().all()


_INSERT_SINK_IF_ABSENT = """
    WITH created AS (
        INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch, committed_epoch, key_columns)
        VALUES (:name, :table, :catalog, :epoch, :epoch, CAST(:key_columns AS text[]))
        ON CONFLICT (name) DO NOTHING
        RETURNING id, table_identifier, committed_epoch
    )
    INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch)
    SELECT id, table_identifier, committed_epoch FROM created
"""


async def delete_sink(session: AsyncSession, sink_id: int) -> None:
    """The sink's row, and with it (cascades) its epochs, parts, tables and maintenance runs, and its claims; the marks
    of the deletions it made stay, without a sink, until their grace is over (path_claims.expire_marks)."""
    await session.execute(
        text("DELETE FROM epoch_files WHERE sink_id = :sink_id AND deleted_at IS NULL"), {"sink_id": sink_id}
    )
    await session.execute(delete(Sink).where(Sink.id == sink_id))


async def insert_sink_if_absent(
    session: AsyncSession,
    name: str,
    table: str,
    catalog: str,
    checkpointed_epoch: int,
    key_columns: Sequence[str] = (),
) -> None:
    """A new sink starts at the writer's checkpoint, checkpointed and committed, with its own table as its one table
    and `key_columns` as its key (none: an append stream)."""
    parameters = {
        "name": name,
        "table": table,
        "catalog": catalog,
        "epoch": checkpointed_epoch,
        "key_columns": list(key_columns),
    }
    await session.execute(text(_INSERT_SINK_IF_ABSENT), parameters)


async def set_suspended(session: AsyncSession, sink_id: int, reason: str | None) -> bool:
    """Suspend the sink with `reason` (None: resume it); whether that changed anything."""
    result = await session.execute(
        update(Sink)
        .where(Sink.id == sink_id, Sink.suspended_reason.is_distinct_from(reason))
        .values(suspended_reason=reason)
        .returning(Sink.id)
    )
    return result.scalar_one_or_none() is not None


async def record_stuck(session: AsyncSession, sink_id: int, reason: str, at: datetime) -> int | None:
    """Record that a committer stuck on the sink; the sink's resumes so far (None: the sink is gone)."""
    result = await session.execute(
        update(Sink)
        .where(Sink.id == sink_id)
        .values(committer_stuck_reason=reason, committer_stuck_at=at)
        .returning(Sink.resumes)
    )
    return result.scalar_one_or_none()


async def record_resume(session: AsyncSession, sink_id: int) -> None:
    """Count an operator's resume of the sink (every stuck committer follows it) and clear its stuck state."""
    await session.execute(
        update(Sink)
        .where(Sink.id == sink_id)
        .values(resumes=Sink.resumes + 1, committer_stuck_reason=None, committer_stuck_at=None)
    )


async def resumes_of(session: AsyncSession, sink_id: int) -> int | None:
    """The sink's resumes so far (None: the sink is gone)."""
    result = await session.execute(select(Sink.resumes).where(Sink.id == sink_id))
    return result.scalar_one_or_none()


@dataclass(frozen=True)
class EpochCounts:
    """A sink's epochs that are not committed yet, its last commit, and its writer's last call, as the log has them
    (the same on every replica; ages by the metastore's clock)."""

    pending: int = 0
    aborted: int = 0
    # Seconds since the oldest PENDING epoch was (last) pre-committed; None without a PENDING epoch.
    oldest_pending_age_seconds: float | None = None
    # The least PENDING epoch; None without one.
    oldest_pending_epoch: int | None = None
    # When the sink's committed epoch was marked COMMITTED; None when it was not (never, pruned, or an epoch an
    # operator aborted).
    last_commit_at: datetime | None = None
    # Seconds since its writer's last answered call (sinks.writer_last_call_at); None: none recorded.
    writer_last_call_age_seconds: float | None = None
    # When its newest epoch was (last) pre-committed: a PENDING one's latest attempt, another's first; None: the
    # log holds no epoch of it.
    last_precommit_at: datetime | None = None
    # How far verification proved its tables (the least over them; None: never verified), and whether the last
    # verification of one of them failed (sink_verifications).
    verified_epoch: int | None = None
    verification_failed: bool = False


async def sink_names(session: AsyncSession) -> list[str]:
    return list((await session.execute(select(Sink.name))).scalars())


async def sinks_with_epoch_counts(session: AsyncSession, name: str | None = None) -> list[tuple[Sink, EpochCounts]]:
    """Every sink (or the one named) with its pending and aborted counts, last commit and writer's call, by name."""
    pending = EpochRecord.status == EpochStatus.PENDING
    counts = (
        select(
            EpochRecord.sink_id,
            func.count().filter(pending).label("pending"),
            func.count().filter(EpochRecord.status == EpochStatus.ABORTED).label("aborted"),
            func.extract("epoch", func.now() - func.min(EpochRecord.updated_at).filter(pending)).label("age"),
            func.min(EpochRecord.epoch).filter(pending).label("oldest"),
        )
        .where(EpochRecord.status != EpochStatus.COMMITTED)
        .group_by(EpochRecord.sink_id)
        .subquery()
    )
    committed = aliased(EpochRecord)
    last_commit = (
        select(committed.updated_at)
        .where(
            committed.sink_id == Sink.id,
            committed.epoch == Sink.committed_epoch,
            committed.status == EpochStatus.COMMITTED,
        )
        .scalar_subquery()
    )
    writer_age = func.extract("epoch", func.now() - Sink.writer_last_call_at)
    newest = aliased(EpochRecord)
    # The newest epoch's row, found through the primary key (sink_id, epoch) from its end.
    last_precommit = (
        select(
            case((newest.status == EpochStatus.PENDING, newest.updated_at), else_=newest.created_at),
        )
        .where(newest.sink_id == Sink.id)
        .order_by(newest.epoch.desc())
        .limit(1)
        .scalar_subquery()
    )
    of_sink = VerificationRecord.sink_id == Sink.id
    verified_epoch = select(func.min(VerificationRecord.verified_epoch)).where(of_sink).scalar_subquery()
    verification_failed = select(func.bool_or(VerificationRecord.outcome == "failed")).where(of_sink).scalar_subquery()
    statement = (
        select(
            Sink,
            counts.c.pending,
            counts.c.aborted,
            counts.c.age,
            counts.c.oldest,
            last_commit,
            writer_age,
            last_precommit,
            verified_epoch,
            verification_failed,
        )
        .outerjoin(counts, counts.c.sink_id == Sink.id)
        .order_by(Sink.name)
    )
    if name is not None:
        statement = statement.where(Sink.name == name)
    rows = (await session.execute(statement)).all()
    return [
        (
            sink,
            EpochCounts(
                pending=pending_count or 0,
                aborted=aborted_count or 0,
                oldest_pending_age_seconds=None if age is None else float(age),
                oldest_pending_epoch=oldest,
                last_commit_at=committed_at,
                writer_last_call_age_seconds=None if call_age is None else float(call_age),
                last_precommit_at=precommitted_at,
                verified_epoch=verified_to,
                verification_failed=bool(failed),
            ),
        )
        for sink, pending_count, aborted_count, age, oldest, committed_at, call_age, precommitted_at, *verified in rows
        for verified_to, failed in [verified]
    ]


async def shared_tables(session: AsyncSession) -> dict[str, list[str]]:
    """Every table more than one sink writes, with the names of those sinks, by name."""
    shared = (
        select(SinkTableRecord.table_identifier)
        .group_by(SinkTableRecord.table_identifier)
        .having(func.count() > 1)
        .scalar_subquery()
    )
    statement = (
        select(SinkTableRecord.table_identifier, Sink.name)
        .join(Sink, Sink.id == SinkTableRecord.sink_id)
        .where(SinkTableRecord.table_identifier.in_(shared))
        .order_by(Sink.name)
    )
    writers: dict[str, list[str]] = {}
    for table, sink in (await session.execute(statement)).all():
        writers.setdefault(table, []).append(sink)
    return writers


async def sinks_of_table(session: AsyncSession, table: str) -> list[tuple[Sink, int]]:
    """Every sink writing the table (usually one), whose markers its snapshots carry, with the newest epoch of the
    sink that the table holds."""
    statement = (
        select(Sink, SinkTableRecord.committed_epoch)
        .join(SinkTableRecord, SinkTableRecord.sink_id == Sink.id)
        .where(SinkTableRecord.table_identifier == table)
        .order_by(Sink.id)
    )
    return [(sink, committed_epoch) for sink, committed_epoch in (await session.execute(statement)).all()]


# Every sink's note in one statement. A sink whose row another transaction holds (a registration, an operator's
# action, a commit's record) is skipped, not waited for: the statement never waits, so it holds up no other sink's
# note and takes part in no deadlock; the skipped sinks are returned, for the next round. A locked row changed since
# the statement's snapshot is checked again on its newest version (READ COMMITTED), the time condition included.
_RECORD_WRITER_CALLS = """
    WITH c AS (
        SELECT * FROM unnest(CAST(:sinks AS text[]), CAST(:agos AS double precision[])) AS c(name, ago)
    ), taken AS (
        SELECT s.id, c.ago FROM sinks s JOIN c ON c.name = s.name ORDER BY s.id FOR UPDATE OF s SKIP LOCKED
    ), moved AS (
        UPDATE sinks s SET writer_last_call_at = now() - make_interval(secs => taken.ago)
        FROM taken WHERE s.id = taken.id
          AND (s.writer_last_call_at IS NULL OR s.writer_last_call_at < now() - make_interval(secs => taken.ago))
    )
    SELECT s.name FROM sinks s JOIN c ON c.name = s.name WHERE s.id NOT IN (SELECT id FROM taken)
"""


async def record_writer_calls(connection: AsyncConnection, calls: Mapping[str, float]) -> set[str]:
    """Each sink's writer called `calls[sink]` seconds ago: one statement for every sink (autocommit), moving each
    time forward only; the sinks it skipped because another transaction held their rows."""
    sinks = sorted(calls)
    result = await connection.execute(
        text(_RECORD_WRITER_CALLS), {"sinks": sinks, "agos": [calls[sink] for sink in sinks]}
    )
    return set(result.scalars())


async def sinks_writing(session: AsyncSession, tables: Sequence[str], besides: str = "") -> dict[str, list[str]]:
    """The names of the sinks (but `besides`) writing each of these tables, by name; a table none writes is left
    out."""
    statement = (
        select(SinkTableRecord.table_identifier, Sink.name)
        .join(Sink, Sink.id == SinkTableRecord.sink_id)
        .where(SinkTableRecord.table_identifier.in_(tables), Sink.name != besides)
        .order_by(Sink.name)
    )
    writers: dict[str, list[str]] = {}
    for table, name in (await session.execute(statement)).all():
        writers.setdefault(table, []).append(name)
    return writers
