"""The checkpoint reporter (spark_writer.sink.checkpoint_reporter) with stand-ins for Spark's commit log and the
coordinator's client: it reports a batch the sink wrote once Spark's commit log holds it, never before, without any
other wake-up, and keeps retrying a report that failed for a transient reason while nothing else happens."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator_service.contract.client import CoordinatorRpcError
from spark_writer.sink import checkpoint_reporter
from spark_writer.sink.checkpoint import NO_BATCH
from spark_writer.sink.checkpoint_reporter import CheckpointReporter

WAIT_SECONDS = 10.0


class CommitLog:
    """Spark's commits/: the batches it holds."""

    def __init__(self, committed: int = NO_BATCH) -> None:
        self.committed = committed
        self.looks = 0
        self.looked = threading.Condition()

    def is_committed(self, batch_id: int) -> bool:
        with self.looked:
            self.looks += 1
            self.looked.notify_all()
        return batch_id <= self.committed

    def last_committed_batch(self) -> int:
        return self.committed


class Client:
    """The coordinator: records each CommitCheckpoint, and whether Spark's commit log held the epoch then."""

    timeout_seconds = 1.0

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self.reports: list[int] = []
        self.early: list[int] = []  # epochs reported before Spark's commit log held them
        self.failing = 0  # the next calls that fail as if the coordinator were away
        self.changed = log.looked  # one condition for both: a test can await the reporter's next step, whichever

    def commit_checkpoint(self, sink: str, epoch: int, writer_term: int, *, wait: bool) -> Any:
        with self.changed:
            if epoch > self.log.committed:
                self.early.append(epoch)
            if self.failing:
                self.failing -= 1
                self.changed.notify_all()
                raise CoordinatorRpcError(grpc.StatusCode.UNAVAILABLE, "coordinator away")
            self.reports.append(epoch)
            self.changed.notify_all()

            class Answer:
                committed_epoch = NO_BATCH

            return Answer()

    def wait_for_report(self, epoch: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: epoch in self.reports, WAIT_SECONDS)


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short waits between looks and retries: the behaviour, not Spark's timing, is under test."""
    monkeypatch.setattr(checkpoint_reporter, "COMMIT_LOOK_INITIAL_SECONDS", 0.001)
    monkeypatch.setattr(checkpoint_reporter, "COMMIT_LOOK_MAX_SECONDS", 0.01)
    monkeypatch.setattr(checkpoint_reporter, "REPORT_RETRY_INITIAL_SECONDS", 0.001)
    monkeypatch.setattr(checkpoint_reporter, "REPORT_RETRY_MAX_SECONDS", 0.01)


@pytest.fixture
def log() -> CommitLog:
    return CommitLog()


@pytest.fixture
def client(log: CommitLog) -> Client:
    return Client(log)


@pytest.fixture
def reporter(client: Client, log: CommitLog) -> Iterator[CheckpointReporter]:
    reporter = CheckpointReporter(cast(Any, client), "orders", 1, cast(Any, log), NO_BATCH)
    yield reporter
    reporter.close()


def test_a_written_batch_is_reported_once_spark_commits_it_with_no_other_wake_up(
    reporter: CheckpointReporter, client: Client, log: CommitLog
) -> None:
    reporter.written(0)
    with log.looked:  # the reporter looks again on its own, and finds no commit yet
        assert log.looked.wait_for(lambda: log.looks >= 3, WAIT_SECONDS)
    assert client.reports == []
    log.committed = 0  # Spark writes commits/0
    assert client.wait_for_report(0)
    assert client.early == []


def test_a_report_that_failed_is_sent_again_while_nothing_else_happens(
    reporter: CheckpointReporter, client: Client, log: CommitLog
) -> None:
    client.failing = 3
    log.committed = 4
    reporter.written(4)
    assert client.wait_for_report(4)
    assert client.failing == 0 and client.early == []


def test_a_batch_reported_by_the_next_batch_is_not_reported_again(
    reporter: CheckpointReporter, client: Client, log: CommitLog
) -> None:
    log.committed = 2
    reporter.report(2)  # the next batch's start reports it
    reporter.written(2)
    reporter.written(3)  # not committed: the reporter keeps looking for commits/3 only
    log.committed = 3
    assert client.wait_for_report(3)
    assert client.reports == [2, 3]


def test_is_checkpointed_asks_the_commit_log_for_the_batch_itself(reporter: CheckpointReporter, log: CommitLog) -> None:
    log.committed = 5
    assert reporter.is_checkpointed(NO_BATCH) and reporter.is_checkpointed(5)
    assert not reporter.is_checkpointed(6)


class Reporting(RuleBasedStateMachine):
    """Batches written by the sink, committed by Spark in order, reports failing: no report before its commit, and
    the highest committed batch written is reported in the end."""

    def __init__(self) -> None:
        super().__init__()
        self.log = CommitLog()
        self.client = Client(self.log)
        self.reporter = CheckpointReporter(cast(Any, self.client), "orders", 1, cast(Any, self.log), NO_BATCH)
        self.written = NO_BATCH

    @precondition(lambda self: self.log.committed == self.written)
    @rule()
    def sink_writes_the_next_batch(self) -> None:
        """Spark runs batch N+1 only once commits/N exists; its start reports N, as the sink's function does (a
        report that fails fails the batch)."""
        try:
            self.reporter.report(self.written)
        except CoordinatorRpcError:
            return
        self.written += 1
        with self.client.changed:
            steps = self.steps()
            self.reporter.written(self.written)
            # The reporter's next step (a look at the commit log, or a report) before Spark may commit the batch.
            assert self.client.changed.wait_for(lambda: self.steps() > steps, WAIT_SECONDS)

    def steps(self) -> int:
        return self.log.looks + len(self.client.reports) + len(self.client.early)

    @precondition(lambda self: self.log.committed < self.written)
    @rule()
    def spark_commits_the_written_batch(self) -> None:
        with self.client.changed:
            self.log.committed = self.written

    @rule(calls=st.integers(1, 3))
    def coordinator_away(self, calls: int) -> None:
        with self.client.changed:
            self.client.failing = calls

    @invariant()
    def nothing_reported_before_spark_committed_it(self) -> None:
        assert self.client.early == []

    def teardown(self) -> None:
        try:
            with self.client.changed:
                self.log.committed = self.written
            if self.written > NO_BATCH:
                assert self.client.wait_for_report(self.written), f"batch {self.written} was never reported"
            assert self.client.early == []
        finally:
            self.reporter.close()


@pytest.mark.usefixtures("quick_looks")
def test_reports_follow_spark_commits_whatever_the_order_of_events() -> None:
    run = Reporting.TestCase
    run.settings = settings(max_examples=30, stateful_step_count=12, deadline=None)
    run().runTest()
