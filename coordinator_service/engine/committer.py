"""The commit path: checkpointed PENDING epochs into Iceberg, in order, exactly once.

One asyncio task per sink drives its commits. A pass holds the sink's
PostgreSQL advisory lock, so one committer runs per sink even across
coordinator replicas on one database. Before each append it walks the table's
ancestry for the sink's newest marker: epochs at or below it are already in
the table (a crash hit between the append and the COMMITTED update) and are
only marked. Every failure is retried with backoff, forever, and is visible in
the logs and in `health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
import pydantic
import structlog
from sqlalchemy.exc import SQLAlchemyError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import (
    CatalogConflict,
    CatalogUnavailable,
    CommitLockLost,
    InvalidArgument,
    MetastoreUnavailable,
    SinkSuspended,
    cause,
)
from coordinator_service.contract.source_positions import snapshot_positions
from coordinator_service.engine import settlement
from coordinator_service.engine.commit_history import CommitHistory
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import (
    commit_lock,
    commit_record,
    epoch_reads,
    epoch_transitions,
    precommit_metadata,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.log.precommit_metadata import DataFileEntry, MetadataDecodeError, PreCommitMetadata
from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_calls import PERMANENT_FAILURES, in_catalog
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.table_maintenance import table_properties_for

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TableFailure:
    """Why the last commit to one of a sink's tables failed, and whether retrying can fix it (when not, the committer
    stops until an operator acts: the sink is stuck)."""

    error: str
    retryable: bool


@dataclass
class CommitterHealth:
    """What the admin API shows of one sink's committer."""

    retrying: bool = False
    attempts: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None
    # Set when a commit failed in a way no retry can fix: the committer waits for an operator's resume.
    stuck: str | None = None
    # Fan-out: the tables whose last commit failed while the others committed, with why.
    failing_tables: dict[str, TableFailure] = field(default_factory=dict)


@dataclass
class SinkCommitState:
    """One sink's committer in this process (Kafka Connect's CommitState): its task and what wakes it, what the
    admin API shows of it, and what it committed here last."""

    # The sink's name, once a pass read it (log lines and metrics before that say its id).
    name: str | None = None
    # Set from the first time the sink is driven here: the admin API shows it (absent: idle here).
    health: CommitterHealth | None = None
    task: asyncio.Task[None] | None = None
    # Set to start a pass; the flush request (a writer waiting for its commit) skips the rest of the interval.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    flush: asyncio.Event = field(default_factory=asyncio.Event)
    # The committed epoch this process's last COMMITTED transaction recorded, and in which numbering (a reset
    # starts another), so that a waiter it wakes need not read the sink again.
    committed_here: tuple[Numbering, int] | None = None
    # When this process last committed the sink (time.monotonic()), for the commit interval.
    last_commit: float | None = None
    # Passes finished (whatever their outcome), and that count when the sink was last resumed.
    passes_done: int = 0
    resumed_at: int | None = None

    def label(self, sink_id: int) -> str:
        return self.name or f"id {sink_id}"

    def healthy(self) -> CommitterHealth:
        """The sink's health, created on first use (the sink is no longer idle here)."""
        if self.health is None:
            self.health = CommitterHealth()
        return self.health


class KeyedCommitNotBuilt(Exception):
    """Epochs of a keyed sink (an upsert or change stream) wait for the keyed commit path, which this release does not
    have: appending their rows would put a key in the table twice."""


def refuse_keyed_epochs(sink: Sink, pending: Sequence[EpochRecord], decoded: Sequence[PreCommitMetadata]) -> None:
    """The one place the keyed commit path goes (issue 29, docs/architecture.md "Row mutations: position deletes
    resolved at commit"): every epoch of a keyed sink with files, and every epoch with key files, must be committed
    as a row delta per table (tables.row_deltas.commit_row_delta: its data files, and its key files' keys resolved
    to position deletes), never appended. Until that path is built, such a pass raises KeyedCommitNotBuilt: the
    committer is stuck (the admin API and the metrics say so) and the epochs stay PENDING, in the log, for a release
    that commits them. An empty epoch changes no row and is committed as ever."""
    keyed = [
        row.epoch
        for row, metadata in zip(pending, decoded, strict=True)
        if metadata.key_files or (sink.key_columns and metadata.data_files)
    ]
    if keyed:
        raise KeyedCommitNotBuilt(
            f"the keyed commit path is not built in this release: epochs {keyed[:5]} of keyed sink {sink.name} stay "
            "PENDING (an append would put keys in the table twice); upgrade the coordinator, then resume the sink"
        )


