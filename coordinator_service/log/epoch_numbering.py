"""A sink's epoch numbering begun anew: an operator's reset (a lost Spark checkpoint) and reconcile (a metastore
restored behind its tables) end one, fencing the writer; the first writer after them begins the next at its
checkpoint. Each moves the committed epoch through the one rule (epoch_transitions.committed_epoch_rule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import commit_record, epoch_transitions, sink_tables
from coordinator_service.log.models import AbortCause, EpochRecord, Sink


async def reset_numbering(
    session: AsyncSession, sink: Sink, held: Mapping[int | None, Sequence[int]], reason: str
) -> tuple[list[int], list[int]]:
    """An operator's reset, under the sink's row lock and commit lock: the epochs the tables hold (`held`, by the
    snapshot that holds them) COMMITTED, every other PENDING one aborted, the checkpointed epoch back to the committed
    one, the writer fenced and a new numbering begun at the next writer (rebase_numbering). The epochs marked and the
    epochs aborted."""
    marked = await commit_record.mark_held(session, sink.id, held)
    await session.refresh(sink)
    aborted = await epoch_transitions.abort_pending_above(session, sink.id, -1, reason, AbortCause.RESET)
    # Checkpointed epochs the tables do not hold were aborted with the rest: the tables' state stays.
    sink.checkpointed_epoch = sink.committed_epoch
    _fence_for_new_numbering(sink)
    await session.flush()
    return marked, aborted


async def reconcile_numbering(
    session: AsyncSession, sink: Sink, restart: int, tables: Mapping[str, int], reason: str
) -> list[int]:
    """Set a sink's log to what its tables hold (an operator's reconcile), under its row lock and commit lock: the
    PENDING epochs up to `restart` (the least newest epoch the tables hold) COMMITTED, the others aborted, each
    table's record the epoch it holds, the committed epoch `restart`, the writer fenced and a new numbering begun at
    the next writer, The epochs aborted."""
    await commit_record.mark_epochs(session, sink.id, await _pending_at_or_below(session, sink.id, restart), None)
    aborted = await epoch_transitions.abort_pending_above(session, sink.id, restart, reason, AbortCause.RESET)
    await sink_tables.record_tables_at(session, sink.id, tables)
    sink.checkpointed_epoch = max(sink.checkpointed_epoch, restart)
    _fence_for_new_numbering(sink)
    await session.flush()
    await epoch_transitions.advance_committed_epoch(session, sink.id, at_most=restart)
    await session.refresh(sink)
    return aborted


async def _pending_at_or_below(session: AsyncSession, sink_id: int, epoch: int) -> list[int]:
    rows = await session.execute(
        select(EpochRecord.epoch).where(
            EpochRecord.sink_id == sink_id, EpochRecord.status == EpochStatus.PENDING, EpochRecord.epoch <= epoch
        )
    )
    return sorted(rows.scalars().all())


def _fence_for_new_numbering(sink: Sink) -> None:
    """The writer is fenced and the next one's checkpoint begins a new epoch numbering (rebase_numbering)."""
    sink.writer_term += 1
    sink.generation += 1
    sink.rebase_on_register = True


async def rebase_numbering(session: AsyncSession, sink: Sink, checkpoint: int) -> int:
    """The first registration after a reset or reconcile, under the sink's row lock: the writer's checkpoint starts a
    new epoch numbering. Epochs at or below it are done as far as the new checkpoint is concerned; the log's rows of
    the old numbering are deleted, and every table of the sink is at the checkpoint. The log rows deleted."""
    dropped = await epoch_transitions.delete_epochs_of_old_generation(session, sink.id)
    # While the row still awaits its writer: the numbers go back to the new numbering's only in a row that says so.
    await epoch_transitions.advance_committed_epoch(session, sink.id, checkpointed=checkpoint, new_numbering=True)
    await session.refresh(sink)
    sink.rebase_on_register = False
    await sink_tables.rebase_tables(session, sink.id, checkpoint)
    return dropped
