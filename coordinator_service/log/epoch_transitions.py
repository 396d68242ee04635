"""Every change of an epoch's state in the log, and of the sink's epochs with it, is made by this module or the two
beside it (checkpoint_record: a checkpoint recorded; commit_record: epochs COMMITTED; epoch_numbering: a reset, a
reconcile, the first writer after them): a new PENDING epoch (one, or many in one statement) and a new attempt,
ABORTED, the table's side adopted, the committed-epoch rule, the pruning of old COMMITTED rows and of an old
generation's.

Where a one-statement fast path is kept it sits beside its general path, and
tests/integration/test_transition_paths.py proves both give the same rows for the same log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import func, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import anomalies, path_claims, precommit_metadata
from coordinator_service.log.models import AbortCause, EpochRecord, Sink
from coordinator_service.log.precommit_metadata import PreCommitMetadata


def _take_attempt(
    row: EpochRecord,
    status: EpochStatus,
    attempt: int,
    metadata: bytes,
    file_count: int,
    record_count: int,
    snapshot_id: int | None = None,
    reason: str | None = None,
) -> None:
    """The columns of an epoch's row that an attempt sets: its record, and nothing left of an earlier attempt's fate.
    Written here once for the first attempt, a new one and the one a table holds (adopt_appended); the group insert's
    SQL (_INSERT_NEW_EPOCHS) writes the same for a first attempt."""
    row.status = status
    row.attempt = attempt
    row.metadata_ = metadata
    row.file_count = file_count
    row.record_count = record_count
    row.snapshot_id = snapshot_id
    row.reason = reason
    row.abort_cause = None
    row.aborted_at = None
    row.files_cleaned = False


async def persist_attempt(
    session: AsyncSession, sink_id: int, epoch: int, row: EpochRecord | None, metadata: PreCommitMetadata
) -> int:
    """An epoch's pre-commit, in the caller's transaction (which holds the sink's row lock and has checked the
    request): its first attempt inserted (`row` None), or a new attempt of its ABORTED `row`; the attempt's number.
    The caller claims its paths (path_claims.claim_for_attempt)."""
    if row is None:
        row = EpochRecord(sink_id=sink_id, epoch=epoch)
        session.add(row)
        attempt = 1
    else:
        attempt = row.attempt + 1
    encoded = precommit_metadata.encode(metadata)
    _take_attempt(row, EpochStatus.PENDING, attempt, encoded, len(metadata.data_files), metadata.record_count)
    await session.flush()
    return attempt


async def adopt_appended(
    session: AsyncSession, sink: Sink, row: EpochRecord, appended: EpochRecord, snapshot_id: int | None
) -> None:
    """The table holds `appended` (an attempt of row's epoch) although the log had moved on (aborted, or a newer
    attempt): the table is the truth. The row becomes COMMITTED with that attempt's record and files; files of
    other attempts are discarded (the cleaner removes them). An alert: a committer appended without its lock."""
    previous = f"{row.status.value} attempt {row.attempt}" + (f" ({row.reason})" if row.reason else "")
    _take_attempt(
        row,
        EpochStatus.COMMITTED,
        appended.attempt,
        appended.metadata_,
        appended.file_count,
        appended.record_count,
        snapshot_id,
        reason=f"the table holds attempt {appended.attempt} although the log had it as {previous}",
    )
    await session.flush()
    paths = sorted(precommit_metadata.decode(appended.metadata_).paths)
    await path_claims.claim_for_attempt(session, sink.id, row.epoch, appended.attempt, paths, deadline=None)
    await advance_committed_epoch(session, sink.id)
    anomalies.alert(sink.name, "appended_after_abort", epoch=row.epoch, snapshot_id=snapshot_id, previous=previous)


def give_files_up(row: EpochRecord, kept: PreCommitMetadata) -> None:
    """The epoch keeps only `kept` of its files (an operator removed a table from the sink); the caller releases the
    others' claims."""
    row.metadata_ = precommit_metadata.encode(kept)
    row.file_count = len(kept.data_files)
    row.record_count = kept.record_count


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
        FOR SHARE OF s SKIP LOCKED
        ON CONFLICT (sink_id, epoch) DO NOTHING
        RETURNING sink_id, epoch, attempt
    ), claimed AS (
        INSERT INTO epoch_files (path, sink_id, epoch, attempt)
        SELECT files.path, files.sink_id, files.epoch, 1
        FROM files JOIN inserted ON inserted.sink_id = files.sink_id AND inserted.epoch = files.epoch
    )
    SELECT sink_id, epoch, attempt FROM inserted
