"""A writer's checkpoint recorded in the log (CommitCheckpoint): the sink's checkpointed epoch moves, and its
committed epoch with it by the rule where the checkpoint covers epochs an operator aborted. The common case in one
statement beside the transaction that checks everything in order and says why it refuses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.log import epoch_reads, epoch_transitions
from coordinator_service.log.epoch_rules import check_checkpoint_range, check_term, existing_sink
from coordinator_service.log.sink_rows import RowLock

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
