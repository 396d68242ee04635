"""Every SQL statement the coordinator runs on the metastore, and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.errors import LockNotAvailable
from sqlalchemy import and_, case, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import aliased, defer

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import path_claims
from coordinator_service.log.models import (
    AbortCause,
    EpochPart,
    MaintenanceRun,
    PendingSinkState,
    Sink,
    WrittenTable,
)

# First key of the two-int advisory locks the committer takes per sink ("SC"); tests hold them as another committer.
COMMIT_LOCK_CLASS = 0x5343


async def sink_by_name(session: AsyncSession, name: str, *, lock: str | None = None) -> Sink | None:
    """The sink row; lock 'update' or 'share' takes the row lock for the rest of the transaction."""
    statement = select(Sink).where(Sink.name == name)
    if lock == "update":
        statement = statement.with_for_update()
    elif lock == "share":
        statement = statement.with_for_update(read=True)
    return (await session.execute(statement)).scalar_one_or_none()


async def sink_by_id(session: AsyncSession, sink_id: int, *, lock: bool = False) -> Sink | None:
    """The sink row, read again; with lock, row-locked (FOR UPDATE) for the rest of the transaction."""
    return await session.get(Sink, sink_id, populate_existing=True, with_for_update=lock or None)


async def all_sinks(session: AsyncSession) -> Sequence[Sink]:
    return (await session.execute(select(Sink).order_by(Sink.name))).scalars().all()


_INSERT_SINK_IF_ABSENT = """
    WITH created AS (
        INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch, committed_epoch)
        VALUES (:name, :table, :catalog, :epoch, :epoch)
        ON CONFLICT (name) DO NOTHING
        RETURNING id, table_identifier, committed_epoch
    )
    INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch)
    SELECT id, table_identifier, committed_epoch FROM created
"""


async def delete_sink(session: AsyncSession, sink_id: int) -> None:
    """The sink's row, and with it (cascades) its epochs, claims, parts, tables and maintenance runs."""
    await session.execute(delete(Sink).where(Sink.id == sink_id))


async def insert_sink_if_absent(
    session: AsyncSession, name: str, table: str, catalog: str, checkpointed_epoch: int
) -> None:
    """A new sink starts at the writer's checkpoint, checkpointed and committed, with its own table as its one table."""
    parameters = {"name": name, "table": table, "catalog": catalog, "epoch": checkpointed_epoch}
    await session.execute(text(_INSERT_SINK_IF_ABSENT), parameters)


# --------------------------------------------------------------------------------------- the tables of a sink


@dataclass(frozen=True)
class TableOfSink:
    """One of a sink's tables and the newest epoch it holds (see models.WrittenTable)."""

    sink_id: int
    table: str
    committed_epoch: int
    # The table's UUID as the first check of the sink found it (metastore_checks); None before.
    table_uuid: uuid.UUID | None = None


# The sink's own table first, then the others by name.
_TABLES_OF_SINKS = """
    SELECT t.sink_id, t.table_identifier, t.committed_epoch, t.table_uuid
    FROM sink_tables t JOIN sinks s ON s.id = t.sink_id
    WHERE t.sink_id = ANY(:sink_ids)
    ORDER BY t.sink_id, t.table_identifier <> s.table_identifier, t.table_identifier
"""


async def tables_of_sinks(session: AsyncSession, sink_ids: Sequence[int]) -> dict[int, list[TableOfSink]]:
    """The tables of each of these sinks, each sink's own first, then the others by name."""
    rows = await session.execute(text(_TABLES_OF_SINKS), {"sink_ids": list(sink_ids)})
    tables: dict[int, list[TableOfSink]] = {sink_id: [] for sink_id in sink_ids}
    for sink_id, table, committed_epoch, table_uuid in rows.all():
        tables[sink_id].append(TableOfSink(sink_id, table, committed_epoch, table_uuid))
    return tables


async def tables_of_sink(session: AsyncSession, sink_id: int) -> list[TableOfSink]:
    return (await tables_of_sinks(session, [sink_id]))[sink_id]


async def recorded_epochs(session: AsyncSession, sink_id: int) -> dict[str, int]:
    """The newest epoch each of the sink's tables holds, as the log records it."""
    return {table.table: table.committed_epoch for table in await tables_of_sink(session, sink_id)}


async def add_tables(session: AsyncSession, sink: Sink, tables: Sequence[str]) -> None:
    """Make these tables the sink's (those it has stay as they are), in the caller's transaction, which holds the
    sink's row lock: a new table holds every epoch up to the sink's committed one, none of which has files in it."""
    if not tables:
        return
    await session.execute(
        insert(WrittenTable)
        .values(
            [
                {"sink_id": sink.id, "table_identifier": table, "committed_epoch": sink.committed_epoch}
                for table in tables
            ]
        )
        .on_conflict_do_nothing(index_elements=[WrittenTable.sink_id, WrittenTable.table_identifier])
    )