"""


async def insert_new_epochs(
    connection: psycopg.AsyncConnection[Any], rows: Sequence[NewEpoch]
) -> dict[tuple[int, int], int]:
    """Insert PENDING rows, and the files they hold, in one statement (on a plain psycopg connection); return
    the attempt of each (sink_id, epoch) inserted (the first).

    A row is inserted only where it is the plain case of a pre-commit: no row for the epoch yet, the
    writer's term current, the epoch above the committed one, one writer per sink, every table it names one of
    the sink's (an operator may remove one), no path with a claim or a
    deletion's mark, and its deadline not passed (path_claims). The sink rows are share-locked like in every
    pre-commit, so that a concurrent RegisterWriter sees (and aborts) the new rows or fences them; a sink whose row
    another transaction holds (a registration, an operator's action, a commit's record) is skipped, not waited
    for: its pre-commit goes the general way, which waits for that row alone, and the statement holds up no other
    sink's pre-commit behind it (nor takes part in a deadlock: it never waits for a sink's row). Rows not inserted
    are left to the general path, which answers them; two rows of one statement naming the same file fail the
    statement, and the general path answers.
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
    return {(int(sink_id), int(epoch)): int(attempt) for sink_id, epoch, attempt in await cursor.fetchall()}


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


def committed_epoch_rule(sink: str, checkpointed: str, floor: str, still_pending: str = "") -> str:
    """The committed-epoch rule as one SQL expression, which every statement that moves a sink's committed_epoch
    uses: the newest epoch at or below the checkpointed one with no PENDING epoch at or below it, never below `floor`
    (the committed epoch as it is; -1 at a new numbering).

    `sink` is the alias of the sinks row, `checkpointed` the expression of the checkpointed epoch to go by (the
    sink's own, or as a statement's snapshot saw it, or a reconcile's restart point), `still_pending` a condition
    on `p` for the PENDING rows a statement's snapshot holds that it is marking itself.

    Every epoch between the committed and the checkpointed one is in the log (a checkpoint covers only
    pre-committed epochs), and none of them can be aborted by recovery (a checkpoint never covers one):
    what is not PENDING there is COMMITTED, or aborted by an operator on purpose. So the committed epoch is also the
    least of the newest epochs the sink's tables hold (the trigger of migration 0006 keeps them at or above it).
    """
    return (
        f"GREATEST({floor}, LEAST({checkpointed}, COALESCE((SELECT min(p.epoch) - 1 FROM pending_sink_state p "
        f"WHERE p.sink_id = {sink}.id AND p.status = 'PENDING'{still_pending}), {checkpointed})))"
    )


_SETTLED = committed_epoch_rule(
    "s2",
    checkpointed="COALESCE(CAST(:at_most AS bigint), CAST(:checkpointed AS bigint), s2.checkpointed_epoch)",
    floor="COALESCE(CAST(:floor AS bigint), s2.committed_epoch)",
)
_ADVANCE_COMMITTED_EPOCH = f"""
    UPDATE sinks s SET committed_epoch = settled.epoch,
        checkpointed_epoch = COALESCE(CAST(:checkpointed AS bigint), s.checkpointed_epoch), updated_at = now()
    FROM (SELECT {_SETTLED} AS epoch FROM sinks s2 WHERE s2.id = :sink_id) AS settled
    WHERE s.id = :sink_id
      AND (s.committed_epoch <> settled.epoch OR s.checkpointed_epoch <> CAST(:checkpointed AS bigint))
    RETURNING s.committed_epoch
"""


async def advance_committed_epoch(
    session: AsyncSession,
    sink_id: int,
    *,
    at_most: int | None = None,
    checkpointed: int | None = None,
    new_numbering: bool = False,
) -> int | None:
    """Move the sink's committed_epoch by the rule (committed_epoch_rule); the new value, None when the row did not
    change.

    `at_most`: the epoch to go by instead of the checkpointed one (a reconcile's restart point). `checkpointed`: the
    sink's new checkpointed epoch, set in the same statement (a rebase: the two move together, never one past the
    other). `new_numbering`: the rule starts from -1, not from the committed epoch of a numbering that ended (the first
    writer after a reset). The caller has flushed what else it changed of the sink's row.
    """
    parameters = {
        "sink_id": sink_id,
        "at_most": at_most,
        "checkpointed": checkpointed,
        "floor": -1 if new_numbering else None,
    }
    moved = (await session.execute(text(_ADVANCE_COMMITTED_EPOCH), parameters)).scalar_one_or_none()
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
