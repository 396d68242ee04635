"""Every change of an epoch's state in the log, in one place: a new PENDING epoch (one, or many in one statement) and a
new attempt, ABORTED, COMMITTED (the committer's marks, the committed-epoch rule), a checkpoint recorded, the
pruning of old COMMITTED rows and of an old generation's."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import func, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import path_claims
from coordinator_service.log.commit_lock import COMMIT_LOCK_CLASS
from coordinator_service.log.models import (
    AbortCause,
    EpochRecord,
    Sink,
)
from coordinator_service.log.sink_tables import numbering_parameters, table_parameters


async def insert_pending_epoch(
    session: AsyncSession,
    sink_id: int,
    epoch: int,
    metadata: bytes,
    file_count: int,
    record_count: int,
) -> None:
    session.add(
        EpochRecord(
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
        update(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.status == EpochStatus.PENDING,
            EpochRecord.epoch > epoch,
        )
        .values(_aborted(reason, cause))
        .returning(EpochRecord.epoch)
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
        update(EpochRecord)
        .where(EpochRecord.sink_id == sink_id, EpochRecord.epoch == epoch)
        .values(_aborted(reason, cause))
    )
    await path_claims.discard_epochs(session, sink_id, [epoch], keep_for_rerun=cause == AbortCause.RECOVERY)


async def mark_committed(
    session: AsyncSession, sink_id: int, epochs: Sequence[int], snapshot_id: int | None
) -> int | None:
    """Mark PENDING epochs COMMITTED (the table holds them) and move the sink's committed_epoch; the new committed
    epoch, None when it did not move."""
    await session.execute(
        update(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.epoch.in_(epochs),
            EpochRecord.status == EpochStatus.PENDING,
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
                **table_parameters(appended.tables),
                **numbering_parameters(sink),
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
