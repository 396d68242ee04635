"""Invariants 1 to 5 of the design, each proven through kill -9 of a real coordinator process.

Failpoints (SINK_COORDINATOR_FAILPOINTS) kill the process with SIGKILL at an
exact step of the commit path; a restarted process must finish the work with
every epoch's rows in the table exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import psycopg
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.log.commit_lock import COMMIT_LOCK_CLASS
from coordinator_service.log.database import libpq_url
from tests.fixtures.coordinator import (
    ORDERS,
    CoordinatorProcess,
    failpoints_env,
    orders,
    table_files,
    table_order_ids,
    write_parquet,
)
from tests.fixtures.postgres import query

SCHEMA = ORDERS.serialize().to_pybytes()
SINK = "orders-sink"
TABLE = "shop.orders"

Factory = Callable[..., CoordinatorProcess]


def epoch_rows(epoch: int) -> list[dict[str, object]]:
    return orders(epoch * 100, 100)


def statuses(database_url: str) -> dict[int, str]:
    return {
        int(str(epoch)): str(status)
        for epoch, status in query(database_url, "SELECT epoch, status FROM pending_sink_state ORDER BY epoch")
    }


def sink_snapshots(catalog: Catalog, sink: str = SINK) -> list[int]:
    table = catalog.load_table(TABLE)
    return [
        int(properties[MARKER_EPOCH])
        for snapshot in table.snapshots()
        if (properties := snapshot_properties(snapshot)).get(MARKER_SINK) == sink
    ]


def expect_killed(process: CoordinatorProcess, call: Callable[[], object]) -> None:
    """The call dies with the process (UNAVAILABLE), and the process is gone by SIGKILL."""
    with pytest.raises(CoordinatorRpcError) as raised:
        call()
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    assert process.wait_killed() == -9


def test_acknowledged_precommit_survives_kill(coordinator_factory: Factory, database_url: str) -> None:
    """Invariant 1: an acked PreCommit is durable, whatever happens right after the ack."""
    first = coordinator_factory()
    with first.client() as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        path = write_parquet(writer.table_location, epoch_rows(0))
        assert client.pre_commit(SINK, 0, writer.writer_term, [path]).outcome is PreCommitOutcome.PERSISTED
    first.kill()
    second = coordinator_factory()
    with second.client() as client:
        state = client.sink_state(SINK)
    assert [(e.epoch, e.status, e.record_count) for e in state.epochs] == [(0, "PENDING", 100)]


def test_kill_between_persist_and_ack(coordinator_factory: Factory, database_url: str, catalog: Catalog) -> None:
    """Killed after the row is committed but before the answer: the writer's retry is the same epoch, once."""
    first = coordinator_factory(**failpoints_env("precommit.after_persist=kill"))
    # Armed failpoints are announced at start: a process that will kill itself on purpose says so.
    first.wait_for_log("failpoints armed", level="warning", failpoints={"precommit.after_persist": "kill@1"})
    with first.client(retry_seconds=0) as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        path = write_parquet(writer.table_location, epoch_rows(0))
        expect_killed(first, lambda: client.pre_commit(SINK, 0, writer.writer_term, [path]))
    assert statuses(database_url) == {0: "PENDING"}, "the row was not durable before the ack"
    second = coordinator_factory()
    with second.client() as client:
        again = client.pre_commit(SINK, 0, writer.writer_term, [path])
        assert again.outcome is PreCommitOutcome.PERSISTED and again.attempt == 1
        assert client.commit_checkpoint(SINK, 0, writer.writer_term, wait=True).committed_epoch == 0
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(100))
    assert statuses(database_url) == {0: "COMMITTED"}


def test_kill_between_checkpoint_record_and_append(
    coordinator_factory: Factory, database_url: str, catalog: Catalog
) -> None:
    """Invariant 3 and recovery: the recorded checkpoint alone makes a restarted coordinator commit."""
    first = coordinator_factory(**failpoints_env("checkpoint.after_record=kill"))
    with first.client(retry_seconds=0) as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        for epoch in range(3):
            path = write_parquet(writer.table_location, epoch_rows(epoch))
            client.pre_commit(SINK, epoch, writer.writer_term, [path])
        expect_killed(first, lambda: client.commit_checkpoint(SINK, 1, writer.writer_term))
    assert catalog.load_table(TABLE).current_snapshot() is None, "committed to Iceberg before the checkpoint"
    second = coordinator_factory()
    # No writer call: the restarted coordinator resumes what the log holds.
    second.wait_for_log("epochs committed", sink=SINK, epochs=[0, 1])
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(200))
    assert statuses(database_url) == {0: "COMMITTED", 1: "COMMITTED", 2: "PENDING"}


