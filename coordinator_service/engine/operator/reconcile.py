"""Bringing a sink back: reconcile a suspended sink's log to what its tables hold (a metastore restored to an
earlier point), resume a stuck committer."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from coordinator_service.contract.errors import CoordinatorError, FailedPrecondition, InvalidArgument, NotFound, quote
from coordinator_service.engine import settlement
from coordinator_service.engine.metastore_checks import table_seen
from coordinator_service.engine.operator.answers import Operator, Reconciled, SinkOverview, SuspendedReconciled
from coordinator_service.engine.operator.base import OperationsBase, check_known_name, sink_named
from coordinator_service.log import commit_lock, epoch_numbering, sink_rows, sink_tables
from coordinator_service.log.sink_rows import RowLock
from coordinator_service.tables.catalog_calls import in_catalog

log = structlog.get_logger(__name__)


class ReconcileActions(OperationsBase):
    """An operator's way back for a sink out of step: reconcile it to its tables, or resume its committer."""

    async def reconcile(self, name: str, confirm: str, reason: str, operator: Operator) -> Reconciled:
        """Set a suspended sink's log to what its tables hold (a metastore restored to an earlier point, or a table
        dropped and created again under its name), docs/operations.md 'A restored metastore'. Under the commit lock,
        on fresh loads: the restart point is the least newest epoch the tables hold; the PENDING epochs up to it
        are marked COMMITTED, the others aborted; the tables' records and UUIDs are the ones found; the writer is
        fenced, and the next one starts a new numbering, as after a reset. A table missing from the catalog, or a
        sink of another catalog, is the configuration's to fix: refused, nothing changed."""
        check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        return await self._reconcile(name, reason, operator, suspended_only=False)

    async def reconcile_suspended(
        self, names: Sequence[str] | None, reason: str, operator: Operator
    ) -> SuspendedReconciled:
        """Reconcile several suspended sinks to their tables (after a restore of the metastore, every sink the restore
        put behind its tables), each as `reconcile` does, one after the other: `names`, or every suspended sink
        (None). A named sink that is unknown or not suspended refuses the request, nothing changed: a sink in step
        would only lose its writer and its epochs not committed. A sink whose reconcile is refused (another
        catalog, a table missing) is reported with why, and the others go on."""
        if names is not None:
            for name in names:
                check_known_name(name)
        async with self.database.transaction() as session:
            sinks = {sink.name: sink for sink in await sink_rows.all_sinks(session)}
        suspended = [name for name, sink in sinks.items() if sink.suspended_reason is not None]
        if names is not None:
            unknown = [name for name in names if name not in sinks]
            if unknown:
                raise NotFound(
                    f"sinks {', '.join(map(quote, unknown))} are not registered (GET /api/v1/sinks lists the sinks); "
                    "nothing was changed"
                )
            in_step = [name for name in names if name not in suspended]
            if in_step:
                raise FailedPrecondition(
                    f"sinks {', '.join(map(quote, in_step))} are not suspended: reconciling one that is in step with "
                    "its tables fences its writer and aborts its epochs not committed (POST /api/v1/sinks/{sink}/"
                    "reconcile does it, for one sink, if that is what you want); nothing was changed"
                )
        reconciled: list[Reconciled] = []
        refused: list[tuple[str, CoordinatorError]] = []
        for name in suspended if names is None else list(dict.fromkeys(names)):
            try:
                reconciled.append(await self._reconcile(name, reason, operator, suspended_only=True))
            except CoordinatorError as error:
                refused.append((name, error))
        return SuspendedReconciled(tuple(reconciled), tuple(refused))

    async def _reconcile(self, name: str, reason: str, operator: Operator, *, suspended_only: bool) -> Reconciled:
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
        if sink.catalog != self.iceberg.catalog_name:
            raise FailedPrecondition(
                f"sink {name} was created in catalog {sink.catalog!r}, the coordinator uses "
                f"{self.iceberg.catalog_name!r}: configure the catalog it was created in; nothing was changed"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "reconcile") as lock:
            async with self.database.transaction() as session:
                sink = await sink_named(session, name)
                tables = await sink_tables.tables_of_sink(session, sink.id)
            if suspended_only and sink.suspended_reason is None:
                raise FailedPrecondition(f"sink {name} is no longer suspended; nothing was changed")
            identity = settlement.identity_of(sink)
            seen = {}
            for table in tables:
                try:
                    seen[table.identifier] = await in_catalog(table_seen, self.iceberg, table.identifier, identity)
                except InvalidArgument:
                    raise FailedPrecondition(
                        f"table {table.identifier} of sink {name} does not exist in catalog "
                        f"{self.iceberg.catalog_name!r}: configure the right catalog, or remove a fan-out table from "
                        "the sink; nothing was changed"
                    ) from None
            held = {
                table.identifier: max(
                    table.committed_epoch, -1 if (m := seen[table.identifier].newest_marker) is None else m
                )
                for table in tables
            }
            restart = max(min(held.values()), sink.committed_epoch)
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await sink_named(session, name, lock=RowLock.UPDATE)
                for table in tables:
                    await sink_tables.record_table_uuid(
                        session, sink.id, table.identifier, seen[table.identifier].table_uuid
                    )
                aborted = await epoch_numbering.reconcile_numbering(
                    session, sink, restart, held, f"reconcile by {operator}: {reason}"
                )
                await sink_rows.set_suspended(session, sink.id, None)
        log.warning(
            "sink reconciled to its tables by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            restart_epoch=restart,
            tables=held,
            aborted_epochs=aborted,
        )
        await self.committer.resume(sink.id)
        self.cleaner.wake()
        return Reconciled(await self.sink(name), restart, held)

    async def resume_sink(self, name: str, operator: Operator) -> SinkOverview:
        """Retry a stuck sink's commits; the sink as it is once the first pass has run (stuck again, or not)."""
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
        was_stuck = await self.committer.resume(sink.id)
        log.warning(
            "sink resumed by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            was_stuck=was_stuck,
        )
        await self.committer.wait_for_pass(sink.id, self.lock_timeout_seconds)
        return await self.sink(name)
