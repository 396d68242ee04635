"""What operators may see and do to sinks: list them, read their epochs, abort an epoch, reset a sink.

Like coordinator_service.engine.protocol, this module knows no transport: the admin
API (admin.routes_sinks, admin.api) maps its results and errors to HTTP.

An abort and a reset first take the sink's commit lock (coordinator_service.
commit_lock), the lock a committer holds while it appends to Iceberg, and walk
the table's markers on a fresh load: epochs the table already holds are marked
COMMITTED, only the others are aborted. Nothing is aborted while its files are
being committed, and nothing the table holds is ever reported as aborted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import metrics
from coordinator_service.contract.errors import (
    CatalogUnavailable,
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    cause,
    quote,
)
from coordinator_service.contract.table_identifiers import sink_name_problem
from coordinator_service.contract.views import EpochStatus
from coordinator_service.engine import settlement
from coordinator_service.engine.cleaner import Cleaner
from coordinator_service.engine.committer import Committer, CommitterHealth, cannot_succeed_by_retrying
from coordinator_service.engine.file_deletion import DELETE_BATCH, DroppedTable, FileDeleter
from coordinator_service.engine.maintenance import Maintainer, policy_of
from coordinator_service.engine.metastore_checks import table_seen
from coordinator_service.log import (
    commit_lock,
    commit_record,
    epoch_numbering,
    epoch_reads,
    epoch_transitions,
    maintenance_log,
    part_rows,
    path_claims,
    precommit_metadata,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import AbortCause, EpochRecord, MaintenanceRun, Sink
from coordinator_service.log.path_claims import CleanupDelays, MarkRule
from coordinator_service.log.precommit_metadata import PreCommitMetadata
from coordinator_service.log.sink_rows import EpochCounts, RowLock
from coordinator_service.log.sink_tables import TableOfSink
from coordinator_service.settings import MaintenancePolicy, Settings
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.iceberg import IcebergGateway

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Operator:
    """Who asked: the token's identity ('admin', or 'anonymous' when no admin token is configured) and from where."""

    identity: str
    address: str

    def __str__(self) -> str:
        return f"{self.identity} from {self.address}"


@dataclass(frozen=True)
class SinkOverview:
    sink: Sink
    counts: EpochCounts
    # None: this process has not run the sink's committer yet (another replica may have).
    health: CommitterHealth | None
    # Its tables, its own first (fan-out: then the others by name).
    tables: Sequence[TableOfSink]
    # The other sinks writing each of its tables that others write too, by name.
    also_written_by: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Why the sink does not advance (its oldest PENDING epoch waited STALLED_AFTER_SECONDS); None while it does.
    stalled: str | None = None


@dataclass(frozen=True)
class EpochDetail:
    row: EpochRecord
    metadata: PreCommitMetadata


@dataclass(frozen=True)
class AbortOutcome:
    row: EpochRecord
    # False when the epoch was ABORTED already (the request changed nothing).
    changed: bool
    # Set when a checkpointed epoch was aborted (force): what the operator gave up.
    warning: str | None = None


@dataclass(frozen=True)
class ResetOutcome:
    sink: SinkOverview
    aborted_epochs: tuple[int, ...]


@dataclass(frozen=True)
class GivenUp:
    """An epoch's files in a table removed from its sink: their records will not reach any table."""

    epoch: int
    files: int
    records: int


@dataclass(frozen=True)
class TableRemoved:
    table: str
    sink: SinkOverview
    given_up: tuple[GivenUp, ...]

    def summary(self) -> str:
        """One line for people (the console's notice)."""
        epochs, records = len(self.given_up), sum(each.records for each in self.given_up)
        return (
            f"table {self.table} removed from sink {self.sink.sink.name}: {epochs} epoch{'' if epochs == 1 else 's'} "
            f"given up ({records} records), the writer fenced: restart it with routes that no longer name the table"
        )


