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
from datetime import UTC, datetime

import structlog
from sqlalchemy.exc import SQLAlchemyError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import CoordinatorError, SinkSuspended, cause
from coordinator_service.engine.commit_pass import CommitPasses
from coordinator_service.engine.commit_retries import cannot_succeed_by_retrying, retry_cause
from coordinator_service.engine.commit_state import CommitterHealth, Numbering, SinkCommitState
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import commit_lock, commit_record, epoch_reads, epoch_transitions, sink_rows

log = structlog.get_logger(__name__)


class Committer(CommitPasses):
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
        """Wait until the sink's committed epoch reaches `epoch` (here or on another replica) in `numbering`. The log
        is read at first, after each of the sink's passes here, and every POLL_INTERVAL_SECONDS (a commit by another
        process); never for another sink's pass, so that N writers waiting while N sinks commit read N rows, not
        N * N."""
        state = self._sinks[sink_id]
        while True:
            # A pass here that ends while the sink is being read below bumps its count, so it is not missed.
            seen = state.progress
            committed_here = state.committed_here
            if committed_here is not None and committed_here[0] == numbering and committed_here[1] >= epoch:
                return committed_here[1]  # durable: recorded by this process's COMMITTED transaction
            async with self.database.transaction() as session:
                sink = await sink_rows.sink_by_id(session, sink_id)
                assert sink is not None
                committed = sink.committed_epoch
            if committed >= epoch:
                return committed

            def progressed(seen: int = seen) -> bool:
                return state.progress != seen

            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval_seconds), self._progress:
                    await self._progress.wait_for(progressed)

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
        await self._notify_progress(*(backlog.sink_id for backlog in backlogs))

    async def _drive(self, sink_id: int, state: SinkCommitState) -> None:
        # Context variables are per task: every line this sink's committer logs carries the sink (and not
        # the epoch of the request whose context the task was created from).
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(sink_id=sink_id)
        health = state.healthy()
        while True:
            await state.wake.wait()
            state.wake.clear()
            if health.stuck is not None and not await self._resumed_in_log(sink_id, state, health):
                continue  # until an operator resumes the sink
            # Outside the slot: a sink waiting out its interval leaves the slot to the others.
            await self._respect_commit_interval(sink_id, state)
            try:
                if await self._commit_with_retries(sink_id):
                    state.wake.set()  # more to commit: go on after the sinks that wait for a slot
            except SinkSuspended:
                # Not the committer's failure, and no resume here is its way back: the sink waits for a reconcile or
                # a check (in any process) that brings it back, after which the poller wakes it again (it leaves
                # suspended sinks alone).
                log.info("the sink is suspended: its commits wait until it is back in step with its tables")
            except Exception as error:  # only what retrying cannot fix comes out of the retries
                await self._stick(sink_id, health, error)
            finally:
                state.passes_done += 1
                await self._notify_progress(sink_id)

    async def _stick(self, sink_id: int, health: CommitterHealth, error: BaseException) -> None:
        """Stop the sink's commits here until a resume, and record why in the log, where every process and replica
        shows it."""
        health.stuck = f"{type(error).__name__}: {cause(error)}"
        health.retrying = False
        health.last_error, health.last_error_at = health.stuck, datetime.now(UTC)
        metrics.COMMITTER_STUCK_EVENTS.labels(self._sinks[sink_id].label(sink_id)).inc()
        log.error(
            "the sink's commits cannot succeed by retrying; they wait for an operator to fix the cause and "
            "resume the sink (POST /api/v1/sinks/<name>/resume)",
            error=health.stuck,
        )
        try:
            async with self.database.transaction() as session:
                health.stuck_at_resumes = await sink_rows.record_stuck(
                    session, sink_id, health.stuck, health.last_error_at
                )
        except SQLAlchemyError as record_error:
            log.warning(
                "the stuck state is not recorded in the log: only this process shows it, and only a resume it "
                "receives resumes it",
                error=cause(record_error),
            )

    async def _resumed_in_log(self, sink_id: int, state: SinkCommitState, health: CommitterHealth) -> bool:
        """Whether a resume through another process or replica came since the sink stuck here (then it is resumed
        here too)."""
        if health.stuck_at_resumes is None:
            return False
        try:
            async with self.database.transaction() as session:
                resumes = await sink_rows.resumes_of(session, sink_id)
        except SQLAlchemyError as error:
            log.warning("the sink's resumes could not be read; will look again", error=cause(error))
            return False
        if resumes is None or resumes <= health.stuck_at_resumes:
            return False
        log.warning("the sink was resumed (through another process or replica): its commits are retried here")
        self._resume_here(state)
        return True

    async def resume(self, sink_id: int) -> bool:
        """Retry a stuck sink's commits (the cause is gone), in every process and replica: the log counts the resume,
        and a committer stuck on the sink anywhere follows it at its next wake. Whether it was stuck here."""
        async with self.database.transaction() as session:
            await sink_rows.record_resume(session, sink_id)
        state = self._sinks[sink_id]
        was_stuck = state.health is not None and state.health.stuck is not None
        self._resume_here(state)
        self.wake(sink_id)
        return was_stuck

    def _resume_here(self, state: SinkCommitState) -> None:
        if state.health is not None:
            state.health.stuck = None
            state.health.stuck_at_resumes = None
        state.resumed_at = state.passes_done

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

    async def _respect_commit_interval(self, sink_id: int, state: SinkCommitState) -> None:
        """Wait out the rest of the sink's commit interval since its last commit, unless a writer waits for the commit
        (flush). The last commit may be another process's (a supervisor's processes and the replicas share the
        sink): once this process's own commit is an interval old, or it has made none, the log says when the sink
        was last committed."""
        interval = self.settings.commit_interval_seconds
        while interval > 0 and not state.flush.is_set():
            last = state.last_commit
            remaining = 0.0 if last is None else interval - (time.monotonic() - last)
            if remaining <= 0:
                since = await self._seconds_since_last_snapshot(sink_id)
                remaining = 0.0 if since is None else interval - since
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.flush.wait(), remaining)
        state.flush.clear()

    async def _seconds_since_last_snapshot(self, sink_id: int) -> float | None:
        """From the log; None when it cannot say (the pass that follows finds a metastore outage and retries)."""
        try:
            async with self.database.transaction() as session:
                return await epoch_reads.seconds_since_last_snapshot(session, sink_id)
        except (SQLAlchemyError, CoordinatorError, OSError) as error:
            log.debug("the sink's last commit could not be read from the log", error=cause(error))
            return None
