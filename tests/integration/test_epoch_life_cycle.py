"""A state machine of the epoch life cycle against one in-process coordinator and a model of what each table holds.

Hypothesis drives a Spark-like writer (pre-commits of sequential batches with files in one or both of a fan-out
sink's tables, checkpoints, restarts from its checkpoint that run batches again with the same records, sometimes
under the same file names), killed tasks that leave orphans under the names a later attempt writes, a second sink
of two writers whose parts are gathered (one part may wait across any number of steps), operators (forced aborts,
resets followed by a writer on a new checkpoint), time (ORPHAN_GRACE_SECONDS pass: files and deletion marks age)
and the background work (commit passes, one interrupted between two tables, the cleaner, maintenance with the
orphan sweep), in any order (SINK_TEST_LIFE_CYCLE_EXAMPLES sequences of at most SINK_TEST_LIFE_CYCLE_STEPS steps, 8
of 25 in the suite). After every step:

* no table's metadata reaches a file missing from storage (tests/fixtures/reachable_files.py), and no record is in a
  table twice;
* a table holds exactly the records of the epochs the log has COMMITTED (of every numbering), and never one of an
  epoch an operator aborted;
* ALREADY_COMMITTED is an answer only for an epoch whose records are in its tables;
* after a reset, every table holds exactly the epochs up to the one the reset reports, and nothing above;
* after maintenance, no orphan older than the grace that nothing claims or references is left (the sweep deletes).

At the end every checkpointed epoch not aborted by an operator is committed. The background tasks are not
started: each step runs to its end, so a failing sequence shrinks and replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import uuid
from collections import Counter
from collections.abc import Awaitable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pydantic import SecretStr
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service import failpoints
from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.contract.views import PreCommitOutcome, PreCommitResult
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.log import commit_lock
from coordinator_service.log.database import normalize_url
from coordinator_service.log.path_claims import CleanupDelays
from coordinator_service.runtime import Runtime, migrate
from coordinator_service.settings import Settings
from tests.fixtures.coordinator import ORDERS, write_parquet
from tests.fixtures.postgres import new_database, query
from tests.fixtures.reachable_files import missing_reachable_files, reachable_files

SINK = "orders"
OWN, ROUTED = "db.orders", "db.routed"
TABLES = (OWN, ROUTED)
# The multi-writer sink: two writers, each a part of every epoch's records.
PARTS_SINK, PARTS = "parts", "db.parts"
WRITERS = 2
ALL_TABLES = (*TABLES, PARTS)
OPERATOR = Operator("admin", "state-machine")
SINK_ID, PARTS_SINK_ID = 1, 2  # registered in this order in each example's new database
GRACE = 600.0  # ORPHAN_GRACE_SECONDS: nothing ages past it unless a step lets that time pass
# The run's size: a few sequences in the suite, more by the environment (a larger run takes proportionally longer).
EXAMPLES = int(os.environ.get("SINK_TEST_LIFE_CYCLE_EXAMPLES", "8"))
STEPS = int(os.environ.get("SINK_TEST_LIFE_CYCLE_STEPS", "25"))


@dataclass
class Writer:
    """A Spark query: its term, its checkpoint (the last batch Spark committed), the batches it pre-committed."""

    term: int
    checkpoint: int
    numbering: int  # which checkpoint the batches' records come from (a reset starts a new one)
    precommitted: list[int] = field(default_factory=list)


def batch_rows(numbering: int, epoch: int, table: str) -> list[int]:
    """The records batch `epoch` of a numbering routes to a table: the same whenever the batch runs again."""
    first = numbering * 1_000_000 + epoch * 100 + TABLES.index(table) * 10
    return list(range(first, first + 3))


def file_name(numbering: int, epoch: int, table: str) -> str:
    """The deterministic name a task of the batch writes its file under (every attempt, a killed one too)."""
    return f"n{numbering}-e{epoch}-{table}"


def part_rows(epoch: int, writer_id: int) -> list[int]:
    """The records writer `writer_id` of the multi-writer sink writes for batch `epoch`."""
    first = 500_000_000 + epoch * 100 + writer_id * 10
    return list(range(first, first + 3))


@dataclass
class WaitingPart:
    """A part of the multi-writer sink's epoch, stored and waiting for the other writer's (its call still open)."""

    epoch: int
    writer_id: int
    call: asyncio.Task[PreCommitResult]


class EpochLifeCycle(RuleBasedStateMachine):
    def __init__(self, postgres_url: str, root: Path) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.database_url = self.stack.enter_context(new_database(postgres_url))
        self.root = root / uuid.uuid4().hex[:8]
        self.loop = asyncio.new_event_loop()
        self.run(asyncio.to_thread(migrate, normalize_url(self.database_url)))
        self.settings = Settings(
            database_url=SecretStr(self.database_url),
            data_dir=self.root,
            # Given-up files wait for the cleaner until a step lets their delay pass (cleanup_delay_passes).
            cleanup_delay_seconds=3600.0,
            recovery_files_keep_seconds=3600.0,
            # Orphans older than this go at the next sweep (every maintenance step); the time_passes step ages files.
            orphan_grace_seconds=GRACE,
            commit_interval_seconds=0.0,
            compaction_min_files=3,
            snapshot_max_count=4,
            admin_lock_timeout_seconds=5.0,
        )
        self.runtime: Runtime = self.run(Runtime.open(self.settings))
        # Every step runs to its end: no background commit, clean or maintenance interleaves with the next one.
        self.runtime.committer.wake = lambda sink_id, flush=False: None  # type: ignore[method-assign]
        self.operations = Operations(
            self.runtime.database,
            self.runtime.iceberg,
            self.runtime.committer,
            self.runtime.cleaner,
            self.runtime.maintainer,
            self.settings,
        )
        self.catalog: Catalog = load_catalog("default", type="sql", uri=self.database_url, warehouse=self.root.as_uri())
        self.writer = Writer(term=0, checkpoint=-1, numbering=0)
        self.locations: dict[str, str] = {}
        self.numberings = itertools.count(1)
        # The records each epoch's current attempt put in each table, by numbering and epoch.
        self.attempts: dict[tuple[int, int], dict[str, list[int]]] = {}
        self.operator_aborted: set[tuple[int, int]] = set()
        self.epoch_numbering = 0  # the coordinator's: bumped by the first registration after a reset
        self.expected: dict[str, Counter[int]] = {table: Counter() for table in ALL_TABLES}
        self.parts_writer = Writer(term=0, checkpoint=-1, numbering=0)
        self.waiting: WaitingPart | None = None
        # The multi-writer sink's epochs as its writers pre-committed them (every part's records), by epoch.
        self.part_attempts: dict[int, list[int]] = {}
        # Orphans planted (files of killed tasks), for the check that the sweep deletes those it may.
        self.orphans: set[str] = set()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        try:
            self.forget_waiting_part()
            self.run(self.runtime.close())
        finally:
            self.loop.close()
            self.stack.close()

    # ------------------------------------------------------------------------------------------------ the writer

    @initialize()
    def start_writers(self) -> None:
        self.register(-1)
        self.register_parts(-1)

    def register(self, checkpoint: int) -> None:
        coordinator = self.runtime.coordinator
        registration = self.run(
            coordinator.register_writer(SINK, OWN, checkpoint, arrow_schema=ORDERS.serialize().to_pybytes())
        )
        ensured = self.run(
            coordinator.ensure_tables(
                SINK, registration.writer_term, [TableRequest(ROUTED, ORDERS.serialize().to_pybytes())]
            )
        )
        self.locations.update({OWN: registration.table_location, ROUTED: ensured.tables[0].location})
        self.writer = Writer(registration.writer_term, checkpoint, self.writer.numbering)

    @rule(tables=st.sets(st.sampled_from(TABLES)), deterministic=st.booleans())
    def pre_commit(self, tables: set[str], deterministic: bool) -> None:
        """Spark runs the next batch after its checkpoint (or the one after the last it pre-committed)."""
        epoch = max([self.writer.checkpoint, *self.writer.precommitted]) + 1
        numbering = self.writer.numbering
        files = {}
        for table in sorted(tables):
            name = file_name(numbering, epoch, table) if deterministic else ""
            files[write_parquet(self.locations[table], self.rows(numbering, epoch, table), name=name)] = table
        request = PreCommitRequest(
            SINK,
            epoch,
            self.writer.term,
            tuple(files),
            file_tables={path: table for path, table in files.items() if table != OWN},
        )
        try:
            result = self.run(self.runtime.coordinator.pre_commit(request))
        except CoordinatorError:
            return  # fenced, or refused: Spark's batch fails and the writer restarts (another rule)
        if result.outcome == PreCommitOutcome.ALREADY_COMMITTED:
            for table in tables:
                held = Counter(self.table_rows(table))
                assert all(held[row] for row in batch_rows(numbering, epoch, table)), (
                    f"epoch {epoch} answered ALREADY_COMMITTED but its records are not in {table}"
                )
        else:
            self.attempts[(self.epoch_numbering, epoch)] = {t: batch_rows(numbering, epoch, t) for t in tables}
            # An epoch an operator aborted that Spark had not checkpointed runs again after a restart: the re-sent
            # pre-commit is a new attempt, PENDING again, and its records belong in the table once it commits.
            self.operator_aborted.discard((self.epoch_numbering, epoch))
        self.writer.precommitted.append(epoch)

    def rows(self, numbering: int, epoch: int, table: str) -> list[dict[str, Any]]:
        return [{"order_id": row, "customer": table, "amount": 1.0} for row in batch_rows(numbering, epoch, table)]

    @precondition(lambda self: self.writer.precommitted)
    @rule()
    def checkpoint(self) -> None:
        """Spark writes its commit log for the last batch it pre-committed, and the listener reports it."""
        epoch = max(self.writer.precommitted)
        try:
            self.run(self.runtime.coordinator.commit_checkpoint(SINK, epoch, self.writer.term, wait=False))
        except CoordinatorError:
            return
        self.writer.checkpoint = epoch
        self.writer.precommitted = []

    @rule()
    def restart_writer(self) -> None:
        """The driver dies and restarts from its checkpoint: the batches after it run again, same records."""
        try:
            self.register(self.writer.checkpoint)
        except CoordinatorError:
            return  # e.g. a lock held elsewhere: the restart is retried later

    @rule(table=st.sampled_from(TABLES), ahead=st.integers(0, 1), aged=st.booleans())
    def task_killed(self, table: str, ahead: int, aged: bool) -> None:
        """A task of a batch not pre-committed yet was killed after writing its file (the batch's records, under
        the name every attempt of the batch writes); aged: long ago, past the grace."""
        epoch = max([self.writer.checkpoint, *self.writer.precommitted]) + 1 + ahead
        numbering = self.writer.numbering
        orphan = write_parquet(
            self.locations[table], self.rows(numbering, epoch, table), name=file_name(numbering, epoch, table)
        )
        if aged:
            backdate(Path(orphan.removeprefix("file://")), 2 * GRACE)
        self.orphans.add(orphan)

    # ------------------------------------------------------------------------------------- the multi-writer sink

    def register_parts(self, checkpoint: int) -> None:
        self.forget_waiting_part()
        registration = self.run(
            self.runtime.coordinator.register_writer(
                PARTS_SINK, PARTS, checkpoint, writer_count=WRITERS, arrow_schema=ORDERS.serialize().to_pybytes()
            )
        )
        self.locations[PARTS] = registration.table_location
        self.parts_writer = Writer(registration.writer_term, checkpoint, 0)

    def forget_waiting_part(self) -> None:
        """A waiting part's call ends once its writer is fenced (or the runtime closes): its answer is not needed."""
        if self.waiting is not None:
            call, self.waiting = self.waiting.call, None
            if not call.done():
                call.cancel()
            self.run(settled(call))

    def part_request(self, epoch: int, writer_id: int) -> PreCommitRequest:
        rows = [{"order_id": row, "customer": PARTS, "amount": 1.0} for row in part_rows(epoch, writer_id)]
        path = write_parquet(self.locations[PARTS], rows)
        return PreCommitRequest(PARTS_SINK, epoch, self.parts_writer.term, (path,), writer_id=writer_id)

    @precondition(lambda self: self.waiting is None)
    @rule(writer_id=st.integers(0, WRITERS - 1))
    def first_part(self, writer_id: int) -> None:
        """One writer of the multi-writer sink sends its part of the next batch; its call waits for the other's
        (or completes the epoch with a part an earlier call of the other writer left, a call that died)."""
        epoch = max([self.parts_writer.checkpoint, *self.parts_writer.precommitted]) + 1
        request = self.part_request(epoch, writer_id)
        call = self.loop.create_task(self.runtime.coordinator.pre_commit(request))
        if not self.run(self.completed_epoch(request.paths[0], call)):
            self.waiting = WaitingPart(epoch, writer_id, call)
            return
        [answer] = self.run(settled(call))
        self.parts_answered(epoch, [answer])

    async def completed_epoch(self, path: str, call: asyncio.Task[PreCommitResult]) -> bool:
        """Whether the part's call completed its epoch (or was refused: it answers either way) rather than waiting
        for the other writer's part: known once its file is claimed, by the part (no attempt) or by the epoch."""
        claim = "SELECT attempt IS NOT NULL FROM epoch_files WHERE path = %s"
        while not call.done():
            claimed = await asyncio.to_thread(query, self.database_url, claim, path)
            if claimed:
                return bool(claimed[0][0])
            # The part is stored by the call's own task: nothing to await but its row.
            await asyncio.sleep(0.01)
        return True

    @precondition(lambda self: self.waiting is not None)
    @rule()
    def last_part(self) -> None:
        """The other writer's part completes the epoch: both calls answer."""
        assert self.waiting is not None
        epoch, first, call = self.waiting.epoch, self.waiting.writer_id, self.waiting.call
        requests = [self.part_request(epoch, writer_id) for writer_id in range(WRITERS) if writer_id != first]
        answers = self.run(settled(*(self.runtime.coordinator.pre_commit(each) for each in requests)))
        if any(isinstance(answer, BaseException) for answer in answers):
            self.parts_answered(epoch, answers)  # refused: the first part waits on
            return
        self.waiting = None
        answers.extend(self.run(settled(call)))
        self.parts_answered(epoch, answers)

    def parts_answered(self, epoch: int, answers: list[PreCommitResult | BaseException]) -> None:
        """The multi-writer sink's epoch as its writers' calls were answered (a refusal: the writers restart)."""
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, CoordinatorError):
                raise answer
        if any(isinstance(answer, BaseException) for answer in answers):
            return
        rows = [row for writer_id in range(WRITERS) for row in part_rows(epoch, writer_id)]
        if any(answer.outcome == PreCommitOutcome.ALREADY_COMMITTED for answer in answers):  # type: ignore[union-attr]
            held = Counter(self.table_rows(PARTS))
            assert all(held[row] for row in rows), f"{PARTS} epoch {epoch} answered ALREADY_COMMITTED without it"
        else:
            self.part_attempts[epoch] = rows
        self.parts_writer.precommitted.append(epoch)

    @precondition(lambda self: self.parts_writer.precommitted)
    @rule()
    def parts_checkpoint(self) -> None:
        epoch = max(self.parts_writer.precommitted)
        try:
            self.run(self.runtime.coordinator.commit_checkpoint(PARTS_SINK, epoch, self.parts_writer.term, wait=False))
        except CoordinatorError:
            return
        self.parts_writer.checkpoint = epoch
        self.parts_writer.precommitted = []

    @rule()
    def restart_parts_writers(self) -> None:
        """The multi-writer sink's driver restarts from its checkpoint: a waiting part is dropped."""
        try:
            self.register_parts(self.parts_writer.checkpoint)
        except CoordinatorError:
            return

    # ------------------------------------------------------------------------------------------------ operators

    @rule(data=st.data())
    def operator_abort(self, data: st.DataObject) -> None:
        pending = [
            row[0]
            for row in query(
                self.database_url,
                "SELECT epoch FROM pending_sink_state WHERE sink_id = %s AND status = 'PENDING'",
                SINK_ID,
            )
        ]
        if not pending:
            return
        epoch = data.draw(st.sampled_from(sorted(pending)))
        try:
            self.run(self.operations.abort_epoch(SINK, epoch, "state machine", True, OPERATOR))
        except CoordinatorError:
            return
        self.operator_aborted.add((self.epoch_numbering, epoch))

    @rule(new_checkpoint=st.sampled_from([-1, 0, 5]))
    def reset_and_restart(self, new_checkpoint: int) -> None:
        """The Spark checkpoint is lost: an operator resets, and a writer on a new checkpoint starts from the
        reported epoch's offsets (new records)."""
        try:
            outcome = self.run(self.operations.reset_sink(SINK, SINK, "state machine", OPERATOR))
        except CoordinatorError:
            return
        restart = outcome.sink.sink.committed_epoch
        self.check_tables(settled=True)
        for table in TABLES:
            above = [
                rows
                for (numbering, epoch), by_table in self.attempts.items()
                if numbering == self.epoch_numbering and epoch > restart
                for rows in [by_table.get(table, [])]
            ]
            held = Counter(self.table_rows(table))
            assert not any(held[row] for rows in above for row in rows), f"{table} holds an epoch above {restart}"
        self.epoch_numbering += 1
        self.writer.numbering = next(self.numberings)
        self.register(new_checkpoint)

    # ------------------------------------------------------------------------------------------------ background

    @rule(interrupted=st.booleans())
    def commit_pass(self, interrupted: bool) -> None:
        """The committer's passes until nothing checkpointed waits; interrupted: one dies between two tables."""
        if interrupted:
            failpoints.configure(f"{failpoints.Failpoint.COMMIT_BETWEEN_TABLES.value}=error")
        try:
            for sink_id in (SINK_ID, PARTS_SINK_ID):
                # The interrupted pass: what it appended stays, nothing is recorded.
                with contextlib.suppress(failpoints.FailpointError):
                    self.run(self.commit_under_lock(sink_id))
        finally:
            failpoints.configure("")

    async def commit_under_lock(self, sink_id: int) -> None:
        async with commit_lock.try_holding(self.runtime.database, sink_id) as lock:
            assert lock is not None
            await self.runtime.committer.commit_checkpointed(sink_id, lock)

    @rule()
    def clean(self) -> None:
        self.run(self.runtime.cleaner.clean())

    @rule()
    def cleanup_delay_passes(self) -> None:
        """The cleaner's delays are over for every file given up so far."""
        cleaner = self.runtime.cleaner
        waiting = cleaner.delays
        cleaner.delays = cleaner.deleter.delays = CleanupDelays(0.0, 0.0)
        try:
            self.run(cleaner.clean())
        finally:
            cleaner.delays = cleaner.deleter.delays = waiting

    @rule()
    def time_passes(self) -> None:
        """Twice ORPHAN_GRACE_SECONDS pass: every file on storage is that much older, and so is every deletion's
        mark (the cleaner forgets those past the grace)."""
        for location in self.locations.values():
            for path in Path(location.removeprefix("file://")).rglob("*"):
                if path.is_file() and not path.is_symlink():
                    backdate(path, 2 * GRACE)
        query(
            self.database_url,
            "UPDATE epoch_files SET deleting_at = deleting_at - make_interval(secs => %s), "
            "deleted_at = deleted_at - make_interval(secs => %s) WHERE deleting_at IS NOT NULL",
            2 * GRACE,
            2 * GRACE,
        )

    @rule(after_grace=st.booleans())
    def maintain(self, after_grace: bool) -> None:
        """Maintenance of both sinks (expiration, compaction, the orphan sweep), at once or once the grace passed;
        then no orphan the sweep may delete is left."""
        if after_grace:
            self.time_passes()
        for sink_id in (SINK_ID, PARTS_SINK_ID):
            run = self.run(self.runtime.maintainer.run_now(sink_id))
            assert run.outcome == "ok", run.error
        held = {str(path) for (path,) in query(self.database_url, "SELECT path FROM epoch_files")}
        reached = {path for table in ALL_TABLES for path in reachable_files(self.catalog.load_table(table))}
        left = [
            orphan
            for orphan in self.orphans
            if orphan not in held and orphan not in reached and older_than(orphan, GRACE)
        ]
        assert left == [], f"the sweep left orphans older than the grace that nothing claims: {left}"

    # ------------------------------------------------------------------------------------------------ the checks

    def table_rows(self, table: str) -> list[int]:
        loaded = self.catalog.load_table(table)
        return loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()

    @invariant()
    def check_tables(self, settled: bool = False) -> None:
        """Each table holds every COMMITTED epoch's records once, and else only records of PENDING epochs (a pass
        between two tables' appends); `settled`: nothing but the COMMITTED epochs' records in the fan-out sink's."""
        statuses = query(self.database_url, "SELECT sink_id, epoch, status FROM pending_sink_state")
        pending: dict[str, set[int]] = {table: set() for table in ALL_TABLES}
        for sink_id, epoch, status in statuses:
            if sink_id == SINK_ID:
                rows_by_table = self.attempts.get((self.epoch_numbering, int(str(epoch))), {})
            else:
                rows_by_table = {PARTS: self.part_attempts.get(int(str(epoch)), [])}
            for table, rows in rows_by_table.items():
                if status == "COMMITTED":
                    for row in rows:
                        self.expected[table][row] = 1
                elif status == "PENDING" and not (settled and table in TABLES):
                    pending[table].update(rows)
        for table in ALL_TABLES:
            loaded = self.catalog.load_table(table)
            missing = missing_reachable_files(loaded)
            assert missing == [], f"{table}'s metadata reaches files missing from storage: {missing}"
            held = Counter(self.table_rows(table))
            assert max(held.values(), default=1) == 1, f"{table} holds records twice: {held.most_common(3)}"
            assert set(self.expected[table]) <= set(held), f"{table} lacks {set(self.expected[table]) - set(held)}"
            unexpected = set(held) - set(self.expected[table]) - pending[table]
            assert not unexpected, f"{table} holds records of no COMMITTED or PENDING epoch: {sorted(unexpected)}"
            for key in self.operator_aborted:
                assert not any(held[row] for row in self.attempts.get(key, {}).get(table, [])), (
                    f"{table} holds epoch {key} an operator aborted"
                )

    def finish(self) -> None:
        """Everything checkpointed reaches the tables."""
        self.commit_pass(interrupted=False)
        self.check_tables(settled=True)
        for name, checkpointed, committed in query(
            self.database_url, "SELECT name, checkpointed_epoch, committed_epoch FROM sinks"
        ):
            assert committed == checkpointed, f"sink {name}: checkpointed {checkpointed}, committed {committed}"


async def settled(*calls: Awaitable[PreCommitResult]) -> list[PreCommitResult | BaseException]:
    """Every call's answer or exception, once all ended."""
    return await asyncio.gather(*calls, return_exceptions=True)


def backdate(path: Path, seconds: float) -> None:
    """The file's modification time `seconds` earlier (a file written that much sooner)."""
    stat = path.stat()
    os.utime(path, (stat.st_atime - seconds, stat.st_mtime - seconds))


def older_than(uri: str, seconds: float) -> bool:
    path = Path(uri.removeprefix("file://"))
    return path.exists() and path.stat().st_mtime < time.time() - seconds


@pytest.mark.timeout(300 + EXAMPLES * STEPS)
def test_the_epoch_life_cycle(postgres_url: str, tmp_path: Path) -> None:
    class Machine(EpochLifeCycle):
        def __init__(self) -> None:
            super().__init__(postgres_url, tmp_path)

        def teardown(self) -> None:
            try:
                self.finish()
            finally:
                super().teardown()

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
