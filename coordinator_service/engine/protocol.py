"""The two-phase commit state machine as the writers see it: register, pre-commit, checkpoint, state.

An epoch is PENDING once its pre-commit is durable, COMMITTED once its files
are in the Iceberg table, ABORTED when recovery or an operator gave it up.
The Coordinator is made of one part per call (registration.py: RegisterWriter
and EnsureTables; precommit.py: PreCommit; the checkpoint and the state here),
over what they share (protocol_base.py). It decides what a writer's call may
do and leaves every change of the log to its owner (coordinator_service.log:
epoch_transitions and the records beside it); it knows no transport and
reaches the tables only through coordinator_service.tables, in worker threads.
"""

from __future__ import annotations

import structlog

from coordinator_service import failpoints
from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.table_identifiers import check_sink_name
from coordinator_service.contract.views import CheckpointResult, EpochView, SinkState, SinkTable, from_attributes
from coordinator_service.engine.precommit import PreCommits
from coordinator_service.engine.registration import WriterRegistration
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import checkpoint_record, epoch_reads, sink_tables
from coordinator_service.log.epoch_rules import existing_sink

log = structlog.get_logger(__name__)


class Coordinator(WriterRegistration, PreCommits):
    """The writer-facing operations of the protocol."""

    async def commit_checkpoint(self, sink: str, epoch: int, writer_term: int, wait: bool) -> CheckpointResult:
        check_sink_name(sink)
        if epoch < 0:
            raise InvalidArgument(f"epoch {epoch} is negative: Spark batch ids start at 0")
        recorded = await self._group_checkpoint.submit(checkpoint_record.Checkpoint(sink, writer_term, epoch))
        if recorded is None:
            async with self.database.transaction() as session:
                recorded = await checkpoint_record.record_checkpoint(session, sink, writer_term, epoch)
        sink_id, numbering = recorded.sink_id, (recorded.incarnation, recorded.generation)
        result = CheckpointResult(recorded.committed_epoch, recorded.checkpointed_epoch)
        await failpoints.hit(Failpoint.CHECKPOINT_AFTER_RECORD)
        log.debug("checkpoint recorded", sink=sink, epoch=epoch, writer_term=writer_term)
        self.committer.wake(sink_id, flush=wait)
        if wait and result.committed_epoch < epoch:
            committed = await self.committer.wait_committed(sink_id, epoch, numbering)
            return CheckpointResult(committed_epoch=committed, checkpointed_epoch=result.checkpointed_epoch)
        return result

    async def sink_state(self, sink: str) -> SinkState:
        check_sink_name(sink)
        async with self.database.transaction() as session:
            row = await existing_sink(session, sink)
            epochs = await epoch_reads.epochs_not_committed(session, row.id)
            tables = await sink_tables.tables_of_sink(session, row.id)
            return from_attributes(
                SinkState,
                row,
                sink=row.name,
                table=row.table_identifier,
                tables=tuple(SinkTable(table.identifier, table.committed_epoch) for table in tables),
                epochs=tuple(from_attributes(EpochView, epoch) for epoch in epochs),
                key_columns=tuple(row.key_columns),
                incarnation=str(row.incarnation),
            )