@dataclass(frozen=True)
class SinkDeleted:
    """What deleting a sink did: the records of its epochs not committed that no table will get, the files proven
    garbage and deleted (those its epochs gave up, and those the tables it dropped reached), those left on storage
    (not provably garbage: a table gone, one that references them, a file under another table's location or reached
    through a link, one another sink claims), and the tables dropped from their catalog."""

    sink: str
    given_up: tuple[GivenUp, ...]
    files_deleted: int
    files_kept: int
    tables_dropped: tuple[str, ...]

    def summary(self) -> str:
        """One line for people (the console's notice, the command line's answer)."""
        epochs, files = len(self.given_up), self.files_deleted
        records = sum(each.records for each in self.given_up)
        return (
            f"sink {self.sink} deleted: {epochs} epoch{'' if epochs == 1 else 's'} given up ({records} records), "
            f"{files} file{'' if files == 1 else 's'} deleted, {self.files_kept} left, "
            f"{', '.join(self.tables_dropped) or 'no table'} dropped"
        )


@dataclass(frozen=True)
class Reconciled:
    sink: SinkOverview
    # The restart point: every table holds the epochs up to it; a new writer starts from its end offsets.
    restart_epoch: int
    # The newest epoch each table holds; those above restart_epoch are read again by a writer started from it.
    tables: dict[str, int]


@dataclass(frozen=True)
class SuspendedReconciled:
    """What a reconcile of several suspended sinks did: each sink reconciled, and each refused with why (nothing of
    it changed), in the order asked."""

    reconciled: tuple[Reconciled, ...]
    refused: tuple[tuple[str, CoordinatorError], ...]

    def summary(self) -> list[str]:
        """One line a sink, for people (the command line's answer)."""
        lines = [
            f"sink {each.sink.sink.name} reconciled: restart epoch {each.restart_epoch}, tables "
            + ", ".join(f"{table} at {epoch}" for table, epoch in each.tables.items())
            for each in self.reconciled
        ]
        lines += [f"sink {name} not reconciled: {error.message}" for name, error in self.refused]
        return lines or ["no sink is suspended: nothing to reconcile"]


@dataclass(frozen=True)
class MaintenanceView:
    """A sink's table maintenance: the policy in force, the sink's overrides of the defaults, the last runs."""

    policy: MaintenancePolicy
    overrides: dict[str, object]
    runs: Sequence[MaintenanceRun]


