"""Epochs COMMITTED in the log (their files are in the tables) and the sink's committed epoch moved with them: the
committer's record of a pass (one statement for the common case beside the transaction that checks each epoch), the
marks of what a table was found holding, and the empty backlogs marked at start. The committed epoch moves only by
the rule (epoch_transitions.committed_epoch_rule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import func, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import anomalies, epoch_reads, epoch_transitions, sink_rows
from coordinator_service.log.commit_lock import COMMIT_LOCK_CLASS
from coordinator_service.log.database import Database
from coordinator_service.log.epoch_transitions import committed_epoch_rule
from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.log.sink_tables import numbering_parameters, table_parameters


async def mark_epochs(session: AsyncSession, sink_id: int, epochs: Sequence[int], snapshot_id: int | None) -> None:
    """Mark these of the sink's epochs that are PENDING COMMITTED (the tables hold them), each with the snapshot of
    the sink's own table that holds it; the caller moves the committed epoch."""
    await session.execute(
        update(EpochRecord)
        .where(
            EpochRecord.sink_id == sink_id,
            EpochRecord.epoch.in_(epochs),
            EpochRecord.status == EpochStatus.PENDING,
        )
        .values(status=EpochStatus.COMMITTED, snapshot_id=snapshot_id, updated_at=func.now())
    )


async def mark_committed(
    session: AsyncSession, sink_id: int, epochs: Sequence[int], snapshot_id: int | None
) -> int | None:
    """Mark PENDING epochs COMMITTED (the table holds them) and move the sink's committed_epoch; the new committed
    epoch, None when it did not move."""
    await mark_epochs(session, sink_id, epochs, snapshot_id)
    return await epoch_transitions.advance_committed_epoch(session, sink_id)