# Failures of a commit pass that retrying cannot fix: the log's record cannot be decoded, the table is gone or
# refuses what the pass built, the catalog refuses the coordinator's credentials, a keyed epoch this release cannot
# commit, or the code met a state it does not expect. Everything else (conflicts, outages, a lost lock, timeouts) is
# retried.
_PERMANENT_FAILURES: tuple[type[BaseException], ...] = (
    MetadataDecodeError,
    KeyedCommitNotBuilt,
    InvalidArgument,
    SinkSuspended,
    *PERMANENT_FAILURES,
    pydantic.ValidationError,
    AssertionError,
    TypeError,
    AttributeError,
    KeyError,
)


# The epoch numbering a sink row is in: its incarnation and generation (a reset starts a new one).
Numbering = tuple[uuid.UUID, int]


def numbering_of(sink: Sink) -> Numbering:
    return (sink.incarnation, sink.generation)


def cannot_succeed_by_retrying(error: BaseException) -> bool:
    return isinstance(error, _PERMANENT_FAILURES)


def retry_cause(error: BaseException | None) -> str:
    """Why a commit pass failed, as the retries metric names it (metrics.RETRY_CAUSES)."""
    if isinstance(error, CommitLockLost):
        return "commit_lock_lost"
    chain: list[BaseException] = []
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    if any(isinstance(each, CatalogConflict) for each in chain):
        return "catalog_conflict"
    for each in chain:  # the outermost that says whose failure it was
        if isinstance(each, CatalogUnavailable):
            return "catalog"
        if isinstance(each, MetastoreUnavailable | SQLAlchemyError | psycopg.Error):
            return "metastore"
    return "other"