async def record_table_uuid(session: AsyncSession, sink_id: int, table: str, table_uuid: uuid.UUID) -> None:
    await session.execute(
        update(WrittenTable)
        .where(WrittenTable.sink_id == sink_id, WrittenTable.table_identifier == table)
        .values(table_uuid=table_uuid)
    )


async def record_tables_at(session: AsyncSession, sink_id: int, held: Mapping[str, int]) -> None:
    """Set the newest epoch each of these tables holds, as found in the tables (a reconcile): forward or back."""
    for table, epoch in held.items():
        await session.execute(
            update(WrittenTable)
            .where(WrittenTable.sink_id == sink_id, WrittenTable.table_identifier == table)
            .values(committed_epoch=epoch, updated_at=func.now())
        )


async def set_suspended(session: AsyncSession, sink_id: int, reason: str | None) -> bool:
    """Suspend the sink with `reason` (None: resume it); whether that changed anything."""
    result = await session.execute(
        update(Sink)
        .where(Sink.id == sink_id, Sink.suspended_reason.is_distinct_from(reason))
        .values(suspended_reason=reason)
        .returning(Sink.id)
    )
    return result.scalar_one_or_none() is not None


async def remove_table(session: AsyncSession, sink_id: int, table: str) -> None:
    """The table stops being one of the sink's (an operator's way out of a table dropped for good)."""
    await session.execute(
        delete(WrittenTable).where(WrittenTable.sink_id == sink_id, WrittenTable.table_identifier == table)
    )


async def rebase_tables(session: AsyncSession, sink_id: int, epoch: int) -> None:
    """A new epoch numbering (the first writer after a reset): every table of the sink is at its first epoch."""
    await session.execute(
        update(WrittenTable).where(WrittenTable.sink_id == sink_id).values(committed_epoch=epoch, updated_at=func.now())
    )


# The sink's numbering is checked on its row locked (FOR SHARE: its newest version, a rebase that committed after
# the statement's snapshot included), not as the snapshot has it: a table row re-read at its newest version after
# waiting for a rebase must not take an epoch of the numbering before it.
_RECORD_TABLES = """
    WITH sink AS (
        SELECT id FROM sinks
        WHERE id = :sink_id AND incarnation = :incarnation AND generation = :generation FOR SHARE
    )
    UPDATE sink_tables t SET committed_epoch = r.epoch, updated_at = now()
    FROM unnest(CAST(:tables AS text[]), CAST(:table_epochs AS bigint[])) AS r(table_identifier, epoch)
    WHERE t.sink_id = (SELECT id FROM sink) AND t.table_identifier = r.table_identifier AND t.committed_epoch < r.epoch
"""


async def record_tables(connection: AsyncConnection, sink: Sink, held: Mapping[str, int]) -> None:
    """Record the newest epoch each of these tables holds (in the sink's numbering as `sink` has it; nothing
    after a reset or for another incarnation): a table's epoch only moves forward."""
    await connection.execute(text(_RECORD_TABLES), {**_table_parameters(held), **_numbering_parameters(sink)})


def _table_parameters(held: Mapping[str, int]) -> dict[str, object]:
    return {"tables": list(held), "table_epochs": list(held.values())}


def _numbering_parameters(sink: Sink) -> dict[str, object]:
    return {"sink_id": sink.id, "incarnation": sink.incarnation, "generation": sink.generation}


async def epoch_row(
    session: AsyncSession, sink_id: int, epoch: int, *, for_update: bool = False
) -> PendingSinkState | None:
    statement = select(PendingSinkState).where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
    if for_update:
        statement = statement.with_for_update()
    return (await session.execute(statement)).scalar_one_or_none()


async def newest_epoch(session: AsyncSession, sink_id: int) -> int | None:
    """The sink's highest epoch in the log; None when it has none."""
    statement = select(func.max(PendingSinkState.epoch)).where(PendingSinkState.sink_id == sink_id)
    newest: int | None = await session.scalar(statement)
    return newest


