"""Registering a writer (a new term, recovery of the epochs above its checkpoint, a new numbering after a reset) and
ensuring the tables a fan-out writer routes to."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import CheckpointBehind, FailedPrecondition, InvalidArgument, quote
from coordinator_service.contract.table_identifiers import check_sink_name, check_table_identifier
from coordinator_service.contract.views import Registration, TableLocation, TablesEnsured
from coordinator_service.engine import settlement
from coordinator_service.engine.protocol_base import ProtocolBase, hint_of
from coordinator_service.engine.writer_requests import MAX_FILES_PER_PRECOMMIT, MAX_TABLES_PER_ENSURE, TableRequest
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import (
    commit_lock,
    commit_record,
    epoch_numbering,
    epoch_reads,
    epoch_transitions,
    part_rows,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.epoch_rules import check_checkpoint_range, check_not_suspended, check_term, existing_sink
from coordinator_service.log.models import AbortCause, Sink
from coordinator_service.log.sink_rows import RowLock
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.keyed_tables import check_key_request
from coordinator_service.tables.schema_fit import decode_arrow_schema

log = structlog.get_logger(__name__)


class WriterRegistration(ProtocolBase):
    """RegisterWriter and EnsureTables: a writer's term, and the tables it writes."""

    async def register_writer(
        self,
        sink: str,
        table: str,
        checkpointed_epoch: int,
        writer_count: int = 1,
        arrow_schema: bytes = b"",
        partition_by: Sequence[str] = (),
        key_columns: Sequence[str] = (),
    ) -> Registration:
        check_sink_name(sink)
        check_key_request(key_columns)
        if checkpointed_epoch < -1:
            raise InvalidArgument(f"checkpointed_epoch {checkpointed_epoch} is below -1 (-1 means no checkpoint)")
        if writer_count < 1:
            raise InvalidArgument(f"writer_count {writer_count} must be at least 1")
        schema: pa.Schema | None = decode_arrow_schema(arrow_schema) if arrow_schema else None

        # Every check first: a writer that will be refused changes nothing, the table included.
        async with self.database.transaction() as session:
            existing = await sink_rows.sink_by_name(session, sink)
            self._check_new_tables([table], set() if existing is None else {existing.table_identifier})
            if existing is not None:
                await _check_registration(session, existing, table, checkpointed_epoch, key_columns)
                above = await epoch_reads.pending_epochs_above(session, existing.id, checkpointed_epoch)
                recorded = await sink_tables.recorded_epochs(session, existing.id)
            others = (await sink_rows.sinks_writing(session, [table], besides=sink)).get(table, [])
        location = await in_catalog(
            self.iceberg.ensure_table, table, schema, tuple(partition_by), others, tuple(key_columns)
        )
        await failpoints.hit(Failpoint.REGISTER_BEFORE_RECOVERY)

        if existing is not None and above:
            # Epochs are about to be aborted: under the commit lock, what the table holds is settled first.
            async with commit_lock.holding(
                self.database, existing.id, self.committer.settings.admin_lock_timeout_seconds, f"sink {sink}: register"
            ) as lock:
                found = await settlement.holdings(self.iceberg, existing, recorded, above)
                if found.touched():
                    # Above the writer's checkpoint, yet in the tables: the checkpoint is behind the tables.
                    # Unreachable while the log is sound (only checkpointed epochs are appended).
                    async with self.database.transaction() as session:
                        marked = await commit_record.mark_held(session, existing.id, found.held)
                    raise CheckpointBehind(
                        f"sink {sink}: its tables already hold epochs {found.touched()}, above the writer's checkpoint "
                        f"{checkpointed_epoch}: the Spark checkpoint was lost or rolled back. Those in all their "
                        f"tables ({marked}) were marked COMMITTED and nothing else changed; reset the sink with "
                        f"POST /api/v1/sinks/{sink}/reset and start from a new checkpoint"
                    )
                await lock.verify()
                registration, sink_id = await self._register(
                    sink, table, checkpointed_epoch, writer_count, location, key_columns
                )
        else:
            registration, sink_id = await self._register(
                sink, table, checkpointed_epoch, writer_count, location, key_columns
            )
        await failpoints.hit(Failpoint.REGISTER_AFTER_RECOVERY)
        log.info(
            "writer registered",
            sink=sink,
            table=table,
            writer_term=registration.writer_term,
            checkpointed_epoch=checkpointed_epoch,
            aborted_epochs=list(registration.aborted_epochs),
            recommitting_epochs=list(registration.recommitting_epochs),
        )
        self.committer.wake(sink_id)
        if registration.aborted_epochs:
            self.cleaner.wake()
        return registration

    async def _register(
        self,
        sink: str,
        table: str,
        checkpointed_epoch: int,
        writer_count: int,
        location: str,
        key_columns: Sequence[str],
    ) -> tuple[Registration, int]:
        """The registration's one transaction: the checks again, under the sink's row lock, then the new term."""
        async with self.database.transaction() as session:
            await sink_rows.insert_sink_if_absent(
                session, sink, table, self.iceberg.catalog_name, checkpointed_epoch, key_columns
            )
            row = await sink_rows.sink_by_name(session, sink, lock=RowLock.UPDATE)
            assert row is not None
            if row.rebase_on_register:
                await _rebase_after_reset(session, row, checkpointed_epoch)
            await _check_registration(session, row, table, checkpointed_epoch, key_columns)
            row.writer_term += 1
            row.writer_count = writer_count
            row.checkpointed_epoch = checkpointed_epoch
            await part_rows.drop_parts(session, row.id)  # parts of multi-writer epochs of the fenced term
            aborted = await epoch_transitions.abort_pending_above(
                session,
                row.id,
                checkpointed_epoch,
                f"recovery: writer term {row.writer_term} restarted from checkpoint {checkpointed_epoch}",
                AbortCause.RECOVERY,
            )
            metrics.ABORTED_EPOCHS.labels(sink, "recovery").inc(len(aborted))
            await epoch_transitions.advance_committed_epoch(session, row.id)
            await session.refresh(row)
            recommitting = await epoch_reads.pending_epochs_at_or_below(
                session, row.id, checkpointed_epoch, limit=MAX_FILES_PER_PRECOMMIT
            )
            self._sink_hints[sink] = await hint_of(session, row)
            return (
                Registration(
                    writer_term=row.writer_term,
                    committed_epoch=row.committed_epoch,
                    checkpointed_epoch=row.checkpointed_epoch,
                    aborted_epochs=tuple(aborted),
                    recommitting_epochs=tuple(r.epoch for r in recommitting),
                    table_location=location,
                    nested_namespaces=self.iceberg.nested_namespaces,
                    key_columns=tuple(row.key_columns),
                ),
                row.id,
            )

    def _check_new_tables(self, tables: Sequence[str], recorded: set[str]) -> None:
        """The name policy (table_identifiers) for each table the log does not record yet: a sink's table named
        before the policy existed keeps working; a new one must fit it, on this catalog."""
        for table in tables:
            if table not in recorded:
                check_table_identifier(table, nested_namespaces=self.iceberg.nested_namespaces)

    async def ensure_tables(self, sink: str, writer_term: int, tables: Sequence[TableRequest]) -> TablesEnsured:
        """Fan-out: create or evolve each table as RegisterWriter does the sink's own, then make them the sink's.

        Every check first (the request, the sink, the term): a writer that will be refused changes nothing. The
        tables are made the sink's under its row lock with the term checked again, so a writer fenced meanwhile
        adds none (a table it created in the catalog stays there, unused, as after a refused RegisterWriter).
        """
        check_sink_name(sink)
        if len(tables) > MAX_TABLES_PER_ENSURE:
            raise InvalidArgument(f"{len(tables)} tables in one EnsureTables exceed {MAX_TABLES_PER_ENSURE}")
        names = [spec.table for spec in tables]
        if len(set(names)) != len(names):
            duplicate = next(name for name in names if names.count(name) > 1)
            raise InvalidArgument(f"EnsureTables names table {quote(duplicate)} more than once")
        for spec in tables:
            check_key_request(spec.key_columns)
        schemas = [decode_arrow_schema(spec.arrow_schema) if spec.arrow_schema else None for spec in tables]
        async with self.database.transaction() as session:
            existing = await existing_sink(session, sink)
            check_term(existing, writer_term)
            for spec in tables:
                _check_same_key(existing, spec.key_columns, spec.table)
            self._check_new_tables(names, set(await sink_tables.recorded_epochs(session, existing.id)))
            others = await sink_rows.sinks_writing(session, names, besides=sink)
        locations = [
            await in_catalog(
                self.iceberg.ensure_table,
                spec.table,
                schema,
                spec.partition_by,
                others.get(spec.table, []),
                spec.key_columns,
            )
            for spec, schema in zip(tables, schemas, strict=True)
        ]
        async with self.database.transaction() as session:
            row = await existing_sink(session, sink, lock=RowLock.UPDATE)
            check_term(row, writer_term)
            await sink_tables.add_tables(session, row, names)
            self._sink_hints[sink] = await hint_of(session, row)
        log.info("tables ensured", sink=sink, writer_term=writer_term, tables=names)
        return TablesEnsured(
            tuple(
                TableLocation(spec.table, location, spec.key_columns)
                for spec, location in zip(tables, locations, strict=True)
            )
        )


