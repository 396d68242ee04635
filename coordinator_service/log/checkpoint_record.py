"""A writer's checkpoint recorded in the log (CommitCheckpoint): the sink's checkpointed epoch moves, and its
committed epoch with it by the rule where the checkpoint covers epochs an operator aborted. The common case in one
statement (many sinks' at once) beside the transaction that checks everything in order and says why it refuses."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.log import epoch_reads, epoch_transitions
from coordinator_service.log.epoch_rules import check_checkpoint_range, check_term, existing_sink
from coordinator_service.log.sink_rows import RowLock

# A sink whose row another transaction holds (a registration, an operator's action, a commit's record) is skipped,
# not waited for: its checkpoint goes the general way, which waits for that row alone, and the statement holds up no
# other sink's checkpoint behind it (nor takes part in a deadlock: it never waits). A row changed since the
# statement's snapshot is checked again on its newest version (PostgreSQL's rule for a row it locks in READ
# COMMITTED), the term and the covered epochs included.
_RECORD_CHECKPOINTS_OVER_PENDING = """
    WITH r AS (
        SELECT * FROM unnest(CAST(%(names)s AS text[]), CAST(%(terms)s AS bigint[]), CAST(%(epochs)s AS bigint[]))
            AS r(name, term, epoch)
    ), covered AS (
        SELECT s.id, r.epoch FROM sinks s JOIN r ON r.name = s.name
        WHERE s.writer_term = r.term AND s.checkpointed_epoch < r.epoch AND s.suspended_reason IS NULL
          AND (SELECT count(*) FROM pending_sink_state p
               WHERE p.sink_id = s.id AND p.epoch > s.checkpointed_epoch AND p.epoch <= r.epoch
                 AND p.status = 'PENDING') = CAST(r.epoch AS numeric) - s.checkpointed_epoch
        FOR UPDATE OF s SKIP LOCKED
    )
    UPDATE sinks s SET checkpointed_epoch = covered.epoch, updated_at = now()
    FROM covered WHERE s.id = covered.id
    RETURNING s.name, s.id, s.committed_epoch, s.checkpointed_epoch, s.incarnation, s.generation
"""


@dataclass(frozen=True)
class Checkpoint:
    """A writer's CommitCheckpoint: its sink's checkpoint to move to `epoch`."""

    name: str
    writer_term: int
    epoch: int


@dataclass(frozen=True)
class RecordedCheckpoint:
    sink_id: int
    committed_epoch: int
    checkpointed_epoch: int
    incarnation: uuid.UUID
    generation: int


async def record_checkpoints_over_pending(
    connection: psycopg.AsyncConnection[Any], checkpoints: Sequence[Checkpoint]
) -> dict[str, RecordedCheckpoint]:
    """The common checkpoints in one autocommit statement (on a plain psycopg connection; one per sink): those
    whose writer's term is current and every epoch they newly cover PENDING, by sink name. The others (an unknown
    sink, or one whose row another transaction holds now) are left out: the general path then decides, and explains
    a refusal.

    Nothing else is needed: with every covered epoch PENDING the committed epoch cannot move, and a term
    that changed meanwhile (RegisterWriter, a reset: each bumps it under the sink's row lock) is seen
    here: a row held by such a transaction is skipped, and one it changed since is checked again on its newest
    version. An operator's abort of a covered epoch racing with it is what the general path accepts as well.
    """
    cursor = await connection.execute(
        _RECORD_CHECKPOINTS_OVER_PENDING,
        {
            "names": [each.name for each in checkpoints],
            "terms": [each.writer_term for each in checkpoints],
            "epochs": [each.epoch for each in checkpoints],
        },
    )
    return {
        name: RecordedCheckpoint(int(sink_id), int(committed), int(checkpointed), incarnation, int(generation))
        for name, sink_id, committed, checkpointed, incarnation, generation in await cursor.fetchall()
    }


async def record_checkpoint(session: AsyncSession, name: str, writer_term: int, epoch: int) -> RecordedCheckpoint:
    """The general path, in the caller's transaction: every check, in order, with its message (epoch_rules); a
    checkpoint at or below the recorded one changes nothing and answers the sink as it is."""
    row = await existing_sink(session, name, lock=RowLock.UPDATE)
    check_term(row, writer_term)
    if epoch > row.checkpointed_epoch:
        between = await epoch_reads.epochs_between(session, row.id, row.checkpointed_epoch, epoch)
        check_checkpoint_range(name, between, row.checkpointed_epoch, epoch)
        row.checkpointed_epoch = epoch
        await session.flush()
        # Epochs an operator aborted at the front of the checkpoint leave nothing to commit there.
        await epoch_transitions.advance_committed_epoch(session, row.id)
        await session.refresh(row)
    return RecordedCheckpoint(row.id, row.committed_epoch, row.checkpointed_epoch, row.incarnation, row.generation)