def test_kill_between_append_and_committed_update(
    coordinator_factory: Factory, database_url: str, catalog: Catalog
) -> None:
    """Invariant 2: the snapshot marker stops a restarted coordinator from appending the epoch again."""
    first = coordinator_factory(**failpoints_env("commit.after_append=kill"))
    with first.client(retry_seconds=0) as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        path = write_parquet(writer.table_location, epoch_rows(0))
        client.pre_commit(SINK, 0, writer.writer_term, [path])
        expect_killed(first, lambda: client.commit_checkpoint(SINK, 0, writer.writer_term, wait=True))
    assert statuses(database_url) == {0: "PENDING"}
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(100)), "the append did not land"
    second = coordinator_factory()
    second.wait_for_log("epochs found already in the table; marked committed", sink=SINK, epochs=[0])
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(100))
    assert sink_snapshots(catalog) == [0]
    assert statuses(database_url) == {0: "COMMITTED"}


def test_precommitted_epochs_never_reach_the_table_before_their_checkpoint(
    coordinator: CoordinatorProcess, catalog: Catalog, database_url: str
) -> None:
    """Invariant 3: only epochs at or below the recorded checkpoint are appended, in order."""
    with coordinator.client() as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        for epoch in range(4):
            client.pre_commit(
                SINK, epoch, writer.writer_term, [write_parquet(writer.table_location, epoch_rows(epoch))]
            )
        assert catalog.load_table(TABLE).current_snapshot() is None
        client.commit_checkpoint(SINK, 1, writer.writer_term, wait=True)
        assert table_order_ids(catalog.load_table(TABLE)) == list(range(200))
        assert statuses(database_url) == {0: "COMMITTED", 1: "COMMITTED", 2: "PENDING", 3: "PENDING"}
        client.commit_checkpoint(SINK, 3, writer.writer_term, wait=True)
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(400))


def test_register_aborts_above_and_commits_at_or_below_the_checkpoint(
    coordinator_factory: Factory, catalog: Catalog, database_url: str
) -> None:
    """Invariants 4 and 5: recovery in one transaction; aborted files never enter the table and are deleted
    (here at once: the files of a recovery abort are kept for Spark's re-run otherwise, see test_cleaner)."""
    coordinator = coordinator_factory(SINK_COORDINATOR_RECOVERY_FILES_KEEP_SECONDS="0")
    with coordinator.client() as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        files: dict[int, str] = {}
        for epoch in range(5):
            files[epoch] = write_parquet(writer.table_location, epoch_rows(epoch))
            client.pre_commit(SINK, epoch, writer.writer_term, [files[epoch]])
        client.commit_checkpoint(SINK, 0, writer.writer_term, wait=True)
        # The Spark driver died after its checkpoint for epoch 2 and before reporting it.
        restarted = client.register_writer(SINK, TABLE, 2, arrow_schema=SCHEMA)
        assert restarted.aborted_epochs == (3, 4)
        assert restarted.recommitting_epochs == (1, 2)
        for epoch in (3, 4):
            coordinator.wait_for_log("aborted epoch cleaned", sink=SINK, epoch=epoch)
        assert client.commit_checkpoint(SINK, 2, restarted.writer_term, wait=True).committed_epoch == 2
        assert statuses(database_url) == {0: "COMMITTED", 1: "COMMITTED", 2: "COMMITTED", 3: "ABORTED", 4: "ABORTED"}
        for epoch in (3, 4):
            assert not Path(files[epoch].removeprefix("file://")).exists(), "an aborted epoch's file was left"
        # Spark re-runs epochs 3 and 4 with new files: new attempts, committed once.
        for epoch in (3, 4):
            answer = client.pre_commit(
                SINK, epoch, restarted.writer_term, [write_parquet(writer.table_location, epoch_rows(epoch))]
            )
            assert answer.outcome is PreCommitOutcome.PERSISTED and answer.attempt == 2
        client.commit_checkpoint(SINK, 4, restarted.writer_term, wait=True)
    table = catalog.load_table(TABLE)
    assert table_order_ids(table) == list(range(500))
    assert not {files[3], files[4]} & table_files(table)


def test_repeated_checkpoints_and_precommits_commit_once(
    coordinator: CoordinatorProcess, catalog: Catalog, database_url: str
) -> None:
    """Invariant 2 under retries: the same calls again change nothing."""
    with coordinator.client() as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        path = write_parquet(writer.table_location, epoch_rows(0))
        for _ in range(2):
            assert client.pre_commit(SINK, 0, writer.writer_term, [path]).outcome is PreCommitOutcome.PERSISTED
        for _ in range(2):
            client.commit_checkpoint(SINK, 0, writer.writer_term, wait=True)
        late = client.pre_commit(SINK, 0, writer.writer_term, [path])
        assert late.outcome is PreCommitOutcome.ALREADY_COMMITTED
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(100))
    assert sink_snapshots(catalog) == [0]


