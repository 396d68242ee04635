"""What every operator action shares, and the checks and reads they make alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.errors import FailedPrecondition, NotFound, quote
from coordinator_service.contract.table_identifiers import sink_name_problem
from coordinator_service.contract.views import EpochStatus
from coordinator_service.engine import settlement
from coordinator_service.engine.cleaner import Cleaner
from coordinator_service.engine.commit_state import CommitterHealth
from coordinator_service.engine.committer import Committer
from coordinator_service.engine.maintenance import Maintainer
from coordinator_service.engine.operator.answers import SinkOverview
from coordinator_service.log import epoch_reads, sink_rows, sink_tables
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.log.sink_rows import EpochCounts, RowLock
from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)


class OperationsBase:
    """What every operator action shares: the log, the tables, the background work it wakes or waits for."""

    def __init__(
        self,
        database: Database,
        iceberg: TableFormat,
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

    async def sink(self, name: str) -> SinkOverview:
        check_known_name(name)
        async with self.database.transaction() as session:
            overviews = await sink_overviews(
                session, self.committer.health, self.settings.stalled_after_seconds, name=name
            )
        if not overviews:
            raise unknown_sink(name)
        return overviews[0]

    async def _fence(self, sink: Sink, tables: Sequence[str], lock: CommitLock, why: str) -> None:
        """Commit a fence to each of the sink's tables under its commit lock (TableFormat.fence): an append
        that a committer which lost the lock built on an older head fails instead of landing, so the files of what
        is aborted next can be deleted whenever the cleaner comes. A table that cannot take it leaves nothing
        aborted (503: retry)."""
        for table in tables:
            await lock.verify()
            await in_catalog(self.iceberg.fence, table, settlement.identity_of(sink), why)


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
                table.identifier: [other for other in shared[table.identifier] if other != sink.name]
                for table in tables[sink.id]
                if table.identifier in shared
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


async def pending_epochs(session: AsyncSession, sink: Sink, at_or_below: int | None) -> list[EpochRecord]:
    rows = await epoch_reads.epochs_not_committed(session, sink.id)
    return [
        row for row in rows if row.status == EpochStatus.PENDING and (at_or_below is None or row.epoch <= at_or_below)
    ]


def partly_committed(name: str, partial: Mapping[int, Sequence[str]], refused: str) -> FailedPrecondition:
    """An epoch some of its tables hold and others not yet: only the committer can settle it, by appending."""
    epoch, behind = next(iter(partial.items()))
    return FailedPrecondition(
        f"sink {name} epoch {epoch} is already in some of its tables but not yet in {', '.join(behind)}: the "
        f"committer is completing it (GET /api/v1/sinks/{name} shows each table; a table whose catalog fails is "
        f"retried until it is back). Nothing was changed: {refused} before the epoch is COMMITTED"
    )


def check_abortable(sink: Sink, row: EpochRecord, force: bool) -> None:
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


def check_known_name(name: str) -> None:
    # RegisterWriter refuses other names, so no such sink exists (and the name never reaches SQL).
    if sink_name_problem(name) is not None:
        raise unknown_sink(name)


def unknown_sink(name: str) -> NotFound:
    return NotFound(f"sink {quote(name)} is not registered (GET /api/v1/sinks lists the sinks)")


async def sink_named(session: AsyncSession, name: str, lock: RowLock | None = None) -> Sink:
    sink = await sink_rows.sink_by_name(session, name, lock=lock)
    if sink is None:
        raise unknown_sink(name)
    return sink


async def existing_epoch(session: AsyncSession, sink: Sink, epoch: int, *, for_update: bool = False) -> EpochRecord:
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