async def epochs_between(
    session: AsyncSession, sink_id: int, above: int, at_or_below: int
) -> Sequence[PendingSinkState]:
    """Rows with above < epoch <= at_or_below, in epoch order."""
    statement = (
        select(PendingSinkState)
        .where(
            PendingSinkState.sink_id == sink_id,
            PendingSinkState.epoch > above,
            PendingSinkState.epoch <= at_or_below,
        )
        .order_by(PendingSinkState.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def sink_and_checkpointed_pending(
    session: AsyncSession, sink_id: int, limit: int
) -> tuple[Sink | None, Sequence[PendingSinkState], dict[str, int]]:
    """The sink row, its PENDING epochs at or below its checkpointed epoch, oldest first, at most `limit`, and the
    newest epoch each of its tables holds: what a commit pass starts from, in one statement."""
    tables = (
        select(func.json_object_agg(WrittenTable.table_identifier, WrittenTable.committed_epoch))
        .where(WrittenTable.sink_id == Sink.id)
        .scalar_subquery()
    )
    statement = (
        select(Sink, PendingSinkState, tables)
        .outerjoin(
            PendingSinkState,
            and_(
                PendingSinkState.sink_id == Sink.id,
                PendingSinkState.status == EpochStatus.PENDING,
                PendingSinkState.epoch <= Sink.checkpointed_epoch,
            ),
        )
        .where(Sink.id == sink_id)
        .order_by(PendingSinkState.epoch)
        .limit(limit)
        .execution_options(populate_existing=True)
    )
    rows = (await session.execute(statement)).all()
    if not rows:
        return None, [], {}
    return rows[0][0], [epoch for _, epoch, _ in rows if epoch is not None], dict(rows[0][2] or {})


async def pending_epochs_at_or_below(
    session: AsyncSession, sink_id: int, epoch: int, limit: int
) -> Sequence[PendingSinkState]:
    statement = (
        select(PendingSinkState)
        .where(
            PendingSinkState.sink_id == sink_id,
            PendingSinkState.status == EpochStatus.PENDING,
            PendingSinkState.epoch <= epoch,
        )
        .order_by(PendingSinkState.epoch)
        .limit(limit)
    )
    return (await session.execute(statement)).scalars().all()


async def pending_epochs_above(session: AsyncSession, sink_id: int, epoch: int) -> Sequence[PendingSinkState]:
    statement = (
        select(PendingSinkState)
        .where(
            PendingSinkState.sink_id == sink_id,
            PendingSinkState.status == EpochStatus.PENDING,
            PendingSinkState.epoch > epoch,
        )
        .order_by(PendingSinkState.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def epochs_not_committed(session: AsyncSession, sink_id: int) -> Sequence[PendingSinkState]:
    statement = (
        select(PendingSinkState)
        .where(PendingSinkState.sink_id == sink_id, PendingSinkState.status != EpochStatus.COMMITTED)
        .order_by(PendingSinkState.epoch)
    )
    return (await session.execute(statement)).scalars().all()


async def insert_pending_epoch(
    session: AsyncSession,
    sink_id: int,
    epoch: int,
    metadata: bytes,
    file_count: int,
    record_count: int,
) -> None:
    session.add(
        PendingSinkState(
            sink_id=sink_id,
            epoch=epoch,
            status=EpochStatus.PENDING,
            metadata_=metadata,
            attempt=1,
            file_count=file_count,
            record_count=record_count,
            files_cleaned=False,
        )
    )
    await session.flush()


@dataclass(frozen=True)
class NewEpoch:
    """A first pre-commit of an epoch, to insert if its sink's term is current and the epoch is above committed."""

    sink_id: int
    epoch: int
    writer_term: int
    metadata: bytes
    file_count: int
    record_count: int
    paths: tuple[str, ...]
    # The tables other than the sink's own that its files name: each must be one of the sink's.
    tables: tuple[str, ...]
    # The claim of its paths must be made before this moment (Unix seconds; see path_claims), None without files.
    deadline: float | None


_INSERT_NEW_EPOCHS = """
    WITH files AS (
        SELECT * FROM unnest(CAST(%(file_sink_ids)s AS integer[]), CAST(%(file_epochs)s AS bigint[]),
                             CAST(%(file_paths)s AS text[])) AS f(sink_id, epoch, path)
    ), named AS (
        SELECT * FROM unnest(CAST(%(table_sink_ids)s AS integer[]), CAST(%(table_epochs)s AS bigint[]),
                             CAST(%(table_names)s AS text[])) AS n(sink_id, epoch, table_identifier)
    ), inserted AS (
        INSERT INTO pending_sink_state (sink_id, epoch, status, metadata, attempt, file_count, record_count,
                                        files_cleaned)
        SELECT s.id, r.epoch, CAST('PENDING' AS epoch_status), r.metadata, 1, r.file_count, r.record_count, false
        FROM unnest(CAST(%(sink_ids)s AS integer[]), CAST(%(epochs)s AS bigint[]), CAST(%(terms)s AS bigint[]),
                    CAST(%(metadata)s AS bytea[]), CAST(%(file_counts)s AS integer[]),
                    CAST(%(record_counts)s AS bigint[]), CAST(%(deadlines)s AS double precision[]))
             AS r(sink_id, epoch, term, metadata, file_count, record_count, deadline)
        JOIN sinks s ON s.id = r.sink_id
        WHERE s.writer_term = r.term AND s.committed_epoch < r.epoch AND s.writer_count = 1
          AND s.suspended_reason IS NULL
          AND (r.deadline IS NULL OR clock_timestamp() < to_timestamp(r.deadline))
          AND NOT EXISTS (SELECT 1 FROM files JOIN epoch_files e ON e.path = files.path
                          WHERE files.sink_id = r.sink_id AND files.epoch = r.epoch)
          AND NOT EXISTS (SELECT 1 FROM named
                          WHERE named.sink_id = r.sink_id AND named.epoch = r.epoch
                            AND NOT EXISTS (SELECT 1 FROM sink_tables t WHERE t.sink_id = named.sink_id
                                              AND t.table_identifier = named.table_identifier))
        FOR SHARE OF s
        ON CONFLICT (sink_id, epoch) DO NOTHING
        RETURNING sink_id, epoch
    ), claimed AS (
        INSERT INTO epoch_files (path, sink_id, epoch, attempt)
        SELECT files.path, files.sink_id, files.epoch, 1
        FROM files JOIN inserted ON inserted.sink_id = files.sink_id AND inserted.epoch = files.epoch
    )
    SELECT sink_id, epoch FROM inserted
"""


async def insert_new_epochs(connection: psycopg.AsyncConnection[Any], rows: Sequence[NewEpoch]) -> set[tuple[int, int]]:
    """Insert PENDING rows, and the files they hold, in one statement (on a plain psycopg connection); return
    the (sink_id, epoch) inserted.

    A row is inserted only where it is the plain case of a pre-commit: no row for the epoch yet, the
    writer's term current, the epoch above the committed one, one writer per sink, every table it names one of
    the sink's (an operator may remove one), no path with a claim or a
    deletion's mark, and its deadline not passed (path_claims). The sink rows are share-locked like in every
    pre-commit, so that a concurrent RegisterWriter sees
    (and aborts) the new rows or fences them. Rows not inserted are left to the general path, which answers
    them; two rows of one statement naming the same file fail the statement, and the general path answers.
    """
    files = [(row.sink_id, row.epoch, path) for row in rows for path in row.paths]
    named = [(row.sink_id, row.epoch, table) for row in rows for table in row.tables]
    cursor = await connection.execute(
        _INSERT_NEW_EPOCHS,
        {
            "sink_ids": [row.sink_id for row in rows],
            "epochs": [row.epoch for row in rows],
            "terms": [row.writer_term for row in rows],
            "metadata": [row.metadata for row in rows],
            "file_counts": [row.file_count for row in rows],
            "record_counts": [row.record_count for row in rows],
            "deadlines": [row.deadline for row in rows],
            "file_sink_ids": [sink_id for sink_id, _, _ in files],
            "file_epochs": [epoch for _, epoch, _ in files],
            "file_paths": [path for _, _, path in files],
            "table_sink_ids": [sink_id for sink_id, _, _ in named],
            "table_epochs": [epoch for _, epoch, _ in named],
            "table_names": [table for _, _, table in named],
        },
    )
    return {(int(sink_id), int(epoch)) for sink_id, epoch in await cursor.fetchall()}


async def abort_pending_above(
    session: AsyncSession, sink_id: int, epoch: int, reason: str, cause: AbortCause
) -> list[int]:
    result = await session.execute(
        update(PendingSinkState)
        .where(
            PendingSinkState.sink_id == sink_id,
            PendingSinkState.status == EpochStatus.PENDING,
            PendingSinkState.epoch > epoch,
        )
        .values(_aborted(reason, cause))
        .returning(PendingSinkState.epoch)
    )
    aborted = sorted(result.scalars().all())
    await path_claims.discard_epochs(session, sink_id, aborted, keep_for_rerun=cause == AbortCause.RECOVERY)
    return aborted


def _aborted(reason: str, cause: AbortCause) -> dict[str, object]:
    """The columns of an epoch that becomes ABORTED now."""
    return {
        "status": EpochStatus.ABORTED,
        "reason": reason,
        "abort_cause": cause,
        "aborted_at": func.now(),
        "files_cleaned": False,
        "updated_at": func.now(),
    }


async def abort_epoch(session: AsyncSession, sink_id: int, epoch: int, reason: str, cause: AbortCause) -> None:
    await session.execute(
        update(PendingSinkState)
        .where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
        .values(_aborted(reason, cause))
    )
    await path_claims.discard_epochs(session, sink_id, [epoch], keep_for_rerun=cause == AbortCause.RECOVERY)


async def mark_committed(
    session: AsyncSession, sink_id: int, epochs: Sequence[int], snapshot_id: int | None
) -> int | None:
    """Mark PENDING epochs COMMITTED (the table holds them) and move the sink's committed_epoch; the new committed
    epoch, None when it did not move."""
    await session.execute(
        update(PendingSinkState)
        .where(
            PendingSinkState.sink_id == sink_id,
            PendingSinkState.epoch.in_(epochs),
            PendingSinkState.status == EpochStatus.PENDING,
        )
        .values(status=EpochStatus.COMMITTED, snapshot_id=snapshot_id, updated_at=func.now())
    )
    return await advance_committed_epoch(session, sink_id)


# The COMMITTED transaction of the common commit, as one statement: the sink is still the incarnation and
# generation the committer appended for, and every epoch still PENDING with the attempt it appended (each row
# locked, the condition evaluated again on a row another transaction changed meanwhile); then all of them are
# marked and committed_epoch moves, all or nothing. The tables the pass appended to (or found holding its epochs)
# record the newest epoch they hold in the same statement, whether or not the epochs are marked (a table's record is
# a fact about the table); the trigger of migration 0006 raises the other tables with the sink. The marked rows are
# PENDING in the statement's snapshot: the new committed epoch is computed without them.
# The committed epoch moves only over epochs the statement sees: the checkpointed epoch is read as of its snapshot
# (`seen`), like the epochs, never from the sink row PostgreSQL evaluates again at its newest version after waiting
# for its lock (a checkpoint committed meanwhile covers an epoch pre-committed after the snapshot, which the
# statement cannot see PENDING; the committed epoch would pass it, and every table with it).
_MARK_APPENDED_EPOCHS = """
    WITH expected AS (
        SELECT * FROM unnest(CAST(:epochs AS bigint[]), CAST(:attempts AS integer[]), CAST(:snapshot_ids AS bigint[]))
                 AS e(epoch, attempt, snapshot_id)
    ), sink AS (
        SELECT id FROM sinks
        WHERE id = :sink_id AND incarnation = :incarnation AND generation = :generation FOR UPDATE
    ), recorded AS (
        UPDATE sink_tables t SET committed_epoch = r.epoch, updated_at = now()
        FROM unnest(CAST(:tables AS text[]), CAST(:table_epochs AS bigint[])) AS r(table_identifier, epoch)
        WHERE t.sink_id = (SELECT id FROM sink) AND t.table_identifier = r.table_identifier
          AND t.committed_epoch < r.epoch
    ), unchanged AS (
        SELECT p.epoch FROM pending_sink_state p JOIN expected e ON e.epoch = p.epoch
        WHERE p.sink_id = (SELECT id FROM sink) AND p.status = 'PENDING' AND p.attempt = e.attempt
        FOR UPDATE OF p
    ), marked AS (
        UPDATE pending_sink_state p SET status = 'COMMITTED', snapshot_id = e.snapshot_id, updated_at = now()
        FROM expected e
        WHERE p.sink_id = :sink_id AND p.epoch = e.epoch AND p.epoch IN (SELECT epoch FROM unchanged)
          AND (SELECT count(*) FROM unchanged) = cardinality(CAST(:epochs AS bigint[]))
        RETURNING p.epoch
    ), seen AS (
        SELECT checkpointed_epoch FROM sinks WHERE id = :sink_id
    )
    UPDATE sinks s SET committed_epoch = GREATEST(s.committed_epoch, LEAST((SELECT checkpointed_epoch FROM seen),
            COALESCE((SELECT min(p.epoch) - 1 FROM pending_sink_state p
                      WHERE p.sink_id = s.id AND p.status = 'PENDING' AND p.epoch NOT IN (SELECT epoch FROM marked)),
                     (SELECT checkpointed_epoch FROM seen)))),
        updated_at = now()
    WHERE s.id = :sink_id AND EXISTS (SELECT 1 FROM marked)
    RETURNING s.committed_epoch
"""


@dataclass(frozen=True)
class Appended:
    """What a commit pass did: the attempt of each epoch it appended (or found in its tables) with the snapshot of
    the sink's own table that holds the epoch (None: none there), and the newest epoch each table it appended to
    (or found holding its epochs) now holds."""

    attempts: Mapping[int, int]
    snapshots: Mapping[int, int | None]
    tables: Mapping[str, int]


async def mark_appended_epochs(connection: AsyncConnection, sink: Sink, appended: Appended) -> int | None:
    """The common COMMITTED transaction in one autocommit statement (see _MARK_APPENDED_EPOCHS): the sink's new
    committed epoch, or None when anything differs from what was appended (no epoch is marked then, and the
    general transaction decides; the tables' records are kept)."""
    epochs = list(appended.attempts)
    row = (
        await connection.execute(
            text(_MARK_APPENDED_EPOCHS),
            {
                "epochs": epochs,
                "attempts": [appended.attempts[epoch] for epoch in epochs],
                "snapshot_ids": [appended.snapshots.get(epoch) for epoch in epochs],
                **_table_parameters(appended.tables),
                **_numbering_parameters(sink),
            },
        )
    ).one_or_none()
    return None if row is None else int(row.committed_epoch)


_ADVANCE_COMMITTED_EPOCH = """
    UPDATE sinks s SET committed_epoch = settled.epoch, updated_at = now()
    FROM (SELECT LEAST(s2.checkpointed_epoch,
                       COALESCE((SELECT min(p.epoch) - 1 FROM pending_sink_state p
                                 WHERE p.sink_id = s2.id AND p.status = 'PENDING'), s2.checkpointed_epoch)) AS epoch
          FROM sinks s2 WHERE s2.id = :sink_id) AS settled
    WHERE s.id = :sink_id AND s.committed_epoch < settled.epoch
    RETURNING s.committed_epoch
"""


_RECORD_CHECKPOINT_OVER_PENDING = """
    UPDATE sinks s SET checkpointed_epoch = :epoch, updated_at = now()
    WHERE s.name = :name AND s.writer_term = :term AND s.checkpointed_epoch < :epoch AND s.suspended_reason IS NULL
      AND (SELECT count(*) FROM pending_sink_state p
           WHERE p.sink_id = s.id AND p.epoch > s.checkpointed_epoch AND p.epoch <= :epoch
             AND p.status = 'PENDING') = CAST(:epoch AS numeric) - s.checkpointed_epoch
    RETURNING s.id, s.committed_epoch, s.checkpointed_epoch, s.incarnation, s.generation
"""


@dataclass(frozen=True)
class RecordedCheckpoint:
    sink_id: int
    committed_epoch: int
    checkpointed_epoch: int
    incarnation: uuid.UUID
    generation: int


async def record_checkpoint_over_pending(
    connection: AsyncConnection, name: str, writer_term: int, epoch: int
) -> RecordedCheckpoint | None:
    """The common checkpoint in one autocommit statement: the writer's term is current and every epoch the
    checkpoint newly covers is PENDING. None when it is not so (or the sink is unknown): the general path
    then decides, and explains a refusal.

    Nothing else is needed: with every covered epoch PENDING the committed epoch cannot move, and a term
    that changed meanwhile (RegisterWriter, a reset: each bumps it under the sink's row lock) is seen
    here, because PostgreSQL evaluates the condition again on the newest version of the row it waited for.
    An operator's abort of a covered epoch racing with it is what the general path accepts as well.
    """
    row = (
        await connection.execute(
            text(_RECORD_CHECKPOINT_OVER_PENDING), {"name": name, "term": writer_term, "epoch": epoch}
        )
    ).one_or_none()
    if row is None:
        return None
    return RecordedCheckpoint(row.id, row.committed_epoch, row.checkpointed_epoch, row.incarnation, row.generation)


async def advance_committed_epoch(session: AsyncSession, sink_id: int) -> int | None:
    """committed_epoch := the newest checkpointed epoch with no PENDING epoch at or below it; the new value, None
    when it did not move.

    Every epoch between the committed and the checkpointed one is in the log (a checkpoint covers only
    pre-committed epochs), and none of them can be aborted by recovery (a checkpoint never covers one):
    what is not PENDING there is COMMITTED, or aborted by an operator on purpose.
    """
    moved = (await session.execute(text(_ADVANCE_COMMITTED_EPOCH), {"sink_id": sink_id})).scalar_one_or_none()
    return None if moved is None else int(moved)


async def epochs_for_update(session: AsyncSession, sink_id: int, epochs: Sequence[int]) -> dict[int, PendingSinkState]:
    """The rows of these epochs (those that still exist), row-locked for the rest of the transaction."""
    statement = (
        select(PendingSinkState)
        .where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch.in_(epochs))
        .order_by(PendingSinkState.epoch)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return {row.epoch: row for row in (await session.execute(statement)).scalars().all()}


_PRUNE_COMMITTED = f"""
    WITH deleted AS (
        DELETE FROM pending_sink_state p USING sinks s
        WHERE s.id = p.sink_id AND p.sink_id = ANY(:sink_ids) AND p.epoch <= s.committed_epoch - :retention
          AND (p.status = 'COMMITTED' OR (p.status = 'ABORTED' AND p.files_cleaned))
        RETURNING p.sink_id, p.epoch
    ), {path_claims.RELEASE_CLAIMS_OF_DELETED_EPOCHS}
    SELECT count(*) FROM deleted
"""


async def prune_committed(
    session: AsyncSession | AsyncConnection, sink_ids: Sequence[int], retention_epochs: int
) -> int:
    """Delete COMMITTED rows, and ABORTED rows whose files are cleaned, that are retention_epochs or more
    below their sink's committed_epoch; the paths they held are released (path_claims)."""
    parameters = {"sink_ids": list(sink_ids), "retention": retention_epochs}
    return int((await session.execute(text(_PRUNE_COMMITTED), parameters)).scalar_one())


@dataclass(frozen=True)
class EmptyBacklog:
    """A sink whose checkpointed PENDING epochs were all empty, marked COMMITTED in one statement."""

    sink_id: int
    sink: str
    epochs: int
    committed_epoch: int


# Sinks whose PENDING epochs at or below the checkpoint exist and carry no file: nothing to append.
_ONLY_EMPTY_BACKLOG = """
    EXISTS (SELECT 1 FROM pending_sink_state p
            WHERE p.sink_id = s.id AND p.status = 'PENDING' AND p.epoch <= s.checkpointed_epoch)
    AND NOT EXISTS (SELECT 1 FROM pending_sink_state p
                    WHERE p.sink_id = s.id AND p.status = 'PENDING' AND p.epoch <= s.checkpointed_epoch
                      AND p.file_count > 0)
"""

# Transaction-level advisory locks conflict with the committer's session-level ones on the same keys: a sink
# another committer is working on is skipped. MATERIALIZED keeps the lock function off sinks that do not qualify.
_LOCK_EMPTY_BACKLOGS = f"""
    WITH candidates AS MATERIALIZED (
        SELECT s.id FROM sinks s WHERE s.suspended_reason IS NULL AND {_ONLY_EMPTY_BACKLOG} ORDER BY s.id
    )
    SELECT id FROM candidates WHERE pg_try_advisory_xact_lock(:class_id, id)
"""

# Under the locks, in a new snapshot: the conditions are checked again, then the epochs and the sinks move together.
_MARK_EMPTY_BACKLOGS = f"""
    WITH marked AS (
        UPDATE pending_sink_state p SET status = 'COMMITTED', snapshot_id = NULL, updated_at = now()
        FROM sinks s
        WHERE s.id = p.sink_id AND s.id = ANY(:sink_ids) AND p.status = 'PENDING'
          AND p.epoch <= s.checkpointed_epoch AND {_ONLY_EMPTY_BACKLOG}
        RETURNING p.sink_id, p.epoch
    ), per_sink AS (
        SELECT sink_id, max(epoch) AS top, count(*) AS epochs FROM marked GROUP BY sink_id
    ), moved AS (
        UPDATE sinks s SET committed_epoch = per_sink.top FROM per_sink
        WHERE s.id = per_sink.sink_id AND s.committed_epoch < per_sink.top
        RETURNING s.id
    )
    SELECT per_sink.sink_id, s.name, per_sink.epochs, GREATEST(s.committed_epoch, per_sink.top)
    FROM per_sink JOIN sinks s ON s.id = per_sink.sink_id
    ORDER BY per_sink.sink_id
"""


async def commit_empty_backlogs(session: AsyncSession) -> list[EmptyBacklog]:
    """Mark COMMITTED every sink's checkpointed PENDING epochs where none of them has a file, in one pass.

    Empty epochs are never appended to a table, so they need no Iceberg commit; a sink with any file among them
    is left to its committer, which keeps the epochs in order. The sinks stay locked until the transaction ends.
    """
    locked = (await session.execute(text(_LOCK_EMPTY_BACKLOGS), {"class_id": COMMIT_LOCK_CLASS})).scalars().all()
    if not locked:
        return []
    rows = await session.execute(text(_MARK_EMPTY_BACKLOGS), {"sink_ids": list(locked)})
    return [EmptyBacklog(sink_id=row[0], sink=row[1], epochs=row[2], committed_epoch=row[3]) for row in rows]


async def sink_ids_with_commit_work(session: AsyncSession) -> list[int]:
    """Sinks with a PENDING epoch at or below their recorded checkpoint."""
    statement = (
        select(Sink.id)
        .where(
            select(PendingSinkState.epoch)
            .where(
                PendingSinkState.sink_id == Sink.id,
                PendingSinkState.status == EpochStatus.PENDING,
                PendingSinkState.epoch <= Sink.checkpointed_epoch,
            )
            .exists()
        )
        .order_by(Sink.id)
    )
    return list((await session.execute(statement)).scalars().all())


async def try_commit_lock(connection: AsyncConnection, sink_id: int) -> bool:
    """Take the sink's session-level commit lock without waiting; held until released or disconnected."""
    result = await connection.execute(
        text("SELECT pg_try_advisory_lock(:class_id, :sink_id)"),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )
    return bool(result.scalar_one())


async def release_commit_lock(connection: AsyncConnection, sink_id: int) -> None:
    await connection.execute(
        text("SELECT pg_advisory_unlock(:class_id, :sink_id)"),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )


async def wait_commit_lock(connection: AsyncConnection, sink_id: int, timeout_seconds: float) -> bool:
    """Take the sink's session-level commit lock on an autocommit connection, waiting at most timeout_seconds;
    False if it is still held by another session then."""
    # The wait is bounded by lock_timeout alone (not by the session's statement_timeout, maybe shorter).
    await connection.execute(
        text("SELECT set_config('lock_timeout', :timeout, false), set_config('statement_timeout', '0', false)"),
        {"timeout": f"{max(1, int(timeout_seconds * 1000))}ms"},
    )
    try:
        await connection.execute(
            text("SELECT pg_advisory_lock(:class_id, :sink_id)"),
            {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
        )
    except DBAPIError as error:
        if not isinstance(error.orig, LockNotAvailable):
            raise
        return False
    finally:
        await connection.execute(text("RESET lock_timeout"))
        await connection.execute(text("RESET statement_timeout"))
    return True


async def holds_commit_lock(connection: AsyncConnection, sink_id: int) -> bool:
    """Whether this connection's session holds the sink's commit lock, in PostgreSQL's own view of its locks."""
    result = await connection.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND classid = :class_id AND objid = :sink_id AND objsubid = 2 AND granted)"
        ),
        {"class_id": COMMIT_LOCK_CLASS, "sink_id": sink_id},
    )
    return bool(result.scalar_one())


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


async def sink_names(session: AsyncSession) -> list[str]:
    return list((await session.execute(select(Sink.name))).scalars())


async def sinks_with_epoch_counts(session: AsyncSession, name: str | None = None) -> list[tuple[Sink, EpochCounts]]:
    """Every sink (or the one named) with its pending and aborted counts, last commit and writer's call, by name."""
    pending = PendingSinkState.status == EpochStatus.PENDING
    counts = (
        select(
            PendingSinkState.sink_id,
            func.count().filter(pending).label("pending"),
            func.count().filter(PendingSinkState.status == EpochStatus.ABORTED).label("aborted"),
            func.extract("epoch", func.now() - func.min(PendingSinkState.updated_at).filter(pending)).label("age"),
            func.min(PendingSinkState.epoch).filter(pending).label("oldest"),
        )
        .where(PendingSinkState.status != EpochStatus.COMMITTED)
        .group_by(PendingSinkState.sink_id)
        .subquery()
    )
    committed = aliased(PendingSinkState)
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
    newest = aliased(PendingSinkState)
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
        )
        .outerjoin(counts, counts.c.sink_id == Sink.id)
        .order_by(Sink.name)
    )
    if name is not None:
        statement = statement.where(Sink.name == name)
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
            ),
        )
        for sink, pending_count, aborted_count, age, oldest, committed_at, call_age, precommitted_at in (
            await session.execute(statement)
        ).all()
    ]


