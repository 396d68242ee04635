"""An operator's actions on a sink's epochs: read them, abort one, reset the sink (a lost Spark checkpoint).

An abort and a reset first take the sink's commit lock (coordinator_service.
log.commit_lock), the lock a committer holds while it appends to Iceberg, and
walk the tables' markers on a fresh load: epochs the tables already hold are
marked COMMITTED, only the others are aborted. Nothing is aborted while its
files are being committed, and nothing a table holds is ever reported as
aborted."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from coordinator_service import metrics
from coordinator_service.contract.errors import (
    CatalogUnavailable,
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
    cause,
    quote,
)
from coordinator_service.contract.views import EpochStatus
from coordinator_service.engine import settlement
from coordinator_service.engine.commit_retries import cannot_succeed_by_retrying
from coordinator_service.engine.operator.answers import AbortOutcome, EpochDetail, Operator, ResetOutcome
from coordinator_service.engine.operator.base import (
    OperationsBase,
    check_abortable,
    check_known_name,
    existing_epoch,
    partly_committed,
    pending_epochs,
    sink_named,
)
from coordinator_service.log import (
    commit_lock,
    commit_record,
    epoch_numbering,
    epoch_reads,
    epoch_transitions,
    precommit_metadata,
    sink_tables,
)
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.models import AbortCause, EpochRecord
from coordinator_service.log.sink_rows import RowLock

log = structlog.get_logger(__name__)


class EpochActions(OperationsBase):
    """An operator's reads of a sink's epochs, and the abort of one, and the reset of the sink."""

    async def epochs(
        self, name: str, status: EpochStatus | None, below_epoch: int | None, limit: int
    ) -> tuple[Sequence[EpochRecord], int | None]:
        """A page of epochs, newest first, and the epoch the next page starts below (None: no next page)."""
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
            rows = await epoch_reads.epochs_newest_first(session, sink.id, status, below_epoch, limit + 1)
        if len(rows) > limit:
            return rows[:limit], rows[limit - 1].epoch
        return rows, None

    async def epoch(self, name: str, epoch: int) -> EpochDetail:
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
            row = await existing_epoch(session, sink, epoch)
        return EpochDetail(row, precommit_metadata.decode(row.metadata_))

    async def abort_epoch(self, name: str, epoch: int, reason: str, force: bool, operator: Operator) -> AbortOutcome:
        """Abort a PENDING epoch, only with force: its records will not reach the table.

        Without force nothing changes: Spark may already have checkpointed the epoch (at or below the
        recorded checkpoint, or above it with its report still on the way), and will not write it again.
        With force the abort holds the commit lock and walks the table first: an epoch the table holds is
        marked COMMITTED instead. A later checkpoint that covers an epoch aborted here is accepted.
        """
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
            row = await existing_epoch(session, sink, epoch)
            check_abortable(sink, row, force)
            if row.status == EpochStatus.ABORTED:
                return AbortOutcome(row, changed=False)
        async with commit_lock.holding(
            self.database, sink.id, self.lock_timeout_seconds, f"abort epoch {epoch}"
        ) as lock:
            return await self._abort(name, epoch, reason, operator, lock)

    async def _abort(self, name: str, epoch: int, reason: str, operator: Operator, lock: CommitLock) -> AbortOutcome:
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
            pending = await pending_epochs(session, sink, at_or_below=epoch)
            recorded = await sink_tables.recorded_epochs(session, sink.id)
            tables = await sink_tables.tables_of_sink(session, sink.id)
        await self._fence(sink, [table.identifier for table in tables], lock, f"abort of epoch {epoch} by {operator}")
        found = await settlement.holdings(self.iceberg, sink, recorded, pending)
        if found.held:
            async with self.database.transaction() as session:
                marked = await commit_record.mark_held(session, sink.id, found.held)
            self.committer.wake(sink.id)
            if epoch in marked:
                snapshot = next(snapshot for snapshot, epochs in found.held.items() if epoch in epochs)
                raise FailedPrecondition(
                    f"sink {name} epoch {epoch} is already in the table"
                    + ("" if snapshot is None else f" (snapshot {snapshot})")
                    + ": it was marked COMMITTED and cannot be aborted"
                )
        if epoch in found.partial:
            raise partly_committed(name, {epoch: found.partial[epoch]}, "it cannot be aborted")
        await lock.verify()
        async with self.database.transaction() as session:
            # The sink row lock orders this abort with CommitCheckpoint, which moves checkpointed_epoch under it.
            sink = await sink_named(session, name, lock=RowLock.UPDATE)
            row = await existing_epoch(session, sink, epoch, for_update=True)
            check_abortable(sink, row, force=True)
            if row.status == EpochStatus.ABORTED:
                return AbortOutcome(row, changed=False)
            checkpointed = epoch <= sink.checkpointed_epoch
            await epoch_transitions.abort_epoch(
                session, sink.id, epoch, f"operator abort by {operator}: {reason}", AbortCause.OPERATOR
            )
            await epoch_transitions.advance_committed_epoch(session, sink.id)
            await session.refresh(row)  # the new status, and updated_at as the server set it
        warning = f"epoch {epoch} was aborted: its {row.record_count} records will not reach the table" + (
            ", and the writer will not write them again" if checkpointed else ""
        )
        log.warning(
            "epoch aborted by an operator",
            sink=name,
            epoch=epoch,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            checkpointed=checkpointed,
            records_lost=row.record_count,
        )
        metrics.ABORTED_EPOCHS.labels(name, "operator").inc()
        self.committer.wake(sink.id)
        self.cleaner.wake()
        return AbortOutcome(row, changed=True, warning=warning)

    async def reset_sink(self, name: str, confirm: str, reason: str, operator: Operator) -> ResetOutcome:
        """Prepare a sink for a writer whose Spark checkpoint was lost (see docs/operations.md).

        Under the commit lock, on a fresh load of the table: every PENDING epoch the table holds is marked
        COMMITTED, every other one is aborted, the checkpointed epoch goes back to the committed one, the
        writer term is bumped (fencing a running writer), the generation is bumped, and the next
        RegisterWriter adopts whatever checkpoint it presents (registration._rebase_after_reset). A catalog that
        cannot be read makes the reset fail with nothing changed (Unavailable).
        """
        check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        async with self.database.transaction() as session:
            sink_id = (await sink_named(session, name)).id
        async with commit_lock.holding(self.database, sink_id, self.lock_timeout_seconds, "reset") as lock:
            # The restart point: every checkpointed epoch goes into every table with files of it first, so that
            # after the reset each table holds exactly the epochs up to the one reported (a group a crash left
            # half appended is completed, never aborted in some tables and held by others).
            await self._complete_checkpointed(name, sink_id, lock)
            async with self.database.transaction() as session:
                sink = await sink_named(session, name)
                pending = await pending_epochs(session, sink, at_or_below=None)
                recorded = await sink_tables.recorded_epochs(session, sink.id)
                tables = await sink_tables.tables_of_sink(session, sink.id)
            await self._fence(sink, [table.identifier for table in tables], lock, f"reset by {operator}")
            found = await settlement.holdings(self.iceberg, sink, recorded, pending)
            if found.partial:
                raise partly_committed(name, found.partial, "the sink cannot be reset")
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await sink_named(session, name, lock=RowLock.UPDATE)
                committed, aborted = await epoch_numbering.reset_numbering(
                    session, sink, found.held, f"reset by {operator}: {reason}"
                )
        log.warning(
            "sink reset by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            aborted_epochs=aborted,
            found_in_table=committed,
            writer_term=sink.writer_term,
            generation=sink.generation,
            committed_epoch=sink.committed_epoch,
        )
        metrics.ABORTED_EPOCHS.labels(name, "reset").inc(len(aborted))
        self.cleaner.wake()
        return ResetOutcome(await self.sink(name), tuple(aborted))

    async def _complete_checkpointed(self, name: str, sink_id: int, lock: CommitLock) -> None:
        """Commit the sink's checkpointed PENDING epochs to its tables, under the reset's lock; nothing changed but
        what the committer would have done when the commit cannot be completed (FailedPrecondition when no retry
        can complete it, Unavailable otherwise)."""
        try:
            await self.committer.commit_checkpointed(sink_id, lock)
        except Exception as error:
            if isinstance(error, CoordinatorError) and not isinstance(error, CatalogUnavailable):
                raise  # the reset's own refusals (the lock lost, a suspended sink) say what they are
            message = (
                f"sink {name} cannot be reset: its checkpointed epochs could not be committed to its tables, so no "
                f"epoch was aborted and nothing else changed ({type(error).__name__}: {cause(error)})"
            )
            if cannot_succeed_by_retrying(error):
                raise FailedPrecondition(
                    f"{message}. Fix the cause (a table dropped for good: remove it from the sink with "
                    f"DELETE /api/v1/sinks/{name}/tables/<table>), then reset again"
                ) from error
            raise Unavailable(f"{message}. Retry the reset") from error
