"""What operators may see and do to sinks: list them, read their epochs, abort an epoch, reset a sink.

Like coordinator_service.protocol, this module knows no transport: the admin
API (admin_api.py) maps its results and errors to HTTP.

An abort or a reset that can race with the committer (a forced abort of a
checkpointed epoch, a reset) first takes the sink's commit lock, the same
PostgreSQL advisory lock a committer holds while it appends to Iceberg, so
that no epoch is aborted while its files are being committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import metrics, precommit_metadata, repository
from coordinator_service.committer import Committer, CommitterHealth
from coordinator_service.database import Database
from coordinator_service.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, quote
from coordinator_service.iceberg import IcebergTables
from coordinator_service.models import EpochStatus, PendingSinkState, Sink
from coordinator_service.precommit_metadata import PreCommitMetadata
from coordinator_service.protocol import SINK_NAME, call_catalog
from coordinator_service.repository import EpochCounts

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


@dataclass(frozen=True)
class EpochDetail:
    row: PendingSinkState
    metadata: PreCommitMetadata


@dataclass(frozen=True)
class AbortOutcome:
    row: PendingSinkState
    # False when the epoch was ABORTED already (the request changed nothing).
    changed: bool
    # Set when a checkpointed epoch was aborted (force): what the operator gave up.
    warning: str | None = None


@dataclass(frozen=True)
class ResetOutcome:
    sink: SinkOverview
    aborted_epochs: tuple[int, ...]


class Operations:
    def __init__(
        self, database: Database, tables: IcebergTables, committer: Committer, lock_timeout_seconds: float
    ) -> None:
        self.database = database
        self.tables = tables
        self.committer = committer
        self.lock_timeout_seconds = lock_timeout_seconds

    async def sinks(self) -> list[SinkOverview]:
        async with self.database.transaction() as session:
            rows = await repository.sinks_with_epoch_counts(session)
        return [SinkOverview(sink, counts, self.committer.health.get(sink.id)) for sink, counts in rows]

    async def sink(self, name: str) -> SinkOverview:
        _check_known_name(name)
        async with self.database.transaction() as session:
            rows = await repository.sinks_with_epoch_counts(session, name)
        if not rows:
            raise _unknown_sink(name)
        sink, counts = rows[0]
        return SinkOverview(sink, counts, self.committer.health.get(sink.id))

    async def epochs(
        self, name: str, status: EpochStatus | None, below_epoch: int | None, limit: int
    ) -> tuple[Sequence[PendingSinkState], int | None]:
        """A page of epochs, newest first, and the epoch the next page starts below (None: no next page)."""
        _check_known_name(name)
        async with self.database.transaction() as session:
            sink = await _existing_sink(session, name)
            rows = await repository.epochs_newest_first(session, sink.id, status, below_epoch, limit + 1)
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
        """Abort a PENDING epoch; one at or below the sink's checkpoint only with force.

        A checkpointed epoch may be in the middle of its Iceberg commit, so a
        forced abort holds the commit lock and then checks the table itself.
        """
        _check_known_name(name)
        if not force:
            return await self._abort(name, epoch, reason, force, operator)
        async with self.database.transaction() as session:
            sink_id = (await _existing_sink(session, name)).id
        async with self._holding_commit_lock(name, sink_id, f"abort epoch {epoch}"):
            return await self._abort(name, epoch, reason, force, operator)

    async def _abort(self, name: str, epoch: int, reason: str, force: bool, operator: Operator) -> AbortOutcome:
        async with self.database.transaction() as session:
            # The sink row lock orders this abort with CommitCheckpoint, which moves checkpointed_epoch under it.
            sink = await _existing_sink(session, name, lock="update")
            row = await _existing_epoch(session, sink, epoch, for_update=True)
            if row.status == EpochStatus.ABORTED:
                return AbortOutcome(row, changed=False)
            if row.status == EpochStatus.COMMITTED:
                raise FailedPrecondition(
                    f"sink {name} epoch {epoch} is COMMITTED: its files are in the table (snapshot "
                    f"{row.snapshot_id}); an abort cannot take them out"
                )
            checkpointed = epoch <= sink.checkpointed_epoch
            if checkpointed and not force:
                raise FailedPrecondition(
                    f"sink {name} epoch {epoch} is at or below the checkpointed epoch {sink.checkpointed_epoch}: "
                    "Spark considers its batch done and will not write it again, and the committer is about to "
                    f"append it. Send force=true only if its {row.record_count} records must never reach the table"
                )
            if checkpointed:
                await self._refuse_if_in_table(sink, epoch)
            row.status = EpochStatus.ABORTED
            row.reason = f"operator abort by {operator}: {reason}"
            row.files_cleaned = False
            await session.flush()
            await session.refresh(row)  # updated_at is the server's
        warning = (
            f"epoch {epoch} was checkpointed: its {row.record_count} records will not reach the table, "
            "and the writer will not write them again"
            if checkpointed
            else None
        )
        log.warning(
            "epoch aborted by an operator",
            sink=name,
            epoch=epoch,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            forced=force,
            checkpointed=checkpointed,
            records_lost=row.record_count if checkpointed else 0,
        )
        metrics.ABORTED_EPOCHS.labels(name, "operator").inc()
        self.committer.wake_cleaner()
        return AbortOutcome(row, changed=True, warning=warning)

    async def _refuse_if_in_table(self, sink: Sink, epoch: int) -> None:
        """A crash between the append and the COMMITTED update leaves an epoch PENDING but in the table."""
        markers = await call_catalog(
            asyncio.to_thread(
                self.tables.sink_markers, sink.table_identifier, sink.name, epoch, generation=sink.generation
            )
        )
        if markers and markers[-1].epoch >= epoch:
            raise FailedPrecondition(
                f"sink {sink.name} epoch {epoch} is already in the table (snapshot {markers[-1].snapshot_id}); "
                "the committer will mark it COMMITTED. It cannot be aborted"
            )

    async def reset_sink(self, name: str, confirm: str, reason: str, operator: Operator) -> ResetOutcome:
        """Prepare a sink for a writer whose Spark checkpoint was lost (see docs/operations.md).

        Every PENDING epoch is aborted, the checkpointed epoch goes back to the
        committed one, the writer term is bumped (fencing a running writer),
        the generation is bumped, and the next RegisterWriter
        adopts whatever checkpoint it presents (protocol._rebase_after_reset).
        """
        _check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        async with self.database.transaction() as session:
            sink_id = (await _existing_sink(session, name)).id
        async with self._holding_commit_lock(name, sink_id, "reset"), self.database.transaction() as session:
            sink = await _existing_sink(session, name, lock="update")
            aborted = await repository.abort_pending_above(session, sink.id, -1, f"reset by {operator}: {reason}")
            # Checkpointed epochs not committed yet were aborted with the rest: the table's state is what stays.
            sink.checkpointed_epoch = sink.committed_epoch
            sink.writer_term += 1
            sink.generation += 1
            sink.rebase_on_register = True
        log.warning(
            "sink reset by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            aborted_epochs=aborted,
            writer_term=sink.writer_term,
            generation=sink.generation,
            committed_epoch=sink.committed_epoch,
        )
        metrics.ABORTED_EPOCHS.labels(name, "reset").inc(len(aborted))
        self.committer.wake_cleaner()
        return ResetOutcome(await self.sink(name), tuple(aborted))

    @asynccontextmanager
    async def _holding_commit_lock(self, name: str, sink_id: int, action: str) -> AsyncIterator[None]:
        async with self.database.connection() as connection:
            if not await repository.wait_commit_lock(connection, sink_id, self.lock_timeout_seconds):
                raise Unavailable(
                    f"sink {name}: its committer has been committing to Iceberg for more than "
                    f"{self.lock_timeout_seconds:g} s, so the {action} could not start; nothing was changed. "
                    "Retry; if this persists, look at the committer's last error in GET /api/v1/sinks/" + name
                )
            try:
                yield
            finally:
                await repository.release_commit_lock(connection, sink_id)
                await connection.commit()


def _check_known_name(name: str) -> None:
    # RegisterWriter refuses other names, so no such sink exists (and the name never reaches SQL).
    if not SINK_NAME.match(name):
        raise _unknown_sink(name)


def _unknown_sink(name: str) -> NotFound:
    return NotFound(f"sink {quote(name)} is not registered (GET /api/v1/sinks lists the sinks)")


async def _existing_sink(session: AsyncSession, name: str, lock: str | None = None) -> Sink:
    sink = await repository.sink_by_name(session, name, lock=lock)
    if sink is None:
        raise _unknown_sink(name)
    return sink


async def _existing_epoch(
    session: AsyncSession, sink: Sink, epoch: int, *, for_update: bool = False
) -> PendingSinkState:
    row = await repository.epoch_row(session, sink.id, epoch, for_update=for_update)
    if row is None:
        raise NotFound(
            f"sink {sink.name} has no epoch {epoch} in its log: it was never pre-committed, or it was "
            f"committed and pruned (committed epoch {sink.committed_epoch})"
        )
    return row