async def shared_tables(session: AsyncSession) -> dict[str, list[str]]:
    """Every table more than one sink writes, with the names of those sinks, by name."""
    shared = (
        select(WrittenTable.table_identifier)
        .group_by(WrittenTable.table_identifier)
        .having(func.count() > 1)
        .scalar_subquery()
    )
    statement = (
        select(WrittenTable.table_identifier, Sink.name)
        .join(Sink, Sink.id == WrittenTable.sink_id)
        .where(WrittenTable.table_identifier.in_(shared))
        .order_by(Sink.name)
    )
    writers: dict[str, list[str]] = {}
    for table, sink in (await session.execute(statement)).all():
        writers.setdefault(table, []).append(sink)
    return writers


async def epochs_newest_first(
    session: AsyncSession, sink_id: int, status: EpochStatus | None, below_epoch: int | None, limit: int
) -> Sequence[PendingSinkState]:
    """A page of the sink's epochs, newest first, without their (possibly large) metadata."""
    statement = (
        select(PendingSinkState)
        .options(defer(PendingSinkState.metadata_, raiseload=True))
        .where(PendingSinkState.sink_id == sink_id)
        .order_by(PendingSinkState.epoch.desc())
        .limit(limit)
    )
    if status is not None:
        statement = statement.where(PendingSinkState.status == status)
    if below_epoch is not None:
        statement = statement.where(PendingSinkState.epoch < below_epoch)
    return (await session.execute(statement)).scalars().all()


