"""A state machine of the epoch life cycle against one in-process coordinator and a model of what each table holds.

Hypothesis drives a Spark-like writer (pre-commits of sequential batches with files in one or both of a fan-out
sink's tables, checkpoints, restarts from its checkpoint that run batches again with the same records, sometimes
under the same file names), operators (forced aborts, resets followed by a writer on a new checkpoint) and the
background work (commit passes, one interrupted between two tables, the cleaner, maintenance with the sweep), in any
order (SINK_TEST_LIFE_CYCLE_EXAMPLES sequences, 8 in the suite). After every step:

* no table references a file missing from storage, and no record is in a table twice;
* a table holds exactly the records of the epochs the log has COMMITTED (of every numbering), and never one of an
  epoch an operator aborted;
* ALREADY_COMMITTED is an answer only for an epoch whose records are in its tables;
* after a reset, every table holds exactly the epochs up to the one the reset reports, and nothing above.

At the end every checkpointed epoch not aborted by an operator is committed. The background tasks are not
started: each step runs to its end, so a failing sequence shrinks and replays.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections import Counter
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
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.engine.operations import Operations, Operator
from coordinator_service.engine.protocol import PreCommitRequest, TableRequest
from coordinator_service.log import commit_lock
from coordinator_service.log.database import normalize_url
from coordinator_service.log.path_claims import CleanupDelays
from coordinator_service.runtime import Runtime, migrate
from coordinator_service.settings import Settings
from tests.fixtures.coordinator import ORDERS, table_files, write_parquet
from tests.fixtures.postgres import new_database, query

pytestmark = pytest.mark.every_postgres

SINK = "orders"
OWN, ROUTED = "db.orders", "db.routed"
TABLES = (OWN, ROUTED)
OPERATOR = Operator("admin", "state-machine")
SINK_ID = 1  # the only sink of each example's new database


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
            orphan_grace_seconds=3600.0,
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
        self.expected: dict[str, Counter[int]] = {table: Counter() for table in TABLES}

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        try:
            self.run(self.runtime.close())
        finally:
            self.loop.close()
            self.stack.close()

    # ------------------------------------------------------------------------------------------------ the writer

    @initialize()
    def start_writer(self) -> None:
        self.register(-1)

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
        self.locations = {OWN: registration.table_location, ROUTED: ensured.tables[0].location}
        self.writer = Writer(registration.writer_term, checkpoint, self.writer.numbering)

    @rule(tables=st.sets(st.sampled_from(TABLES)), deterministic=st.booleans())
    def pre_commit(self, tables: set[str], deterministic: bool) -> None:
        """Spark runs the next batch after its checkpoint (or the one after the last it pre-committed)."""
        epoch = max([self.writer.checkpoint, *self.writer.precommitted]) + 1
        numbering = self.writer.numbering
        files = {}
        for table in sorted(tables):
            name = f"n{numbering}-e{epoch}-{table}" if deterministic else ""
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

    # ------------------------------------------------------------------------------------------------ operators

    @rule(data=st.data())
    def operator_abort(self, data: st.DataObject) -> None:
        pending = [
            row[0] for row in query(self.database_url, "SELECT epoch FROM pending_sink_state WHERE status = 'PENDING'")
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
            self.run(self.commit_under_lock())
        except failpoints.FailpointError:
            pass  # the interrupted pass: what it appended stays, nothing is recorded
        finally:
            failpoints.configure("")

    async def commit_under_lock(self) -> None:
        async with commit_lock.try_holding(self.runtime.database, SINK_ID) as lock:
            assert lock is not None
            await self.runtime.committer.commit_checkpointed(SINK_ID, lock)

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
    def maintain(self) -> None:
        run = self.run(self.runtime.maintainer.run_now(SINK_ID))
        assert run.outcome == "ok", run.error

    # ------------------------------------------------------------------------------------------------ the checks

    def table_rows(self, table: str) -> list[int]:
        loaded = self.catalog.load_table(table)
        return loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()

    @invariant()
    def check_tables(self, settled: bool = False) -> None:
        """Each table holds every COMMITTED epoch's records once, and else only records of PENDING epochs (a pass
        between two tables' appends); `settled`: nothing but the COMMITTED epochs' records."""
        statuses = query(self.database_url, "SELECT epoch, status FROM pending_sink_state")
        pending: dict[str, set[int]] = {table: set() for table in TABLES}
        for epoch, status in statuses:
            rows_by_table = self.attempts.get((self.epoch_numbering, int(str(epoch))), {})
            for table, rows in rows_by_table.items():
                if status == "COMMITTED":
                    for row in rows:
                        self.expected[table][row] = 1
                elif status == "PENDING" and not settled:
                    pending[table].update(rows)
        for table in TABLES:
            loaded = self.catalog.load_table(table)
            missing = [path for path in table_files(loaded) if not Path(path.removeprefix("file://")).exists()]
            assert missing == [], f"{table} references missing files {missing}"
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
        [(checkpointed, committed)] = query(self.database_url, "SELECT checkpointed_epoch, committed_epoch FROM sinks")
        assert committed == checkpointed


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
            max_examples=int(os.environ.get("SINK_TEST_LIFE_CYCLE_EXAMPLES", "8")),
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
