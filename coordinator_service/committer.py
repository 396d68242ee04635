"""The commit path: checkpointed PENDING epochs into Iceberg, in order, exactly once; aborted files removed.

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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from pyiceberg.exceptions import CommitFailedException
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from coordinator_service import failpoints, metrics, precommit_metadata, repository
from coordinator_service.database import Database
from coordinator_service.failpoints import Failpoint
from coordinator_service.iceberg import IcebergTables, Marker
from coordinator_service.models import PendingSinkState, Sink
from coordinator_service.settings import Settings

log = structlog.get_logger(__name__)

CLEANUP_BATCH = 100


@dataclass
class CommitterHealth:
    """What the admin API shows of one sink's committer."""

    retrying: bool = False
    attempts: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None
    last_commit_at: datetime | None = None


class Committer:
    def __init__(self, database: Database, tables: IcebergTables, settings: Settings) -> None:
        self.database = database
        self.tables = tables
        self.settings = settings
        self.health: dict[int, CommitterHealth] = {}
        self._wake_events: dict[int, asyncio.Event] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._cleaner_event = asyncio.Event()
        self._progress = asyncio.Condition()
        self._commits_here = 0
        self._last_commit: dict[int, float] = {}
        self._sink_names: dict[int, str] = {}
        self._background: list[asyncio.Task[None]] = []
        # A pass holds two connections (its advisory lock's and a transaction's): bounding the passes keeps
        # the pool from running dry with every sink's task holding a lock connection, waiting for a second.
        self._passes = asyncio.Semaphore(max(1, settings.commit_concurrency))

    def start(self) -> None:
        """Start the poller (which first resumes whatever the log holds) and the cleaner."""
        self._background = [
            asyncio.create_task(self._poll_forever(), name="committer-poller"),
            asyncio.create_task(self._clean_forever(), name="aborted-file-cleaner"),
        ]

    async def stop(self) -> None:
        tasks = [*self._background, *self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def wake(self, sink_id: int) -> None:
        event = self._wake_events.get(sink_id)
        if event is None:
            event = self._wake_events[sink_id] = asyncio.Event()
        event.set()
        if sink_id not in self._tasks or self._tasks[sink_id].done():
            self._tasks[sink_id] = asyncio.create_task(self._drive(sink_id, event), name=f"committer-{sink_id}")

    def wake_cleaner(self) -> None:
        self._cleaner_event.set()

    async def wait_committed(self, sink_id: int, epoch: int) -> int:
        """Wait until the sink's committed epoch reaches `epoch` (here or on another replica)."""
        while True:
            # A commit here that lands while the sink is being read below bumps the counter, so it
            # is not missed; a commit by another replica is seen at the next read.
            seen = self._commits_here
            async with self.database.transaction() as session:
                sink = await repository.sink_by_id(session, sink_id)
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
                    sink_ids = await repository.sink_ids_with_commit_work(session)
                for sink_id in sink_ids:
                    self.wake(sink_id)
                self.wake_cleaner()
            except Exception as error:
                log.warning("looking for commit work failed; will look again", error=str(error))
            await asyncio.sleep(self.settings.poll_interval_seconds)

    async def _commit_empty_backlogs(self) -> None:
        """On start, mark the backlogs that hold no file in one transaction instead of one pass per sink."""
        started = time.monotonic()
        async with self.database.transaction() as session:
            backlogs = await repository.commit_empty_backlogs(session)
            await repository.prune_committed(
                session, [backlog.sink_id for backlog in backlogs], self.settings.retention_epochs
            )
        if not backlogs:
            return
        seconds = time.monotonic() - started
        now = datetime.now(UTC)
        for backlog in backlogs:
            self._sink_names[backlog.sink_id] = backlog.sink
            self.health.setdefault(backlog.sink_id, CommitterHealth()).last_commit_at = now
            metrics.record_commit(backlog.sink, backlog.epochs, appended=False, seconds=seconds)
        log.info(
            "empty checkpointed epochs committed",
            sinks=len(backlogs),
            epochs=sum(backlog.epochs for backlog in backlogs),
            seconds=round(seconds, 4),
        )
        await self._notify_progress()

    async def _drive(self, sink_id: int, event: asyncio.Event) -> None:
        # Context variables are per task: every line this sink's committer logs carries the sink (and not
        # the epoch of the request whose context the task was created from).
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(sink_id=sink_id)
        while True:
            await event.wait()
            event.clear()
            await self._commit_with_retries(sink_id)

    async def _commit_with_retries(self, sink_id: int) -> None:
        health = self.health.setdefault(sink_id, CommitterHealth())

        def record_failure(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            health.retrying = True
            health.attempts = state.attempt_number
            health.last_error = f"{type(error).__name__}: {error}"
            health.last_error_at = datetime.now(UTC)
            metrics.COMMIT_RETRIES.labels(self._sink_names.get(sink_id, f"id {sink_id}")).inc()
            log.warning(
                "commit failed; retrying",
                attempt=state.attempt_number,
                retry_in_seconds=round(state.upcoming_sleep, 2),
                error=health.last_error,
            )

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential_jitter(
                multiplier=self.settings.retry_initial_seconds,
                max=self.settings.retry_max_seconds,
                jitter=self.settings.retry_initial_seconds,
            ),
            before_sleep=record_failure,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._commit_pass(sink_id)
        health.retrying = False
        health.attempts = 0

    async def _commit_pass(self, sink_id: int) -> None:
        async with self._passes, self.database.connection(autocommit=True) as lock_connection:
            # The lock is session-level: it lives with the connection, outside any transaction.
            if not await repository.try_commit_lock(lock_connection, sink_id):
                log.debug("another committer holds the sink", sink_id=sink_id)
                return
            try:
                await failpoints.hit(Failpoint.COMMIT_AFTER_LOCK)
                while await self._commit_next(sink_id):
                    pass
            finally:
                await repository.release_commit_lock(lock_connection, sink_id)

    async def _commit_next(self, sink_id: int) -> bool:
        """Commit the next group of checkpointed epochs; False when there is nothing to commit."""
        await self._respect_commit_interval(sink_id)
        async with self.database.transaction() as session:
            sink = await repository.sink_by_id(session, sink_id)
            if sink is None:
                return False
            pending = await repository.pending_epochs_at_or_below(
                session, sink_id, sink.checkpointed_epoch, limit=self.settings.commit_max_epochs
            )
        if not pending:
            return False
        self._sink_names[sink_id] = sink.name
        structlog.contextvars.bind_contextvars(sink=sink.name)
        log_ = log.bind(table=sink.table_identifier, epochs=[row.epoch for row in pending])
        epochs = [row.epoch for row in pending]
        entries = [entry for row in pending for entry in precommit_metadata.decode(row.metadata_).data_files]
        if not entries:
            # Empty epochs are never appended, so no marker can hold them: mark them without reading the table.
            await self._mark_committed(sink, pending, epochs, None, entries, time.monotonic(), log_)
            return True
        # The cached table (kept current by this process's own commits): the append asserts its branch head,
        # so a stale one fails the commit and the next round walks a freshly loaded table.
        table, from_cache = await asyncio.to_thread(self.tables.cached, sink.table_identifier)
        markers = await asyncio.to_thread(
            self.tables.sink_markers,
            sink.table_identifier,
            sink.name,
            pending[0].epoch,
            generation=sink.generation,
            table=table,
        )
        if markers and markers[-1].epoch >= pending[0].epoch:
            if from_cache:
                # Marking needs the current table, not a remembered one: walk again on a fresh load.
                self.tables.forget(sink.table_identifier)
                return True
            await self._mark_already_in_table(sink, pending, markers)
            log_.info(
                "epochs found already in the table; marked committed",
                epochs=[row.epoch for row in pending if row.epoch <= markers[-1].epoch],
            )
            return True
        await failpoints.hit(Failpoint.COMMIT_BEFORE_APPEND)
        started = time.monotonic()
        commit_id = uuid.uuid4().hex
        try:
            snapshot_id = await asyncio.to_thread(
                self.tables.append,
                sink.table_identifier,
                sink.name,
                epochs[-1],
                commit_id,
                entries,
                generation=sink.generation,
                table=table,
            )
        except CommitFailedException as error:
            if not from_cache:
                raise
            # The remembered table was behind the catalog (append forgot it): walk the current one now.
            log_.debug("cached table was stale; walking the current table", error=str(error))
            return True
        await failpoints.hit(Failpoint.COMMIT_AFTER_APPEND)
        await self._mark_committed(sink, pending, epochs, snapshot_id, entries, started, log_)
        return True

    async def _mark_committed(
        self,
        sink: Sink,
        pending: Sequence[PendingSinkState],
        epochs: list[int],
        snapshot_id: int | None,
        entries: Sequence[object],
        started: float,
        log_: structlog.stdlib.BoundLogger,
    ) -> None:
        sink_id = sink.id
        async with self.database.transaction() as session:
            await repository.mark_committed(session, sink_id, epochs, snapshot_id)
            await repository.prune_committed(session, [sink_id], self.settings.retention_epochs)
        await failpoints.hit(Failpoint.COMMIT_AFTER_MARK)
        self._last_commit[sink_id] = time.monotonic()
        self.health.setdefault(sink_id, CommitterHealth()).last_commit_at = datetime.now(UTC)
        metrics.record_commit(sink.name, len(epochs), appended=bool(entries), seconds=time.monotonic() - started)
        log_.info(
            "epochs committed",
            snapshot_id=snapshot_id,
            files=len(entries),
            records=sum(row.record_count for row in pending),
            seconds=round(time.monotonic() - started, 4),
        )
        await self._notify_progress()

    async def _mark_already_in_table(
        self, sink: Sink, pending: Sequence[PendingSinkState], markers: Sequence[Marker]
    ) -> None:
        """Mark the pending epochs a marker covers, each with the snapshot that added it."""
        by_snapshot: dict[int, list[int]] = {}
        for row in pending:
            covering = next((marker for marker in markers if marker.epoch >= row.epoch), None)
            if covering is None:
                break
            by_snapshot.setdefault(covering.snapshot_id, []).append(row.epoch)
        async with self.database.transaction() as session:
            for snapshot_id, epochs in by_snapshot.items():
                await repository.mark_committed(session, sink.id, epochs, snapshot_id)
        metrics.COMMITTED_EPOCHS.labels(sink.name).inc(sum(len(epochs) for epochs in by_snapshot.values()))
        await self._notify_progress()

    async def _respect_commit_interval(self, sink_id: int) -> None:
        last = self._last_commit.get(sink_id)
        if last is None:
            return
        remaining = self.settings.commit_interval_seconds - (time.monotonic() - last)
        if remaining > 0:
            await asyncio.sleep(remaining)

    async def _clean_forever(self) -> None:
        while True:
            await self._cleaner_event.wait()
            self._cleaner_event.clear()
            try:
                await self.clean_aborted()
            except Exception as error:
                log.warning("cleaning aborted epochs failed; will try again", error=str(error))

    async def clean_aborted(self) -> int:
        """Delete the files of ABORTED epochs that no snapshot references; return the epochs cleaned."""
        async with self.database.transaction() as session:
            rows = await repository.aborted_epochs_to_clean(session, CLEANUP_BATCH)
        for sink, row in rows:
            paths = precommit_metadata.decode(row.metadata_).paths
            stale = await asyncio.to_thread(self.tables.unreferenced, sink.table_identifier, paths)
            deleted = await asyncio.to_thread(self.tables.delete_files, sink.table_identifier, stale)
            await failpoints.hit(Failpoint.CLEANUP_AFTER_DELETE)
            async with self.database.transaction() as session:
                await repository.mark_files_cleaned(session, row.sink_id, row.epoch, row.attempt)
            metrics.CLEANED_FILES.labels(sink.name).inc(deleted)
            if len(stale) < len(paths):
                log.error(
                    "files of an aborted epoch are referenced by the table; they were kept",
                    sink=sink.name,
                    epoch=row.epoch,
                    files=sorted(paths - set(stale)),
                )
            log.info(
                "aborted epoch cleaned",
                sink=sink.name,
                epoch=row.epoch,
                attempt=row.attempt,
                files_deleted=deleted,
                files_kept=len(paths) - len(stale),
            )
        if len(rows) == CLEANUP_BATCH:
            self.wake_cleaner()
        return len(rows)