async def _rebase_after_reset(session: AsyncSession, sink: Sink, checkpoint: int) -> None:
    """The first registration after an operator reset or reconcile: the writer's checkpoint starts a new epoch
    numbering (epoch_numbering.rebase_numbering; see coordinator_service.engine.operator.epochs, reset_sink)."""
    previous_committed_epoch = sink.committed_epoch
    dropped = await epoch_numbering.rebase_numbering(session, sink, checkpoint)
    log.warning(
        "sink rebased on the first writer after a reset",
        sink=sink.name,
        generation=sink.generation,
        previous_committed_epoch=previous_committed_epoch,
        checkpointed_epoch=checkpoint,
        log_rows_dropped=dropped,
    )


async def _check_registration(
    session: AsyncSession, sink: Sink, table: str, checkpoint: int, key_columns: Sequence[str]
) -> None:
    """Refuse a writer that does not fit the sink: another table, another key, a checkpoint behind the recorded one,
    or one over epochs never pre-committed or aborted. After a reset, the first writer's checkpoint is adopted."""
    _check_same_table(sink, table)
    _check_same_key(sink, key_columns, table)
    check_not_suspended(sink)
    if sink.rebase_on_register:
        return
    if checkpoint < sink.checkpointed_epoch:
        raise CheckpointBehind(
            f"sink {sink.name}: the writer's checkpoint holds epoch {checkpoint}, but the coordinator "
            f"recorded checkpoint {sink.checkpointed_epoch} (committed {sink.committed_epoch}): the Spark "
            f"checkpoint was lost or rolled back. Nothing was changed. Restore the checkpoint, or reset "
            f"the sink with POST /api/v1/sinks/{sink.name}/reset and start from a new checkpoint"
        )
    between = await epoch_reads.epochs_between(session, sink.id, sink.checkpointed_epoch, checkpoint)
    check_checkpoint_range(sink.name, between, sink.checkpointed_epoch, checkpoint)


def _check_same_table(sink: Sink, table: str) -> None:
    if sink.table_identifier != table:
        raise FailedPrecondition(
            f"sink {sink.name} writes table {sink.table_identifier}, not {quote(table)}: "
            "use another sink name for another table"
        )


def _check_same_key(sink: Sink, key_columns: Sequence[str], table: str) -> None:
    """A sink's key is fixed when it is created: a writer (or a table it ensures) naming another key, or none for a
    keyed sink, would have its epochs committed the wrong way (rows appended as new ones, or resolved by other
    columns)."""
    if list(key_columns) == list(sink.key_columns):
        return
    has = f"is keyed by {quote(', '.join(sink.key_columns))}" if sink.key_columns else "has no key (an append stream)"
    names = f"names the key {quote(', '.join(key_columns))}" if key_columns else "names no key (an append stream)"
    raise FailedPrecondition(
        f"sink {sink.name} {has}, but its writer {names} for table {quote(table)}: a sink's key is fixed when it is "
        "created. Write with the sink's key, or use another sink (and table) for another key. Nothing was changed"
    )