async def mark_held(session: AsyncSession, sink_id: int, held: Mapping[int | None, Sequence[int]]) -> list[int]:
    """Mark the epochs the tables hold COMMITTED, each with its snapshot (by snapshot); return them."""
    for snapshot_id, epochs in held.items():
        await mark_committed(session, sink_id, epochs, snapshot_id)
    return sorted(epoch for epochs in held.values() for epoch in epochs)


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
_COMMITTED_OVER_WHAT_IT_SAW = committed_epoch_rule(
    "s",
    checkpointed="(SELECT checkpointed_epoch FROM seen)",
    floor="s.committed_epoch",
    still_pending=" AND p.epoch NOT IN (SELECT epoch FROM marked)",
)
_MARK_APPENDED_EPOCHS = f"""
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
    UPDATE sinks s SET committed_epoch = {_COMMITTED_OVER_WHAT_IT_SAW}, updated_at = now()
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


async def record_commit(
    database: Database,
    sink: Sink,
    pending: Sequence[EpochRecord],
    appended: Appended,
    files: int,
    retention_epochs: int,
) -> int | None:
    """A commit pass's COMMITTED record: the one statement, or the general transaction where it declines; the rows
    retention_epochs below the committed epoch pruned. The sink's committed epoch after it, or None when a reset (or
    a new incarnation) took the sink over meanwhile."""
    async with database.connection(autocommit=True) as connection:
        committed = await mark_appended_epochs(connection, sink, appended)
        if committed is not None:
            await epoch_transitions.prune_committed(connection, [sink.id], retention_epochs)
            return committed
    async with database.transaction() as session:
        committed = await record_commit_checking_each_epoch(session, sink, pending, appended, files)
        if committed is not None:
            await epoch_transitions.prune_committed(session, [sink.id], retention_epochs)
    return committed


async def record_commit_checking_each_epoch(
    session: AsyncSession, sink: Sink, pending: Sequence[EpochRecord], appended: Appended, files: int
) -> int | None:
    """The general COMMITTED transaction, for what the one statement (mark_appended_epochs) declined, in the caller's
    transaction: each epoch is re-checked under its row lock before it is marked; one that is no longer PENDING with
    the attempt the committer read (an abort or a new attempt got in while the commit lock was lost) but whose
    `files` were just appended takes the table's side. The sink's committed epoch after it, or None when a reset (or
    a new incarnation) took the sink over meanwhile."""
    epochs = [row.epoch for row in pending]
    current = await sink_rows.sink_by_id(session, sink.id, lock=True)
    rows = await epoch_reads.epochs_for_update(session, sink.id, epochs)
    recorded = [
        epoch
        for epoch in epochs
        if (now := rows.get(epoch)) is not None
        and now.status == EpochStatus.COMMITTED
        and now.snapshot_id == appended.snapshots.get(epoch)
    ]
    if current is None or (current.incarnation, current.generation) != (sink.incarnation, sink.generation):
        # A reset (or a new incarnation) took over: what it found in the table it recorded.
        if files and len(recorded) < len(epochs):
            anomalies.alert(sink.name, "appended_after_reset", epochs=epochs)
        return None
    as_read = [
        row.epoch
        for row in pending
        if (now := rows.get(row.epoch)) is not None and (now.status, now.attempt) == (EpochStatus.PENDING, row.attempt)
    ]
    committed = current.committed_epoch
    for snapshot_id, marked in _by_snapshot(as_read, appended.snapshots).items():
        moved = await mark_committed(session, sink.id, marked, snapshot_id)
        committed = committed if moved is None else max(committed, moved)
    for each in pending:
        now = rows.get(each.epoch)
        # Recorded already: an abort or a reset walked the table after the append and marked it.
        if each.epoch in as_read or each.epoch in recorded or not files:
            continue
        snapshot_id = appended.snapshots.get(each.epoch)
        if now is None:
            anomalies.alert(sink.name, "appended_epoch_gone", epoch=each.epoch, snapshot_id=snapshot_id)
        else:
            await epoch_transitions.adopt_appended(session, sink, now, each, snapshot_id)
    return committed


def _by_snapshot(epochs: Sequence[int], snapshots: Mapping[int, int | None]) -> dict[int | None, list[int]]:
    grouped: dict[int | None, list[int]] = {}
    for epoch in epochs:
        grouped.setdefault(snapshots.get(epoch), []).append(epoch)
    return grouped


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
# A sink whose row another transaction holds (a registration, an operator's action) is skipped too, not waited for:
# the pass holds every other sink's commit lock while it runs, and its committer marks that sink in its own pass.
_LOCK_EMPTY_BACKLOGS = f"""
    WITH candidates AS MATERIALIZED (
        SELECT s.id FROM sinks s WHERE s.suspended_reason IS NULL AND {_ONLY_EMPTY_BACKLOG} ORDER BY s.id
        FOR NO KEY UPDATE OF s SKIP LOCKED
    )
    SELECT id FROM candidates WHERE pg_try_advisory_xact_lock(:class_id, id)
"""


# Under the locks, in a new snapshot: the conditions are checked again, then the epochs and the sinks move together.
_COMMITTED_OVER_EMPTY_BACKLOG = committed_epoch_rule(
    "s",
    checkpointed="s.checkpointed_epoch",
    floor="s.committed_epoch",
    still_pending=" AND (p.sink_id, p.epoch) NOT IN (SELECT sink_id, epoch FROM marked)",
)
_MARK_EMPTY_BACKLOGS = f"""
    WITH marked AS (
        UPDATE pending_sink_state p SET status = 'COMMITTED', snapshot_id = NULL, updated_at = now()
        FROM sinks s
        WHERE s.id = p.sink_id AND s.id = ANY(:sink_ids) AND p.status = 'PENDING'
          AND p.epoch <= s.checkpointed_epoch AND {_ONLY_EMPTY_BACKLOG}
        RETURNING p.sink_id, p.epoch
    ), per_sink AS (
        SELECT sink_id, count(*) AS epochs FROM marked GROUP BY sink_id
    ), moved AS (
        UPDATE sinks s SET committed_epoch = {_COMMITTED_OVER_EMPTY_BACKLOG}, updated_at = now()
        FROM per_sink
        WHERE s.id = per_sink.sink_id
        RETURNING s.id, s.name, s.committed_epoch
    )
    SELECT per_sink.sink_id, moved.name, per_sink.epochs, moved.committed_epoch
    FROM per_sink JOIN moved ON moved.id = per_sink.sink_id
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