def test_coalesced_commits_and_retention(coordinator_factory: Factory, catalog: Catalog, database_url: str) -> None:
    """Checkpointed epochs coalesce into one snapshot; committed rows beyond the retention are pruned."""
    process = coordinator_factory(SINK_COORDINATOR_COMMIT_MAX_EPOCHS="10", SINK_COORDINATOR_RETENTION_EPOCHS="3")
    with process.client() as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        for epoch in range(8):
            rows = [] if epoch == 5 else epoch_rows(epoch)  # an empty epoch is pre-committed with no files
            paths = [write_parquet(writer.table_location, rows)] if rows else []
            client.pre_commit(SINK, epoch, writer.writer_term, paths)
        client.commit_checkpoint(SINK, 7, writer.writer_term, wait=True)
    assert sink_snapshots(catalog) == [7]
    expected = [i for epoch in range(8) if epoch != 5 for i in range(epoch * 100, epoch * 100 + 100)]
    assert table_order_ids(catalog.load_table(TABLE)) == expected
    assert statuses(database_url) == {5: "COMMITTED", 6: "COMMITTED", 7: "COMMITTED"}


def test_two_coordinators_one_committer(coordinator_factory: Factory, catalog: Catalog, database_url: str) -> None:
    """Two processes on one database: a commit held by one is never repeated by the other."""
    stalled = coordinator_factory(**failpoints_env("commit.after_append=pause"))
    other = coordinator_factory(SINK_COORDINATOR_LOG_LEVEL="DEBUG")
    with stalled.client() as a, other.client() as b:
        writer = a.register_writer(SINK, TABLE, -1, arrow_schema=SCHEMA)
        for epoch in range(6):
            a.pre_commit(SINK, epoch, writer.writer_term, [write_parquet(writer.table_location, epoch_rows(epoch))])
        a.commit_checkpoint(SINK, 0, writer.writer_term)
        stalled.wait_for_log("failpoint hit", failpoint="commit.after_append")
        # The first process holds the sink's commit lock, stalled after its append: the second
        # must neither append epoch 0 again nor commit past it, however it is prodded.
        for epoch in range(1, 6):
            b.commit_checkpoint(SINK, epoch, writer.writer_term)
        other.wait_for_log("another committer holds the sink")
        assert sink_snapshots(catalog) == [0]
    stalled.stop()
    other.wait_for_log("epochs committed", sink=SINK, epochs=[1, 2, 3, 4, 5])
    assert sink_snapshots(catalog) == [0, 5]
    assert Counter(table_order_ids(catalog.load_table(TABLE))) == Counter(range(600))
    assert set(statuses(database_url).values()) == {"COMMITTED"}


def test_restart_commits_empty_backlogs_in_one_pass(
    coordinator_factory: Factory, catalog: Catalog, database_url: str
) -> None:
    """A restart marks every sink's all-empty checkpointed backlog at once; a backlog with a file keeps its
    order through the sink's committer, and a sink another committer holds is left alone until it is free."""
    first = coordinator_factory(**failpoints_env("commit.after_lock=pause"))
    with first.client() as client:
        terms: dict[str, int] = {}
        for sink in ("empty-a", "with-file", "held"):
            terms[sink] = client.register_writer(sink, TABLE, -1, arrow_schema=SCHEMA).writer_term
        location = catalog.load_table(TABLE).location()
        for epoch in range(3):
            client.pre_commit("empty-a", epoch, terms["empty-a"], [])
            client.pre_commit("held", epoch, terms["held"], [])
        client.pre_commit("with-file", 0, terms["with-file"], [])
        client.pre_commit("with-file", 1, terms["with-file"], [write_parquet(location, epoch_rows(1))])
        for sink in terms:
            # Recorded; the committer woken by it stalls after taking the lock, before reading anything.
            client.commit_checkpoint(sink, 2 if sink != "with-file" else 1, terms[sink])
    first.kill()
    assert set(statuses_by_sink(database_url).values()) == {"PENDING"}
    held_id = query(database_url, "SELECT id FROM sinks WHERE name = 'held'")[0][0]
    with psycopg.connect(libpq_url(database_url), autocommit=True) as other_committer:
        other_committer.execute("SELECT pg_advisory_lock(%s, %s)", (COMMIT_LOCK_CLASS, held_id))
        second = coordinator_factory()
        second.wait_for_log("empty checkpointed epochs committed", sinks=1, epochs=3)
        second.wait_for_log("epochs committed", sink="with-file", epochs=[0, 1])
        by_sink = statuses_by_sink(database_url)
        assert {epoch: by_sink["empty-a", epoch] for epoch in range(3)} == dict.fromkeys(range(3), "COMMITTED")
        assert {epoch: by_sink["held", epoch] for epoch in range(3)} == dict.fromkeys(range(3), "PENDING")
        committed = dict(query(database_url, "SELECT name, committed_epoch FROM sinks"))
        assert committed == {"empty-a": 2, "with-file": 1, "held": -1}
    # Released (the other committer is gone): the next poll commits it through its own pass.
    second.wait_for_log("epochs committed", sink="held", epochs=[0, 1, 2])
    assert set(statuses_by_sink(database_url).values()) == {"COMMITTED"}
    assert table_order_ids(catalog.load_table(TABLE)) == list(range(100, 200))
    assert sink_snapshots(catalog, "with-file") == [1]


def statuses_by_sink(database_url: str) -> dict[tuple[str, int], str]:
    rows = query(
        database_url,
        "SELECT s.name, p.epoch, p.status FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id",
    )
    return {(str(name), int(str(epoch))): str(status) for name, epoch, status in rows}
