"""The rules a writer's call must meet before its epochs or the sink's checkpoint change: the sink exists and is not
suspended, the writer's term is the current one, and a new checkpoint covers only epochs pre-committed and not given
up. The general paths of the transitions check them here, with the message that says what to do; the fast paths
(coordinator_service.log.epoch_transitions, checkpoint_record) state the same conditions in SQL."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.errors import EpochAborted, FailedPrecondition, Fenced, NotFound, SinkSuspended
from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import sink_rows
from coordinator_service.log.models import AbortCause, EpochRecord, Sink
from coordinator_service.log.sink_rows import RowLock


async def existing_sink(session: AsyncSession, name: str, lock: RowLock | None = None) -> Sink:
    sink = await sink_rows.sink_by_name(session, name, lock=lock)
    if sink is None:
        raise NotFound(f"sink {name} is not registered: call RegisterWriter first")
    return sink


def check_term(sink: Sink, writer_term: int) -> None:
    check_not_suspended(sink)
    if writer_term < sink.writer_term:
        raise Fenced(
            f"sink {sink.name}: writer term {writer_term} is fenced by term {sink.writer_term}; "
            "a newer writer registered. Stop this writer"
        )
    if writer_term > sink.writer_term:
        raise FailedPrecondition(
            f"sink {sink.name}: writer term {writer_term} was never issued (current {sink.writer_term}): "
            "call RegisterWriter and use the term it returns"
        )


def check_not_suspended(sink: Sink) -> None:
    if sink.suspended_reason is not None:
        raise SinkSuspended(f"sink {sink.name} is suspended, nothing is accepted for it: {sink.suspended_reason}")


def check_checkpoint_range(sink: str, rows: Sequence[EpochRecord], recorded: int, checkpoint: int) -> None:
    """Every epoch a new checkpoint covers must be pre-committed, and not aborted unless by an operator (who
    gave its records up on purpose, and was told so)."""
    aborted = [row for row in rows if row.status == EpochStatus.ABORTED and row.abort_cause != AbortCause.OPERATOR]
    if aborted:
        first = aborted[0]
        raise EpochAborted(
            f"sink {sink}: the checkpoint of epoch {checkpoint} covers epoch {first.epoch}, which was aborted "
            f"({first.reason}); its records will not reach the table. Nothing was changed"
        )
    present = {row.epoch for row in rows}
    # The first 11 at most: the range may reach 2**63 - 1, and every epoch but len(present) of it is missing.
    missing = list(
        itertools.islice((epoch for epoch in range(recorded + 1, checkpoint + 1) if epoch not in present), 11)
    )
    if missing:
        shown = ", ".join(str(epoch) for epoch in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise FailedPrecondition(
            f"sink {sink}: the checkpoint of epoch {checkpoint} covers epochs that were never pre-committed "
            f"({shown}); every epoch, even an empty one, must be pre-committed before Spark checkpoints it"
        )