_DELETE_EPOCHS_OF_SINK = f"""
    WITH deleted AS (
        DELETE FROM pending_sink_state WHERE sink_id = :sink_id RETURNING sink_id, epoch
    ), {path_claims.RELEASE_CLAIMS_OF_DELETED_EPOCHS}
    SELECT count(*) FROM deleted
"""


async def delete_epochs_of_old_generation(session: AsyncSession, sink_id: int) -> int:
    """Delete every epoch row of the sink: after a reset their numbers belong to the new numbering, and no row of
    the old one may answer for an epoch of the new (the reset left no PENDING row). The paths they held wait for
    the cleaner without an epoch (path_claims)."""
    return int((await session.execute(text(_DELETE_EPOCHS_OF_SINK), {"sink_id": sink_id})).scalar_one())


# ---------------------------------------------------------------------------------------------- maintenance


async def sinks_of_table(session: AsyncSession, table: str) -> list[tuple[Sink, int]]:
    """Every sink writing the table (usually one), whose markers its snapshots carry, with the newest epoch of the
    sink that the table holds."""
    statement = (
        select(Sink, WrittenTable.committed_epoch)
        .join(WrittenTable, WrittenTable.sink_id == Sink.id)
        .where(WrittenTable.table_identifier == table)
        .order_by(Sink.id)
    )
    return [(sink, committed_epoch) for sink, committed_epoch in (await session.execute(statement)).all()]