class Operations:
    def __init__(
        self,
        database: Database,
        iceberg: IcebergGateway,
        committer: Committer,
        cleaner: Cleaner,
        maintainer: Maintainer,
        settings: Settings,
    ) -> None:
        self.database = database
        self.iceberg = iceberg
        self.committer = committer
        self.cleaner = cleaner
        self.maintainer = maintainer
        self.settings = settings
        self.lock_timeout_seconds = settings.admin_lock_timeout_seconds

    async def sinks(self) -> list[SinkOverview]:
        async with self.database.transaction() as session:
            return await sink_overviews(session, self.committer.health, self.settings.stalled_after_seconds)

    async def sink(self, name: str) -> SinkOverview:
        _check_known_name(name)
        async with self.database.transaction() as session:
            overviews = await sink_overviews(
                session, self.committer.health, self.settings.stalled_after_seconds, name=name
            )
        if not overviews:
            raise _unknown_sink(name)
        return overviews[0]

    async def epochs(
        self, name: str, status: EpochStatus | None, below_epoch: int | None, limit: int
    ) -> tuple[Sequence[EpochRecord], int | None]:
        """A page of epochs, newest first, and the epoch the next page starts below (None: no next page)."""
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            rows = await epoch_reads.epochs_newest_first(session, sink.id, status, below_epoch, limit + 1)
        if len(rows) > limit:
            return rows[:limit], rows[limit - 1].epoch
        return rows, None

    async def epoch(self, name: str, epoch: int) -> EpochDetail:
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            row = await _existing_epoch(session, sink, epoch)
        return EpochDetail(row, precommit_metadata.decode(row.metadata_))

    async def abort_epoch(self, name: str, epoch: int, reason: str, force: bool, operator: Operator) -> AbortOutcome:
        """Abort a PENDING epoch, only with force: its records will not reach the table.

        Without force nothing changes: Spark may already have checkpointed the epoch (at or below the
        recorded checkpoint, or above it with its report still on the way), and will not write it again.
        With force the abort holds the commit lock and walks the table first: an epoch the table holds is
        marked COMMITTED instead. A later checkpoint that covers an epoch aborted here is accepted.
        """
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            row = await _existing_epoch(session, sink, epoch)
            _check_abortable(sink, row, force)
            if row.status == EpochStatus.ABORTED:
                return AbortOutcome(row, changed=False)
        async with commit_lock.holding(
            self.database, sink.id, self.lock_timeout_seconds, f"abort epoch {epoch}"
        ) as lock:
            return await self._abort(name, epoch, reason, operator, lock)

    async def _abort(self, name: str, epoch: int, reason: str, operator: Operator, lock: CommitLock) -> AbortOutcome:
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            pending = await _pending_epochs(session, sink, at_or_below=epoch)
            recorded = await sink_tables.recorded_epochs(session, sink.id)
            tables = await sink_tables.tables_of_sink(session, sink.id)
        await self._fence(sink, [table.table for table in tables], lock, f"abort of epoch {epoch} by {operator}")
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
            raise _partly_committed(name, {epoch: found.partial[epoch]}, "it cannot be aborted")
        await lock.verify()
        async with self.database.transaction() as session:
            # The sink row lock orders this abort with CommitCheckpoint, which moves checkpointed_epoch under it.
            sink = await _existing_sink(session, name, lock=RowLock.UPDATE)
            row = await _existing_epoch(session, sink, epoch, for_update=True)
            _check_abortable(sink, row, force=True)
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

    async def _fence(self, sink: Sink, tables: Sequence[str], lock: CommitLock, why: str) -> None:
        """Commit a fence to each of the sink's tables under its commit lock (IcebergGateway.fence): an append
        that a committer which lost the lock built on an older head fails instead of landing, so the files of what
        is aborted next can be deleted whenever the cleaner comes. A table that cannot take it leaves nothing
        aborted (503: retry)."""
        for table in tables:
            await lock.verify()
            await in_catalog(self.iceberg.fence, table, settlement.identity_of(sink), why)

    async def reset_sink(self, name: str, confirm: str, reason: str, operator: Operator) -> ResetOutcome:
        """Prepare a sink for a writer whose Spark checkpoint was lost (see docs/operations.md).

        Under the commit lock, on a fresh load of the table: every PENDING epoch the table holds is marked
        COMMITTED, every other one is aborted, the checkpointed epoch goes back to the committed one, the
        writer term is bumped (fencing a running writer), the generation is bumped, and the next
        RegisterWriter adopts whatever checkpoint it presents (registration._rebase_after_reset). A catalog that
        cannot be read makes the reset fail with nothing changed (Unavailable).
        """
        _check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        async with self.database.transaction() as session:
            sink_id = (await _existing_sink(session, name)).id
        async with commit_lock.holding(self.database, sink_id, self.lock_timeout_seconds, "reset") as lock:
            # The restart point: every checkpointed epoch goes into every table with files of it first, so that
            # after the reset each table holds exactly the epochs up to the one reported (a group a crash left
            # half appended is completed, never aborted in some tables and held by others).
            await self._complete_checkpointed(name, sink_id, lock)
            async with self.database.transaction() as session:
                sink = await _existing_sink(session, name)
                pending = await _pending_epochs(session, sink, at_or_below=None)
                recorded = await sink_tables.recorded_epochs(session, sink.id)
                tables = await sink_tables.tables_of_sink(session, sink.id)
            await self._fence(sink, [table.table for table in tables], lock, f"reset by {operator}")
            found = await settlement.holdings(self.iceberg, sink, recorded, pending)
            if found.partial:
                raise _partly_committed(name, found.partial, "the sink cannot be reset")
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await _existing_sink(session, name, lock=RowLock.UPDATE)
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

    async def remove_table(self, name: str, table: str, confirm: str, reason: str, operator: Operator) -> TableRemoved:
        """The way out of a fan-out table gone for good (dropped from its catalog): it stops being one of the sink's
        tables, and the files the sink's epochs that are not COMMITTED have there are given up (their records are
        counted in the answer and the log; their paths are no longer the log's to delete). The writer is fenced: a
        writer still routing to the table must restart (its EnsureTables would make the table the sink's again).
        The sink's own table cannot be removed."""
        _check_known_name(name)
        if confirm != table:
            raise InvalidArgument(f"confirm must repeat the table name {quote(table)} exactly, got {quote(confirm)}")
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
        if table == sink.table_identifier:
            raise FailedPrecondition(
                f"{quote(table)} is sink {name}'s own table: it cannot be removed from the sink, only the sink itself"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "remove table") as lock:
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await _existing_sink(session, name, lock=RowLock.UPDATE)
                if table not in await sink_tables.recorded_epochs(session, sink.id):
                    raise NotFound(f"table {quote(table)} is not one of sink {name}'s tables")
                given_up = []
                for row in await epoch_reads.epochs_not_committed(session, sink.id):
                    metadata = precommit_metadata.decode(row.metadata_)
                    gone = metadata.by_table().get(table, [])
                    gone_keys = metadata.key_files_by_table().get(table, [])
                    if not gone and not gone_keys:
                        continue
                    kept = replace(
                        metadata,
                        data_files=tuple(e for e in metadata.data_files if e not in gone),
                        key_files=tuple(e for e in metadata.key_files if e not in gone_keys),
                    )
                    epoch_transitions.give_files_up(row, kept)
                    await path_claims.forget(session, [e.path for e in gone] + [e.path for e in gone_keys])
                    given_up.append(GivenUp(row.epoch, len(gone), sum(entry.record_count for entry in gone)))
                await sink_tables.remove_table(session, sink.id, table)
                sink.writer_term += 1
                await epoch_transitions.advance_committed_epoch(session, sink.id)
        log.warning(
            "table removed from a sink by an operator",
            sink=name,
            table=table,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            given_up={each.epoch: each.records for each in given_up},
            writer_term=sink.writer_term,
        )
        self.committer.resume(sink.id)  # stuck on the table, most likely: the cause is gone
        return TableRemoved(table, await self.sink(name), tuple(given_up))

    async def missing_from_catalog(self, tables: Sequence[str]) -> set[str]:
        """Those of `tables` the catalog does not have (dropped from it); none when the catalog cannot be asked."""
        try:
            return {table for table in tables if not await in_catalog(self.iceberg.catalog.table_exists, table)}
        except CatalogUnavailable:
            return set()

    async def delete_sink(
        self, name: str, confirm: str, reason: str, drop_tables: bool, operator: Operator
    ) -> SinkDeleted:
        """Delete a sink: its rows in the log, the files of its epochs not committed, and with drop_tables its
        tables and their files. Refused, nothing changed, without its name in `confirm`, while its writer is
        live (a call within STALLED_AFTER_SECONDS: its next call would find no sink, and a restart would create
        it again without its epochs), and for drop_tables when another sink writes one of its tables.

        Holding the sink's commit lock (no commit, cleaner or maintenance of it meanwhile), its tables are fenced
        (as an abort does), every PENDING epoch is aborted, and every path it gave up goes to file_deletion at
        once (no cleanup delay: nothing will need them), which proves each one garbage or leaves it; then, when
        asked, the tables are dropped (_drop_tables) and the sink's rows deleted. What kept tables hold stays."""
        _check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        overview = await self.sink(name)
        async with self.database.transaction() as session:
            others = await sink_rows.sinks_writing(session, [t.table for t in overview.tables], besides=name)
        sink, called = overview.sink, overview.counts.writer_last_call_age_seconds
        if called is not None and called < self.settings.stalled_after_seconds:
            raise FailedPrecondition(
                f"sink {name}: its writer (term {sink.writer_term}) called {called:.0f} s ago: stop it first (its "
                "next call would find no sink, and its restart would create the sink again without these epochs), "
                f"then delete once it has been silent {self.settings.stalled_after_seconds:g} s "
                "(STALLED_AFTER_SECONDS). Nothing was changed"
            )
        if drop_tables and others:
            table, writers = next(iter(others.items()))
            raise FailedPrecondition(
                f"sink {name}: table {table} is also written by sink{'s' if len(writers) > 1 else ''} "
                f"{', '.join(writers)}: delete the sink without drop_tables, or those sinks first. Nothing was changed"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "delete") as lock:
            present = [t.table for t in overview.tables if await in_catalog(self.iceberg.catalog.table_exists, t.table)]
            await self._fence(sink, present, lock, f"deletion of sink {name} by {operator}")
            async with self.database.transaction() as session:
                given_up = tuple(
                    GivenUp(row.epoch, row.file_count, row.record_count)
                    for row in await _pending_epochs(session, sink, at_or_below=None)
                )
                await epoch_transitions.abort_pending_above(
                    session, sink.id, -1, f"sink deleted by {operator}: {reason}", AbortCause.OPERATOR
                )
                await part_rows.drop_parts(session, sink.id)
            deleted, kept = await self._delete_given_up(sink, present, lock)
            if drop_tables:
                dropped_deleted, dropped_kept = await self._drop_tables(sink, present, lock)
                deleted, kept = deleted + dropped_deleted, kept + dropped_kept
            await lock.verify()
            async with self.database.transaction() as session:
                await sink_rows.delete_sink(session, sink.id)
        dropped = tuple(present) if drop_tables else ()
        log.warning(
            "sink deleted by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            given_up={each.epoch: each.records for each in given_up},
            files_deleted=deleted,
            files_kept=kept,
            tables_dropped=list(dropped),
        )
        return SinkDeleted(name, given_up, deleted, kept, dropped)

    async def _delete_given_up(self, sink: Sink, tables: Sequence[str], lock: CommitLock) -> tuple[int, int]:
        """Every path the sink gave up, through file_deletion now (no delay); how many were deleted and how many
        left (the log stops deciding those: they stay on storage)."""
        at_once = CleanupDelays(0.0, 0.0)
        deleter = FileDeleter(self.database, self.iceberg, at_once)
        deleted = kept = 0
        while True:
            async with self.database.transaction() as session:
                due = [path.path for path in await path_claims.due_paths(session, sink.id, at_once, DELETE_BATCH)]
            if not due:
                return deleted, kept
            # No table left to prove them against (dropped by hand): nothing to hand the deleter, which would count
            # each as a refused deletion (an alert).
            done = await deleter.delete(sink.name, sink.id, lock, tables, due, MarkRule.DISCARDED) if tables else None
            left = sorted(set(due) - set(done.deleted if done else ()))
            async with self.database.transaction() as session:
                await path_claims.forget(session, left)
            deleted, kept = deleted + len(due) - len(left), kept + len(left)

    async def _drop_tables(self, sink: Sink, tables: Sequence[str], lock: CommitLock) -> tuple[int, int]:
        """Drop the tables from their catalog (the entry only: a catalog's purge would delete every file a table
        names, wherever it lies), then hand every file each one reached, read right before its drop under the lock,
        to file_deletion: it deletes those it proves garbage (under the dropped table's own directories, no link,
        no nested table, claimed by no other sink, the table still absent from the catalog). How many were deleted,
        and how many left on storage."""
        dropped, reached = [], set()
        for table in tables:
            await lock.verify()
            loaded = await in_catalog(self.iceberg.load, table)
            reached |= await in_catalog(tm.referenced_files, loaded)
            await in_catalog(self.iceberg.catalog.drop_table, table)
            self.iceberg.forget(table)
            dropped.append(DroppedTable(table, loaded))
        deleter = FileDeleter(self.database, self.iceberg, CleanupDelays(0.0, 0.0))
        done = await deleter.delete(
            sink.name, sink.id, lock, dropped, sorted(reached), MarkRule.DROPPED, metadata_files=True
        )
        return len(done.deleted), len(reached) - len(done.deleted)

    async def reconcile(self, name: str, confirm: str, reason: str, operator: Operator) -> Reconciled:
        """Set a suspended sink's log to what its tables hold (a metastore restored to an earlier point, or a table
        dropped and created again under its name), docs/operations.md 'A restored metastore'. Under the commit lock,
        on fresh loads: the restart point is the least newest epoch the tables hold; the PENDING epochs up to it
        are marked COMMITTED, the others aborted; the tables' records and UUIDs are the ones found; the writer is
        fenced, and the next one starts a new numbering, as after a reset. A table missing from the catalog, or a
        sink of another catalog, is the configuration's to fix: refused, nothing changed."""
        _check_known_name(name)
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
                _check_known_name(name)
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
            sink = await _existing_sink(session, name)
        if sink.catalog != self.iceberg.catalog_name:
            raise FailedPrecondition(
                f"sink {name} was created in catalog {sink.catalog!r}, the coordinator uses "
                f"{self.iceberg.catalog_name!r}: configure the catalog it was created in; nothing was changed"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "reconcile") as lock:
            async with self.database.transaction() as session:
                sink = await _existing_sink(session, name)
                tables = await sink_tables.tables_of_sink(session, sink.id)
            if suspended_only and sink.suspended_reason is None:
                raise FailedPrecondition(f"sink {name} is no longer suspended; nothing was changed")
            identity = settlement.identity_of(sink)
            seen = {}
            for table in tables:
                try:
                    seen[table.table] = await in_catalog(table_seen, self.iceberg, table.table, identity)
                except InvalidArgument:
                    raise FailedPrecondition(
                        f"table {table.table} of sink {name} does not exist in catalog {self.iceberg.catalog_name!r}: "
                        "configure the right catalog, or remove a fan-out table from the sink; nothing was changed"
                    ) from None
            held = {
                table.table: max(table.committed_epoch, -1 if (m := seen[table.table].newest_marker) is None else m)
                for table in tables
            }
            restart = max(min(held.values()), sink.committed_epoch)
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await _existing_sink(session, name, lock=RowLock.UPDATE)
                for table in tables:
                    await sink_tables.record_table_uuid(session, sink.id, table.table, seen[table.table].table_uuid)
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
        self.committer.resume(sink.id)
        self.cleaner.wake()
        return Reconciled(await self.sink(name), restart, held)

    async def resume_sink(self, name: str, operator: Operator) -> SinkOverview:
        """Retry a stuck sink's commits; the sink as it is once the first pass has run (stuck again, or not)."""
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
        was_stuck = self.committer.resume(sink.id)
        log.warning(
            "sink resumed by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            was_stuck=was_stuck,
        )
        await self.committer.wait_for_pass(sink.id, self.lock_timeout_seconds)
        return await self.sink(name)

    async def maintenance(self, name: str, runs: int) -> MaintenanceView:
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            recorded = await maintenance_log.maintenance_runs(session, sink.id, runs)
        return MaintenanceView(policy_of(self.settings, sink), dict(sink.maintenance_overrides or {}), recorded)

    async def set_maintenance_overrides(
        self, name: str, overrides: dict[str, object], operator: Operator, runs: int
    ) -> MaintenanceView:
        """Replace the sink's overrides of the maintenance defaults ({} goes back to the defaults); a name that
        is no setting or a value out of range is refused, nothing changed."""
        _check_known_name(name)
        try:
            self.settings.with_overrides(overrides)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise InvalidArgument(f"maintenance overrides refused: {quote(problems)}") from None
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name, lock=RowLock.UPDATE)
            sink.maintenance_overrides = overrides or None
        log.warning(
            "maintenance settings of a sink changed",
            sink=name,
            who=operator.identity,
            client=operator.address,
            overrides=overrides,
        )
        return await self.maintenance(name, runs)

    async def run_maintenance(self, name: str, operator: Operator) -> MaintenanceRun:
        """Maintain the sink's table now (the orphan sweep included), holding its commit lock; Unavailable,
        nothing done, when its committer keeps the lock past ADMIN_LOCK_TIMEOUT_SECONDS."""
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
        log.info("maintenance run asked by an operator", sink=name, who=operator.identity, client=operator.address)
        return await self.maintainer.run_now(sink.id)