class Committer:
    def __init__(self, database: Database, iceberg: IcebergGateway, settings: Settings) -> None:
        self.database = database
        self.iceberg = iceberg
        self.settings = settings
        # Each sink's committer in this process, by sink id.
        self._sinks: defaultdict[int, SinkCommitState] = defaultdict(SinkCommitState)
        # The last hour of each sink's commits made here, for the console's charts.
        self.history = CommitHistory()
        self._progress = asyncio.Condition()
        self._commits_here = 0
        self._background: list[asyncio.Task[None]] = []
        # A pass holds two connections (its advisory lock's and a transaction's): bounding the passes keeps
        # the pool from running dry with every sink's task holding a lock connection, waiting for a second.
        # asyncio's semaphore hands its slots out in arrival order: a sink that just committed queues behind
        # the sinks already waiting.
        self._passes = asyncio.Semaphore(max(1, settings.commit_concurrency))
        # Told each table a pass appended files to, once the pass is recorded (the maintainer sets it: it asks for the
        # sink's run when the commit took the table past a maintenance threshold).
        self.after_append: Callable[[Sink, str], None] = lambda sink, table: None

    @property
    def health(self) -> dict[int, CommitterHealth]:
        """What the admin API shows of each sink's committer here (a sink never driven here is absent: idle)."""
        return {sink_id: state.health for sink_id, state in self._sinks.items() if state.health is not None}

    def start(self) -> None:
        """Start the poller, which first resumes whatever the log holds."""
        self._background = [asyncio.create_task(self._poll_forever(), name="committer-poller")]

    async def stop(self) -> None:
        tasks = [*self._background, *(state.task for state in self._sinks.values() if state.task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for state in self._sinks.values():
            state.task = None

    def wake(self, sink_id: int, *, flush: bool = False) -> None:
        """Start a commit pass of the sink; with `flush`, without waiting out the rest of its commit interval
        (a writer waits for the commit: the end of an availableNow run, a stop)."""
        state = self._sinks[sink_id]
        if flush:
            state.flush.set()
        state.wake.set()
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._drive(sink_id, state), name=f"committer-{sink_id}")

    async def wait_committed(self, sink_id: int, epoch: int, numbering: Numbering) -> int:
        """Wait until the sink's committed epoch reaches `epoch` (here or on another replica) in `numbering`."""
        while True:
            # A commit here that lands while the sink is being read below bumps the counter, so it
            # is not missed; a commit by another replica is seen at the next read.
            seen = self._commits_here
            committed_here = self._sinks[sink_id].committed_here
            if committed_here is not None and committed_here[0] == numbering and committed_here[1] >= epoch:
                return committed_here[1]  # durable: recorded by this process's COMMITTED transaction
            async with self.database.transaction() as session:
                sink = await sink_rows.sink_by_id(session, sink_id)
                assert sink is not None
                committed = sink.committed_epoch
            if committed >= epoch:
                return committed
            async with self._progress:
                if self._commits_here == seen:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._progress.wait(), timeout=self.settings.poll_interval_seconds)

    async def _notify_progress(self) -> None:
        async with self._progress:
            self._commits_here += 1
            self._progress.notify_all()

    async def _poll_forever(self) -> None:
        resumed = False
        while True:
            try:
                if not resumed:
                    await self._commit_empty_backlogs()
                    resumed = True
                async with self.database.transaction() as session:
                    sink_ids = await epoch_reads.sink_ids_with_commit_work(session)
                for sink_id in sink_ids:
                    self.wake(sink_id)
            except Exception as error:
                log.warning("looking for commit work failed; will look again", error=str(error))
            await asyncio.sleep(self.settings.poll_interval_seconds)

    async def _commit_empty_backlogs(self) -> None:
        """On start, mark the backlogs that hold no file in one transaction instead of one pass per sink."""
        started = time.monotonic()
        async with self.database.transaction() as session:
            backlogs = await commit_record.commit_empty_backlogs(session)
            await epoch_transitions.prune_committed(
                session, [backlog.sink_id for backlog in backlogs], self.settings.retention_epochs
            )
        if not backlogs:
            return
        seconds = time.monotonic() - started
        for backlog in backlogs:
            state = self._sinks[backlog.sink_id]
            state.name = backlog.sink
            state.healthy()  # committed here: no longer idle
            metrics.record_commit(backlog.sink, backlog.epochs, snapshots=0, seconds=seconds)
            self.history.record(backlog.sink, seconds, backlog.epochs, lag_epochs=0)
        log.info(
            "empty checkpointed epochs committed",
            sinks=len(backlogs),
            epochs=sum(backlog.epochs for backlog in backlogs),
            seconds=round(seconds, 4),
        )
        await self._notify_progress()

    async def _drive(self, sink_id: int, state: SinkCommitState) -> None:
        # Context variables are per task: every line this sink's committer logs carries the sink (and not
        # the epoch of the request whose context the task was created from).
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(sink_id=sink_id)
        health = state.healthy()
        while True:
            await state.wake.wait()
            state.wake.clear()
            if health.stuck is not None:
                continue  # until an operator resumes the sink
            # Outside the slot: a sink waiting out its interval leaves the slot to the others.
            await self._respect_commit_interval(state)
            try:
                if await self._commit_with_retries(sink_id):
                    state.wake.set()  # more to commit: go on after the sinks that wait for a slot
            except SinkSuspended:
                # Not the committer's failure, and no resume here is its way back: the sink waits for a reconcile or
                # a check (in any process) that brings it back, after which the poller wakes it again (it leaves
                # suspended sinks alone).
                log.info("the sink is suspended: its commits wait until it is back in step with its tables")
            except Exception as error:  # only what retrying cannot fix comes out of the retries
                self._stick(sink_id, health, error)
            finally:
                state.passes_done += 1
                await self._notify_progress()

    def _stick(self, sink_id: int, health: CommitterHealth, error: BaseException) -> None:
        health.stuck = f"{type(error).__name__}: {cause(error)}"
        health.retrying = False
        health.last_error, health.last_error_at = health.stuck, datetime.now(UTC)
        metrics.COMMITTER_STUCK_EVENTS.labels(self._sinks[sink_id].label(sink_id)).inc()
        log.error(
            "the sink's commits cannot succeed by retrying; they wait for an operator to fix the cause and "
            "resume the sink (POST /api/v1/sinks/<name>/resume)",
            error=health.stuck,
        )

    def resume(self, sink_id: int) -> bool:
        """Retry a stuck sink's commits (after an operator fixed the cause); whether it was stuck here."""
        state = self._sinks[sink_id]
        was_stuck = state.health is not None and state.health.stuck is not None
        if state.health is not None:
            state.health.stuck = None
        state.resumed_at = state.passes_done
        self.wake(sink_id)
        return was_stuck

    async def wait_for_pass(self, sink_id: int, timeout_seconds: float) -> None:
        """Wait (at most timeout_seconds) until the sink's committer finished a pass since its last resume."""
        state = self._sinks[sink_id]
        target = state.passes_done if state.resumed_at is None else state.resumed_at
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_seconds), self._progress:
                await self._progress.wait_for(lambda: state.passes_done > target)

    async def _commit_with_retries(self, sink_id: int) -> bool:
        """One commit pass, retried until it succeeds; whether more checkpointed epochs wait."""
        sink_state = self._sinks[sink_id]
        health = sink_state.healthy()

        def record_failure(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            health.retrying = True
            health.attempts = state.attempt_number
            health.last_error = f"{type(error).__name__}: {error}"
            health.last_error_at = datetime.now(UTC)
            metrics.COMMIT_RETRIES.labels(sink_state.label(sink_id), retry_cause(error)).inc()
            log.warning(
                "commit failed; retrying",
                attempt=state.attempt_number,
                retry_in_seconds=round(state.upcoming_sleep, 2),
                error=health.last_error,
            )

        retrying = AsyncRetrying(
            # An Exception only: a cancellation (BaseException) must end the task, never be retried.
            retry=retry_if_exception(
                lambda error: isinstance(error, Exception) and not cannot_succeed_by_retrying(error)
            ),
            wait=wait_exponential_jitter(
                multiplier=self.settings.retry_initial_seconds,
                max=self.settings.retry_max_seconds,
                jitter=self.settings.retry_initial_seconds,
            ),
            before_sleep=record_failure,
            reraise=True,
        )
        more = False
        async for attempt in retrying:
            with attempt:
                more = await self._commit_pass(sink_id)
        health.retrying = False
        health.attempts = 0
        health.failing_tables.clear()
        return more

    async def _commit_pass(self, sink_id: int) -> bool:
        """Commit the next group of checkpointed epochs under a slot and the sink's lock; whether more wait."""
        async with self._passes, commit_lock.try_holding(self.database, sink_id) as lock:
            if lock is None:
                log.debug("another committer holds the sink", sink_id=sink_id)
                return False
            await failpoints.hit(Failpoint.COMMIT_AFTER_LOCK)
            return await self._commit_next(sink_id, lock)

    async def commit_checkpointed(self, sink_id: int, lock: CommitLock) -> None:
        """Commit every checkpointed PENDING epoch of the sink under a lock the caller holds (a reset), pass after
        pass, at once: no slot, no interval, no retry (a failure is the caller's)."""
        while await self._commit_next(sink_id, lock):
            pass

    async def _commit_next(self, sink_id: int, lock: CommitLock) -> bool:
        """Commit the next group of checkpointed epochs to each of the sink's tables; whether more may wait (or the
        group must be walked again).

        Per table, only the epochs above the newest one it holds (the log's record) are its work: the tables
        a crash or a failure left behind catch up, and those that hold the group already are not walked. A table
        that fails does not stop the others: the pass records what each holds and marks COMMITTED the epochs all
        of their tables hold, then raises the failure (the pass is retried, and only that table has work then).
        """
        limit = self.settings.commit_max_epochs
        async with self.database.reading() as session:  # a plan: the COMMITTED record checks it again under locks
            sink, waiting, recorded = await epoch_reads.sink_and_checkpointed_pending(session, sink_id, limit=limit + 1)
        if sink is None or not waiting:
            return False
        pending, more = waiting[:limit], len(waiting) > limit
        state = self._sinks[sink_id]
        state.name = sink.name
        if sink.suspended_reason is not None:
            raise SinkSuspended(sink.suspended_reason)
        structlog.contextvars.bind_contextvars(sink=sink.name)
        log_ = log.bind(table=sink.table_identifier, epochs=[row.epoch for row in pending])
        decoded = [precommit_metadata.decode(row.metadata_) for row in pending]
        refuse_keyed_epochs(sink, pending, decoded)
        started = time.monotonic()
        if not any(each.data_files for each in decoded):
            # Empty epochs are never appended, so no marker can hold them: mark them without reading the tables.
            empty = _PassAppends()
            await self._record_commit(sink, pending, empty.of(pending, {}), empty, started, log_)
            return more
        files = _files_by_table(sink, recorded, pending, decoded)
        top = pending[-1].epoch
        # The newest epoch each table holds after the pass: a table without work holds the whole group.
        held = {table: max(epoch, top) if table not in files else epoch for table, epoch in recorded.items()}
        appends = _PassAppends()
        found: list[int] = []
        failures: list[BaseException] = []
        grown: list[str] = []
        health = state.healthy()
        for index, (table, work) in enumerate(files.items()):
            try:
                outcome = await self._commit_table(sink, table, work, top, decoded[-1].properties, lock)
            except Exception as error:
                health.failing_tables[table] = TableFailure(
                    f"{type(error).__name__}: {cause(error)}", not cannot_succeed_by_retrying(error)
                )
                if isinstance(error, CommitLockLost) or len(files) == 1:
                    raise
                # The other tables go on: this one is retried by the next pass (alone, unless more epochs came), or,
                # when no retry can help (a table dropped for good), waits for an operator (stuck) while the others
                # hold what they got.
                failures.append(error)
                log_.warning("commit to one of the sink's tables failed", failed_table=table, error=str(error))
                held[table] = max(recorded[table], next(iter(work)) - 1)  # below its first epoch with files
                continue
            if outcome is None:
                return True  # a cached table was stale: walk the current one (what this pass appended is found)
            health.failing_tables.pop(table, None)
            if outcome.files:
                grown.append(table)
            held[table] = outcome.held
            appends.add(outcome, own=table == sink.table_identifier)
            if not outcome.files:
                found.extend(outcome.snapshots)
                more = True
            if index < len(files) - 1:
                await failpoints.hit(Failpoint.COMMIT_BETWEEN_TABLES)
        if appends.files:
            await failpoints.hit(Failpoint.COMMIT_AFTER_APPEND)
        settled = min(held.values())
        done = [row for row in pending if row.epoch <= settled]
        moved = {table: epoch for table, epoch in held.items() if epoch > recorded[table]}
        if done:
            await self._record_commit(sink, done, appends.of(done, moved), appends, started, log_)
        elif moved:
            async with self.database.connection(autocommit=True) as connection:
                await sink_tables.record_tables(connection, sink, moved)
        marked_found = sorted({epoch for epoch in found if epoch <= settled})
        if marked_found:
            log_.info("epochs found already in the table; marked committed", epochs=marked_found)
        for table in grown:
            self.after_append(sink, table)
        if failures:
            raise failures[0]
        return more

    async def _commit_table(
        self,
        sink: Sink,
        table_name: str,
        work: Mapping[int, Sequence[DataFileEntry]],
        top: int,
        properties: Mapping[str, str],
        lock: CommitLock,
    ) -> _TableCommit | None:
        """Append the table's files of these epochs (by epoch, oldest first) as one snapshot with the sink's marker of
        `top`, the group's newest epoch; or, when its markers show that it holds some already, only say which. None:
        the cached table was stale, and the pass must walk the current one."""
        identity = settlement.identity_of(sink)
        # The cached table (kept current by this process's own commits): the append asserts its branch head,
        # so a stale one fails the commit and the next round walks a freshly loaded table.
        table, from_cache = await in_catalog(self.iceberg.cached, table_name)
        markers = await in_catalog(self.iceberg.sink_markers, table_name, identity, next(iter(work)), table)
        if markers and markers[-1].epoch >= next(iter(work)):
            if from_cache:
                # Marking needs the current table, not a remembered one: walk again on a fresh load.
                self.iceberg.forget(table_name)
                return None
            # A crash hit after an append and before its record: those epochs are only marked, and the pass
            # after appends the rest (on a table walked again).
            return _TableCommit(settlement.covering_snapshots(work, markers), files=0, held=markers[-1].epoch)
        await failpoints.hit(Failpoint.COMMIT_BEFORE_APPEND)
        # The lock's connection may have died since the walk: then another committer, an operator or the
        # cleaner may be deciding about these epochs, and the append must not happen.
        await lock.verify()
        entries = [entry for each in work.values() for entry in each]
        try:
            snapshot_id = await in_catalog(
                self.iceberg.append,
                table_name,
                identity,
                top,
                uuid.uuid4().hex,
                entries,
                table,
                self._table_properties(sink),
                snapshot_positions(properties),  # a coalesced snapshot says where its newest epoch ended
            )
        except CatalogConflict as error:
            if not from_cache:
                raise
            # The remembered table was behind the catalog (append forgot it): walk the current one now.
            log.debug("cached table was stale; walking the current table", stale_table=table_name, error=str(error))
            return None
        return _TableCommit(dict.fromkeys(work, snapshot_id), files=len(entries), held=top)

    def _table_properties(self, sink: Sink) -> Mapping[str, str]:
        """What the sink's commits make sure its tables have: manifest merging and old metadata files removed
        when its maintenance is on (coordinator_service.engine.maintenance)."""
        policy = self.settings.with_overrides(sink.maintenance_overrides)
        return table_properties_for(policy.manifest_merge_min_count) if policy.maintenance_enabled else {}

    async def _record_commit(
        self,
        sink: Sink,
        pending: Sequence[EpochRecord],
        appended: commit_record.Appended,
        appends: _PassAppends,
        started: float,
        log_: structlog.stdlib.BoundLogger,
    ) -> None:
        """The COMMITTED record of the pass (commit_record.record_commit), and what this process keeps of it."""
        epochs = [row.epoch for row in pending]
        committed = await commit_record.record_commit(
            self.database, sink, pending, appended, appends.files, self.settings.retention_epochs
        )
        if committed is None:
            return
        state = self._sinks[sink.id]
        state.committed_here = (numbering_of(sink), committed)
        await failpoints.hit(Failpoint.COMMIT_AFTER_MARK)
        state.last_commit = time.monotonic()
        state.healthy()  # committed here: no longer idle
        seconds = time.monotonic() - started
        metrics.record_commit(sink.name, len(epochs), snapshots=appends.snapshots, seconds=seconds)
        self.history.record(sink.name, seconds, len(epochs), lag_epochs=sink.checkpointed_epoch - committed)
        log_.debug(
            "epochs committed",
            epochs=epochs,
            snapshot_ids=sorted({snapshot for snapshot in appended.snapshots.values() if snapshot is not None}),
            files=appends.files,
            records=sum(row.record_count for row in pending),
            seconds=round(time.monotonic() - started, 4),
        )
        await self._notify_progress()

    async def _respect_commit_interval(self, state: SinkCommitState) -> None:
        """Wait out the rest of the sink's commit interval, unless a writer waits for the commit (flush)."""
        last = state.last_commit
        remaining = 0.0 if last is None else self.settings.commit_interval_seconds - (time.monotonic() - last)
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.flush.wait(), remaining)
        state.flush.clear()