_RECORD_WRITER_CALL = """
    UPDATE sinks SET writer_last_call_at = now() - make_interval(secs => :ago)
    WHERE name = :sink AND (writer_last_call_at IS NULL OR writer_last_call_at < now() - make_interval(secs => :ago))
"""


async def record_writer_calls(connection: AsyncConnection, calls: Mapping[str, float]) -> None:
    """Each sink's writer called `calls[sink]` seconds ago: a statement per sink (autocommit: no transaction holds
    two sinks' rows), moving the time forward only."""
    for sink, ago in sorted(calls.items()):
        await connection.execute(text(_RECORD_WRITER_CALL), {"sink": sink, "ago": ago})


async def sinks_writing(session: AsyncSession, tables: Sequence[str], besides: str = "") -> dict[str, list[str]]:
    """The names of the sinks (but `besides`) writing each of these tables, by name; a table none writes is left
    out."""
    statement = (
        select(WrittenTable.table_identifier, Sink.name)
        .join(Sink, Sink.id == WrittenTable.sink_id)
        .where(WrittenTable.table_identifier.in_(tables), Sink.name != besides)
        .order_by(Sink.name)
    )
    writers: dict[str, list[str]] = {}
    for table, name in (await session.execute(statement)).all():
        writers.setdefault(table, []).append(name)
    return writers


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


async def start_maintenance_run(session: AsyncSession, sink_id: int, trigger: str) -> MaintenanceRun:
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


# ------------------------------------------------------------------------------------------ multi-writer epochs


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