async def sink_overviews(
    session: AsyncSession,
    health: Mapping[int, CommitterHealth],
    stalled_after_seconds: float,
    *,
    name: str | None = None,
) -> list[SinkOverview]:
    """Every sink (or the one named), by name, as the log has it, with this process's committer `health`."""
    rows = await sink_rows.sinks_with_epoch_counts(session, name)
    tables = await sink_tables.tables_of_sinks(session, [sink.id for sink, _ in rows])
    shared = await sink_rows.shared_tables(session)
    return [
        SinkOverview(
            sink,
            counts,
            health.get(sink.id),
            tables[sink.id],
            {
                table.table: [other for other in shared[table.table] if other != sink.name]
                for table in tables[sink.id]
                if table.table in shared
            },
            _stalled(sink, counts, stalled_after_seconds),
        )
        for sink, counts in rows
    ]


def _stalled(sink: Sink, counts: EpochCounts, after_seconds: float) -> str | None:
    """Why the sink does not advance, when its oldest PENDING epoch has waited `after_seconds`: for its checkpoint
    (the writer died or hangs), or for its commit (the committer retries, is stuck, or no replica runs it)."""
    epoch, age = counts.oldest_pending_epoch, counts.oldest_pending_age_seconds
    if epoch is None or age is None or age < after_seconds:
        return None
    if epoch <= sink.checkpointed_epoch:
        return (
            f"epoch {epoch} was checkpointed and is not committed {age:.0f} s after its pre-commit: the committer "
            "retries or is stuck (its state and last error say why), or no coordinator runs it"
        )
    called = counts.writer_last_call_age_seconds
    writer = (
        "no call of its writer is recorded"
        if called is None
        else f"its writer (term {sink.writer_term}) last called {called:.0f} s ago"
    )
    return (
        f"epoch {epoch} was pre-committed {age:.0f} s ago and its checkpoint has not come: {writer}. A writer that "
        "died resumes it when restarted (RegisterWriter); an operator may abort it"
    )


