"""Table maintenance run by the coordinator, in step with the sink's commits.

A sink's tables (its own and, with fan-out, the others it writes) are
maintained every MAINTENANCE_INTERVAL_SECONDS, at once when a commit takes one
a tenth past its snapshot bound, MAINTENANCE_RATE_LIMIT_SECONDS after the
sink's last run started when a commit leaves small files or position delete
files a compaction would rewrite, and when an operator asks; one
after the other, under the sink's commit lock, so never while the sink's own
append runs; against any other writer of the table the commits are optimistic (a conflict fails the run, and
the next run plans again on a fresh load). A run takes the registered steps
(coordinator_service.engine.maintenance_steps, one module each) on each table:

1. expires the snapshots older than SNAPSHOT_MAX_AGE_SECONDS or beyond the
   newest SNAPSHOT_MAX_COUNT, except branch and tag heads and every snapshot
   whose marker the recovery walk may still need (a sink's marker above the
   newest epoch of that sink the log records the table holds), then deletes
   the files only the expired snapshots referenced;
2. compacts the small files of each partition (smaller than 3/4 of
   COMPACTION_TARGET_FILE_BYTES, at least COMPACTION_MIN_FILES of them), and
   every file that the position delete files of a partition delete rows of,
   once it has COMPACTION_DELETE_FILES_MIN of them or
   COMPACTION_DELETED_ROWS_RATIO of its rows deleted (at most
   COMPACTION_MAX_BYTES_PER_RUN in all), their position deletes applied, into
   a `replace` snapshot with the same rows that drops the delete files no live
   data file is left to refer to; a file that a non-COMMITTED epoch holds is
   never compacted, nor a partition with equality delete files;
3. every ORPHAN_SWEEP_INTERVAL_SECONDS, deletes the files under the table's
   data and metadata directories that no snapshot references and no log row
   holds, once they are older than ORPHAN_GRACE_SECONDS (at most
   ORPHAN_MAX_FILES_PER_RUN of them).

Manifests are merged by the commits themselves (the committer sets the table
properties of manifest merging; see TableFormat.append). Every step that
deletes files verifies the commit lock right before it (coordinator_service.
commit_lock). A run is recorded in maintenance_runs, counted in metrics, and
its failure never stops the sink's commits; a table that fails does not keep
the run from the sink's other tables (the run is recorded failed, naming it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import math
import random
import time
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import ValidationError

from coordinator_service import metrics
from coordinator_service.contract.errors import CommitLockLost, NotFound, cause
from coordinator_service.engine.committer import Committer
from coordinator_service.engine.file_deletion import FileDeleter
from coordinator_service.engine.maintenance_steps import STEPS
from coordinator_service.engine.maintenance_steps.compaction import compaction_plan
from coordinator_service.engine.maintenance_steps.step import RunOccasion, StepContext
from coordinator_service.log import commit_lock, maintenance_log, sink_rows, sink_tables
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import MaintenanceOutcome, MaintenanceRun, MaintenanceTrigger, Sink
from coordinator_service.settings import Settings
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)

# Runs kept in maintenance_runs per sink.
RUNS_KEPT = 100


def policy_of(settings: Settings, sink: Sink) -> MaintenancePolicy:
    return settings.with_overrides(sink.maintenance_overrides)


class Maintainer:
    """Runs every sink's table maintenance when it is due (the scheduled runs MAINTENANCE_CONCURRENCY at a time in
    this process; an operator's run at once, the sink's commit lock keeping it apart from anything else on the
    sink)."""

    def __init__(
        self,
        database: Database,
        iceberg: TableFormat,
        committer: Committer,
        deleter: FileDeleter,
        settings: Settings,
    ) -> None:
        self.database = database
        self.iceberg = iceberg
        self.committer = committer
        self.deleter = deleter
        self.settings = settings
        self._task: asyncio.Task[None] | None = None
        # Sinks whose commits took a table past a threshold, each maintained at its time (the loop's: at once, or
        # MAINTENANCE_RATE_LIMIT_SECONDS after its last run started), whatever the clock; and a heap of (time, sink)
        # in which an entry no longer in _wanted, as it is, is left over (its sink's run started meanwhile).
        self._wanted: dict[int, float] = {}
        self._start_at: list[tuple[float, int]] = []
        # Each sink's earliest start (the loop's time) for a run a commit asks for, and the sinks wanted again while
        # their run is under way (asked for when it ends).
        self._not_before: dict[int, float] = {}
        self._after_run: set[int] = set()
        self._wake = asyncio.Event()
        self._next_wake = math.inf
        # Each sink's run started by the schedule, running or waiting for a slot (at most one per sink).
        self._runs: dict[int, asyncio.Task[None]] = {}
        # Each table's check, after a commit, of whether a compaction would merge files of it (sink id, table); and
        # the tables committed again while theirs ran (checked again when it ends).
        self._compaction_checks: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._check_again: set[tuple[int, str]] = set()
        committer.after_append = self.appended

    def start(self) -> None:
        self._task = asyncio.create_task(self._schedule_forever(), name="table-maintenance")

    def want(self, sink_id: int, at: float | None = None, *, rate_limit: float = 0.0) -> None:
        """A commit took one of the sink's tables past a threshold: its run at once (or at `at`, the loop's time),
        whatever the clock; with a `rate_limit` (seconds), not before that long after the sink's last run started,
        and, when this process has started none within it, at a random moment within it: sinks started together
        (a deployment, a restart) then spread their runs over the limit instead of running them all at once, each
        limit. A sink wanted sooner already keeps its time: the run to come starts after this commit too."""
        if sink_id in self._after_run:
            return
        now = asyncio.get_running_loop().time()
        start_at = now if at is None else max(now, at)
        if rate_limit > 0:
            not_before = self._not_before.get(sink_id)
            start_at = max(start_at, now + random.uniform(0, rate_limit) if not_before is None else not_before)
        if self._wanted.get(sink_id, math.inf) <= start_at:
            return
        self._wanted[sink_id] = start_at
        heapq.heappush(self._start_at, (start_at, sink_id))
        if start_at < self._next_wake:
            self._wake.set()

    def appended(self, sink: Sink, table_name: str) -> None:
        """A commit appended files to one of the sink's tables, and is recorded (the committer calls it). The sink's run
        is wanted at once when the commit took the table a tenth past its snapshot bound (SNAPSHOT_MAX_COUNT, or the
        table's own min-snapshots-to-keep), and MAINTENANCE_RATE_LIMIT_SECONDS after its last run started when a
        compaction would now rewrite files of it (COMPACTION_MIN_FILES small files of a partition, or
        COMPACTION_DELETE_FILES_MIN position delete files, or COMPACTION_DELETED_ROWS_RATIO of its rows deleted,
        counted as the run counts them; checked off the commit path, reading only the manifests the process has not
        read yet, and not while a run is wanted already). So every bound of the policy holds whatever the commit rate,
        not only on the maintenance clock: the snapshots' within a tenth, the files' within the commits of one rate
        limit (and of a tenth of the snapshot bound, whose runs compact too)."""
        try:
            policy = policy_of(self.settings, sink)
        except ValidationError:
            return  # stored out of range behind the API's back: _due says so, the commit goes on
        if not policy.maintenance_enabled:
            return
        table = self.iceberg.last_known(table_name)
        if table is not None:
            bound = tm.retention_of(table, int(policy.snapshot_max_age_seconds * 1000), policy.snapshot_max_count)
            if self.iceberg.snapshot_count(table) > bound.max_count + max(1, bound.max_count // 10):
                self.want(sink.id)
                return
        if sink.id in self._wanted or sink.id in self._after_run:
            return  # a run to come, which starts after this commit, counts the table's files as they then are
        key = (sink.id, table_name)
        if key in self._compaction_checks:
            self._check_again.add(key)  # the check under way may have read the table before this commit
            return
        check = asyncio.create_task(self._check_compaction(key, policy), name=f"compaction-check-{sink.id}")
        self._compaction_checks[key] = check

    async def _check_compaction(self, key: tuple[int, str], policy: MaintenancePolicy) -> None:
        sink_id, table_name = key
        try:
            while True:
                self._check_again.discard(key)
                try:
                    table = self.iceberg.last_known(table_name)
                    if table is None:
                        table = await in_catalog(self.iceberg.load, table_name)
                    _, plan = await compaction_plan(self.database, table, policy)
                except Exception as error:
                    log.warning(
                        "could not check whether a table needs compacting; its run comes on the clock",
                        sink_id=sink_id,
                        table=table_name,
                        error=cause(error),
                    )
                else:
                    if plan:
                        self.want(sink_id, rate_limit=policy.maintenance_rate_limit_seconds)
                if key not in self._check_again:
                    return
        finally:
            del self._compaction_checks[key]

    async def stop(self) -> None:
        tasks = [
            task for task in (self._task, *self._runs.values(), *self._compaction_checks.values()) if task is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _schedule_forever(self) -> None:
        """Look for due sinks every POLL_INTERVAL_SECONDS, start the runs commits want when their time comes, and
        start each run unless its sink has one started or waiting already. The look reads every sink, so it comes on
        the clock alone: a commit's want (one per busy sink and commit interval) starts its run without one, and the
        schedule's work per second grows with the sinks, not with their square. The runs share
        MAINTENANCE_CONCURRENCY slots; the schedule never waits for them, so a slow or hung run holds back its own
        sink alone, and the gauge of how far maintenance is behind keeps being computed."""
        slots = asyncio.Semaphore(self.settings.maintenance_concurrency)
        loop = asyncio.get_running_loop()
        next_look = loop.time()
        while True:
            self._wake.clear()
            due: list[int] = []
            now = loop.time()
            if now >= next_look:
                next_look = now + self.settings.poll_interval_seconds
                self._not_before = {sink: at for sink, at in self._not_before.items() if at > now}
                try:
                    due = await self._due()
                except Exception as error:
                    log.warning("table maintenance could not look for due sinks; will try again", error=cause(error))
            wanted = set()
            while self._start_at and self._start_at[0][0] <= loop.time():
                start_at, sink_id = heapq.heappop(self._start_at)
                if self._wanted.get(sink_id) == start_at:
                    del self._wanted[sink_id]
                    wanted.add(sink_id)
            runs = [(sink_id, MaintenanceTrigger.THRESHOLD) for sink_id in sorted(wanted)]
            runs += [(sink_id, MaintenanceTrigger.SCHEDULE) for sink_id in due if sink_id not in wanted]
            for sink_id, trigger in runs:
                if sink_id in self._runs:
                    if trigger == MaintenanceTrigger.THRESHOLD:
                        self._after_run.add(sink_id)  # the run under way may have begun before the commit
                    continue
                self._wanted.pop(sink_id, None)  # a run starting now counts every commit before it
                run = asyncio.create_task(self._run_when_free(sink_id, trigger, slots), name=f"maintenance-{sink_id}")
                self._runs[sink_id] = run
                run.add_done_callback(functools.partial(self._ran, sink_id))
            self._next_wake = min(next_look, self._start_at[0][0] if self._start_at else math.inf)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, self._next_wake - loop.time()))

    def _ran(self, sink_id: int, run: asyncio.Task[None]) -> None:
        if self._runs.get(sink_id) is run:
            del self._runs[sink_id]
        if sink_id in self._after_run:
            self._after_run.discard(sink_id)
            self.want(sink_id)

    async def _run_when_free(self, sink_id: int, trigger: MaintenanceTrigger, slots: asyncio.Semaphore) -> None:
        """The sink's run once a slot is free, if its commit lock is free; one sink's failure (its table, its stored
        overrides, anything) never keeps the others from theirs."""
        async with slots:
            try:
                async with commit_lock.try_holding(self.database, sink_id) as lock:
                    if lock is not None:
                        await self._run(sink_id, trigger, lock)
                    elif trigger == MaintenanceTrigger.THRESHOLD:
                        # Its committer is at work: the next round.
                        self.want(sink_id, asyncio.get_running_loop().time() + self.settings.poll_interval_seconds)
            except Exception as error:
                log.warning("table maintenance of a sink failed; will try again", sink_id=sink_id, error=cause(error))

    async def _due(self) -> list[int]:
        """The sinks whose scheduled run is due; how far behind the most overdue one is goes to a gauge (a process
        whose MAINTENANCE_CONCURRENCY cannot keep up with its sinks falls behind: a metric and an alert say so)."""
        now = datetime.now(UTC)
        behind = 0.0
        async with self.database.transaction() as session:
            candidates = await maintenance_log.maintenance_candidates(session)
        due = []
        for sink, last_run, _ in candidates:
            try:
                policy = policy_of(self.settings, sink)
            except ValidationError as error:
                # Stored behind the API's back (an older release, a hand edit): this sink waits for an operator.
                log.error(
                    "a sink's maintenance overrides are out of range; its maintenance waits until an operator sets "
                    "them again (PUT /api/v1/sinks/<name>/maintenance)",
                    sink=sink.name,
                    error=cause(error),
                )
                continue
            interval = timedelta(seconds=policy.maintenance_interval_seconds)
            # A new sink's first run comes one interval after its creation.
            if policy.maintenance_enabled and now - (last_run or sink.created_at) >= interval:
                due.append(sink.id)
                behind = max(behind, (now - (last_run or sink.created_at) - interval).total_seconds())
        metrics.MAINTENANCE_BEHIND_SECONDS.set(behind)
        metrics.MAINTENANCE_DUE_SINKS.set(len(due))
        return due

    async def run_now(self, sink_id: int) -> MaintenanceRun:
        """An operator's run: every step, the orphan sweep included, waiting for the commit lock (Unavailable
        after ADMIN_LOCK_TIMEOUT_SECONDS, nothing done)."""
        async with commit_lock.holding(
            self.database, sink_id, self.settings.admin_lock_timeout_seconds, "maintenance"
        ) as lock:
            return await self._run(sink_id, MaintenanceTrigger.OPERATOR, lock)

    async def _run(self, sink_id: int, trigger: MaintenanceTrigger, lock: CommitLock) -> MaintenanceRun:
        async with self.database.transaction() as session:
            sink = await sink_rows.sink_by_id(session, sink_id)
            if sink is None:
                raise NotFound(f"sink id {sink_id} no longer exists")
            last_sweep = await maintenance_log.last_sweep_at(session, sink_id)
            run = await maintenance_log.start_maintenance_run(session, sink_id, trigger)
            tables = [table.identifier for table in await sink_tables.tables_of_sink(session, sink_id)]
        policy = policy_of(self.settings, sink)
        started = time.monotonic()
        self._not_before[sink_id] = asyncio.get_running_loop().time() + policy.maintenance_rate_limit_seconds
        log_ = log.bind(sink=sink.name, trigger=trigger)
        occasion = RunOccasion(trigger, last_sweep)
        steps = [step for step in STEPS if step.wanted(policy, occasion)]
        context = StepContext(self.database, self.iceberg, self.deleter, self.settings)
        errors: list[str] = []
        try:
            for table in tables:
                try:
                    for step in steps:
                        await step.run(context, sink, table, policy, lock, run)
                except Exception as error:
                    errors.append(f"table {table}: {type(error).__name__}: {cause(error)}")
                    log_.warning("table maintenance failed; the next run plans again", table=table, error=errors[-1])
                    if isinstance(error, CommitLockLost):
                        break  # nothing more without the lock
            run.outcome = MaintenanceOutcome.FAILED if errors else MaintenanceOutcome.OK
            run.error = "; ".join(errors) or None
        finally:
            async with self.database.transaction() as session:
                await maintenance_log.finish_maintenance_run(session, run, RUNS_KEPT)
            metrics.record_maintenance(sink.name, run, time.monotonic() - started)
            self.committer.wake(sink_id)  # commits waited for the lock meanwhile
        if run.outcome == MaintenanceOutcome.OK:
            log_.info(
                "table maintained",
                steps=[step.name for step in steps],
                **{counter: getattr(run, counter) for step in STEPS for counter in step.counters},
                swept=run.swept,
                seconds=round(time.monotonic() - started, 3),
            )
        return run