@dataclass(frozen=True)
class _TableCommit:
    """One table's part of a pass: the snapshot that holds each of the table's epochs (found by its markers or
    appended now) and the files appended."""

    snapshots: dict[int, int]
    files: int
    # The newest epoch the table holds now.
    held: int


@dataclass
class _PassAppends:
    """What a pass did to the sink's tables."""

    # The snapshot of the sink's own table that holds each epoch with files there.
    own_snapshots: dict[int, int] = field(default_factory=dict)
    files: int = 0
    snapshots: int = 0

    def add(self, outcome: _TableCommit, own: bool) -> None:
        if own:
            self.own_snapshots.update(outcome.snapshots)
        self.files += outcome.files
        self.snapshots += 1 if outcome.files else 0

    def of(self, done: Sequence[EpochRecord], tables: Mapping[str, int]) -> commit_record.Appended:
        """The COMMITTED record of the epochs all their tables hold, and of the tables that moved."""
        return commit_record.Appended(
            attempts={row.epoch: row.attempt for row in done},
            snapshots={row.epoch: self.own_snapshots.get(row.epoch) for row in done},
            tables=tables,
        )


def _files_by_table(
    sink: Sink, recorded: Mapping[str, int], pending: Sequence[EpochRecord], decoded: Sequence[PreCommitMetadata]
) -> dict[str, dict[int, list[DataFileEntry]]]:
    """Each table's work in a pass: its files of each epoch above the newest it holds, by epoch (only epochs with
    files there); the sink's own table first, then the others by name, each with work."""
    work: dict[str, dict[int, list[DataFileEntry]]] = {}
    for row, metadata in zip(pending, decoded, strict=True):
        for table, entries in metadata.by_table().items():
            if table not in recorded:
                raise AssertionError(f"epoch {row.epoch} has files in table {table}, which is not one of the sink's")
            if entries and row.epoch > recorded[table]:
                work.setdefault(table, {})[row.epoch] = entries
    return dict(sorted(work.items(), key=lambda item: (item[0] != sink.table_identifier, item[0])))