async def _pending_epochs(session: AsyncSession, sink: Sink, at_or_below: int | None) -> list[EpochRecord]:
    rows = await epoch_reads.epochs_not_committed(session, sink.id)
    return [
        row for row in rows if row.status == EpochStatus.PENDING and (at_or_below is None or row.epoch <= at_or_below)
    ]


def _partly_committed(name: str, partial: Mapping[int, Sequence[str]], refused: str) -> FailedPrecondition:
    """An epoch some of its tables hold and others not yet: only the committer can settle it, by appending."""
    epoch, behind = next(iter(partial.items()))
    return FailedPrecondition(
        f"sink {name} epoch {epoch} is already in some of its tables but not yet in {', '.join(behind)}: the "
        f"committer is completing it (GET /api/v1/sinks/{name} shows each table; a table whose catalog fails is "
        f"retried until it is back). Nothing was changed: {refused} before the epoch is COMMITTED"
    )


def _check_abortable(sink: Sink, row: EpochRecord, force: bool) -> None:
    if row.status == EpochStatus.COMMITTED:
        raise FailedPrecondition(
            f"sink {sink.name} epoch {row.epoch} is COMMITTED: its files are in the table (snapshot "
            f"{row.snapshot_id}); an abort cannot take them out"
        )
    if row.status == EpochStatus.PENDING and not force:
        where = (
            f"at or below the checkpointed epoch {sink.checkpointed_epoch}: Spark considers its batch done and "
            "will not write it again, and the committer is about to append it"
            if row.epoch <= sink.checkpointed_epoch
            else "pre-committed, and Spark may already have checkpointed its batch (the report is on its way): "
            "then it will not write it again"
        )
        raise ForceRequired(f"sink {sink.name} epoch {row.epoch} is {where}", row.record_count)


class ForceRequired(FailedPrecondition):
    """An abort of a PENDING epoch without force. Its message says how the API asks for force; explained() says
    it in another surface's words (the console's checkbox)."""

    def __init__(self, situation: str, records: int) -> None:
        self.situation = situation
        self.records = records
        super().__init__(self.explained("Send force=true"))

    def explained(self, how_to_force: str) -> str:
        return (
            f"{self.situation}. Nothing was changed. {how_to_force} only if its {self.records} records must never "
            "reach the table"
        )


def _check_known_name(name: str) -> None:
    # RegisterWriter refuses other names, so no such sink exists (and the name never reaches SQL).
    if sink_name_problem(name) is not None:
        raise _unknown_sink(name)


def _unknown_sink(name: str) -> NotFound:
    return NotFound(f"sink {quote(name)} is not registered (GET /api/v1/sinks lists the sinks)")


async def _existing_sink(session: AsyncSession, name: str, lock: RowLock | None = None) -> Sink:
    sink = await sink_rows.sink_by_name(session, name, lock=lock)
    if sink is None:
        raise _unknown_sink(name)
    return sink


async def _existing_epoch(session: AsyncSession, sink: Sink, epoch: int, *, for_update: bool = False) -> EpochRecord:
    row = await epoch_reads.epoch_row(session, sink.id, epoch, for_update=for_update)
    if row is None:
        if epoch > sink.committed_epoch:  # only COMMITTED epochs are pruned
            newest = await epoch_reads.newest_epoch(session, sink.id)
            known = "it has none yet" if newest is None else f"its newest epoch is {newest}"
            raise NotFound(f"sink {sink.name} has no epoch {epoch}: it was never pre-committed ({known})")
        raise NotFound(
            f"sink {sink.name} has no epoch {epoch} in its log: it was committed and pruned (committed epoch "
            f"{sink.committed_epoch}), or never pre-committed"
        )
    return row
