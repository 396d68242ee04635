"""Reset after a lost Spark checkpoint: the next writer's epochs are a new numbering, and are committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import CheckpointBehind, Fenced
from coordinator_service.contract.markers import (
    FENCE_SINK,
    MARKER_EPOCH,
    MARKER_GENERATION,
    Marker,
    snapshot_properties,
)
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.failpoints import Failpoint
from coordinator_service.log.database import libpq_url
from tests.fixtures.admin import (
    AdminApp,
    AdminFactory,
    CatalogDatabase,
    Gate,
    commit_lock_held,
    epoch_metadata,
    eventually,
    sink_id_of,
    sink_identity,
    terminate_commit_lock_holder,
    wait_for_commit_lock_waiter,
)
from tests.fixtures.coordinator import orders, table_order_ids, write_parquet
from tests.torture.audit import AUDIT_SQL, sink_row_went_back

RESET = {"confirm": "orders", "reason": "checkpoint volume lost"}


async def test_the_writer_after_a_reset_starts_a_new_numbering_that_is_committed(
    admin: AdminApp, catalog: Catalog
) -> None:
    old = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", old, epoch, epoch * 10)
    await admin.checkpoint("orders", old, 2)
    stranded = await admin.pre_commit("orders", old, 3, 30)

    # The Spark checkpoint is lost: a writer from a new one is refused until an operator resets the sink.
    with pytest.raises(CheckpointBehind) as refused:
        await admin.register("orders", checkpointed_epoch=-1)
    assert "/api/v1/sinks/orders/reset" in refused.value.message

    wrong = await admin.post("/api/v1/sinks/orders/reset", json={**RESET, "confirm": "other"})
    assert wrong.status_code == 422
    assert "confirm" in wrong.json()["error"]["message"]

    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 200, response.text
    reset = response.json()
    assert reset["aborted_epochs"] == [3]
    sink = reset["sink"]
    assert (sink["checkpointed_epoch"], sink["committed_epoch"]) == (2, 2)
    assert sink["writer_term"] == old.writer_term + 1
    assert sink["generation"] == 1
    assert sink["awaiting_writer_after_reset"] is True
    aborted = (await admin.get("/api/v1/sinks/orders/epochs/3")).json()
    assert aborted["status"] == "ABORTED"
    assert aborted["reason"] == "reset by anonymous from 10.0.0.7:40123: checkpoint volume lost"

    # A writer still running on the old checkpoint is fenced.
    with pytest.raises(Fenced):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(sink="orders", epoch=4, writer_term=old.writer_term, paths=(stranded,))
        )

    async def stranded_files_cleaned() -> bool:
        return bool((await admin.get("/api/v1/sinks/orders/epochs/3")).json()["files_cleaned"])

    await eventually(stranded_files_cleaned, "the files of the epoch the reset aborted deleted")
    assert not await asyncio.to_thread(Path(stranded.removeprefix("file://")).exists)

    new = await admin.register("orders", checkpointed_epoch=-1)
    assert (new.committed_epoch, new.checkpointed_epoch) == (-1, -1)
    # The log's rows of the old numbering are gone; epoch numbers the old writer used are new epochs now.
    assert (await admin.get("/api/v1/sinks/orders/epochs")).json()["epochs"] == []
    for epoch in range(4):
        await admin.pre_commit("orders", new, epoch, 100 + epoch * 10)
    assert await admin.checkpoint("orders", new, 3) == 3

    table = catalog.load_table("db.orders")
    assert table_order_ids(table) == [*range(30), *range(100, 140)]
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    assert (snapshot.summary[MARKER_EPOCH], snapshot.summary[MARKER_GENERATION]) == ("3", "1")

    sink = (await admin.get("/api/v1/sinks/orders")).json()
    assert (sink["committed_epoch"], sink["generation"], sink["awaiting_writer_after_reset"]) == (3, 1, False)
    page = (await admin.get("/api/v1/sinks/orders/epochs")).json()
    assert [(epoch["epoch"], epoch["status"]) for epoch in page["epochs"]] == [
        (3, "COMMITTED"),
        (2, "COMMITTED"),
        (1, "COMMITTED"),
        (0, "COMMITTED"),
    ]


async def test_a_reset_sink_adopts_a_checkpoint_ahead_too(admin: AdminApp, catalog: Catalog, database_url: str) -> None:
    old = await admin.register("orders")
    await admin.pre_commit("orders", old, 0, 0)
    await admin.checkpoint("orders", old, 0)
    await admin.pre_commit("orders", old, 1, 10)
    async with commit_lock_held(database_url, sink_id_of(database_url, "orders")) as lock:
        await admin.checkpoint("orders", old, 1, wait=False)  # checkpointed, not committed
        reset = asyncio.create_task(admin.post("/api/v1/sinks/orders/reset", json=RESET))
        await wait_for_commit_lock_waiter(lock, sink_id_of(database_url, "orders"))
    response = await reset
    assert response.status_code == 200
    # The restart point: the checkpointed epoch is committed by the reset, never left half way.
    assert response.json()["aborted_epochs"] == []
    sink = response.json()["sink"]
    assert (sink["checkpointed_epoch"], sink["committed_epoch"]) == (1, 1)

    # E.g. a checkpoint restored from another copy: its batches up to 7 are done.
    new = await admin.register("orders", checkpointed_epoch=7)
    assert new.committed_epoch == 7
    await admin.pre_commit("orders", new, 8, 80)
    assert await admin.checkpoint("orders", new, 8) == 8
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(20), *range(80, 90)]


async def test_reset_of_an_unknown_sink_is_404(admin: AdminApp) -> None:
    response = await admin.post("/api/v1/sinks/nope/reset", json={"confirm": "nope", "reason": "x"})
    assert response.status_code == 404


async def test_markers_of_an_older_generation_do_not_count(admin: AdminApp, database_url: str) -> None:
    """The ancestry walk stops at another generation's marker, whatever its epoch."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    entries = epoch_metadata(database_url, 0).data_files
    tables = admin.runtime.iceberg
    sink = await sink_identity(admin, "orders")

    def append(epoch: int, generation: int) -> int:
        marked = replace(sink, generation=generation)
        return tables.append("db.orders", marked, epoch, f"c{epoch}-{generation}", entries)

    def markers(generation: int) -> list[Marker]:
        return tables.sink_markers("db.orders", replace(sink, generation=generation), 0)

    first = await asyncio.to_thread(append, 5, 0)
    second = await asyncio.to_thread(append, 9, 0)
    assert await asyncio.to_thread(markers, 1) == []
    assert await asyncio.to_thread(markers, 0) == [Marker(5, first), Marker(9, second)]
    third = await asyncio.to_thread(append, 1, 1)
    assert await asyncio.to_thread(markers, 1) == [Marker(1, third)]


async def test_reset_marks_committed_an_epoch_the_table_already_holds(
    admin: AdminApp, catalog: Catalog, database_url: str, gates: Callable[[Failpoint], Gate]
) -> None:
    """Defect 1: the committer appended epoch 1 and died before marking it; a reset must not abort it."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    await admin.pre_commit("orders", registration, 1, 10)
    appended = gates(Failpoint.COMMIT_AFTER_APPEND)
    await admin.checkpoint("orders", registration, 1, wait=False)
    await appended.wait_reached()
    # The committer dies here: its session, and the commit lock with it, are gone; epoch 1 is in the table.
    assert await terminate_commit_lock_holder(database_url, sink_id_of(database_url, "orders")) == 1

    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 200, response.text
    reset = response.json()
    assert reset["aborted_epochs"] == []
    assert (reset["sink"]["checkpointed_epoch"], reset["sink"]["committed_epoch"]) == (1, 1)
    table = catalog.load_table("db.orders")
    [holding] = [s for s in table.snapshots() if snapshot_properties(s).get(MARKER_EPOCH) == "1"]
    fence = table.current_snapshot()
    assert fence is not None
    assert (fence.parent_snapshot_id, snapshot_properties(fence).get(FENCE_SINK)) == (holding.snapshot_id, "orders")
    epoch = (await admin.get("/api/v1/sinks/orders/epochs/1")).json()
    assert (epoch["status"], epoch["snapshot_id"]) == ("COMMITTED", holding.snapshot_id)
    appended.open()  # the old committer's COMMITTED transaction finds the reset already recorded its snapshot
    # The documented restart after a reset goes on from the committed epoch: nothing is written twice.
    new = await admin.register("orders", checkpointed_epoch=1)
    await admin.pre_commit("orders", new, 2, 20)
    assert await admin.checkpoint("orders", new, 2) == 2
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(30))


async def test_a_reset_that_cannot_read_the_table_changes_nothing(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase
) -> None:
    """The reset must know what the table holds before it aborts anything: a catalog outage is 503."""
    admin = await admin_factory(catalog=catalog_database.properties)
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    await admin.pre_commit("orders", registration, 1, 10)
    before = (await admin.get("/api/v1/sinks/orders")).json()

    catalog_database.go_down()
    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "UNAVAILABLE"
    after = (await admin.get("/api/v1/sinks/orders")).json()
    assert {key: after[key] for key in ("writer_term", "generation", "checkpointed_epoch", "committed_epoch")} == {
        key: before[key] for key in ("writer_term", "generation", "checkpointed_epoch", "committed_epoch")
    }
    assert (await admin.get("/api/v1/sinks/orders/epochs/1")).json()["status"] == "PENDING"

    catalog_database.come_back()
    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 200, response.text
    assert response.json()["aborted_epochs"] == [1]


async def test_an_epoch_number_of_the_new_numbering_is_never_answered_by_the_old_one(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Defect: epoch 0 was re-attempted before the reset, so its row still held the replaced attempt's files for
    the cleaner; the registration after the reset kept that COMMITTED row, and the new numbering's epoch 0 was
    answered ALREADY_COMMITTED (the writer deletes its file: records lost)."""
    admin = await admin_factory(cleanup_delay_seconds=3600.0)
    old = await admin.register("orders")
    await admin.pre_commit("orders", old, 0, 0)  # attempt 1
    restarted = await admin.register("orders", checkpointed_epoch=-1)  # aborts epoch 0 (recovery)
    await admin.pre_commit("orders", restarted, 0, 0)  # attempt 2: attempt 1's file waits for the cleaner
    assert await admin.checkpoint("orders", restarted, 0) == 0

    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 200, response.text
    new = await admin.register("orders", checkpointed_epoch=-1)
    path = write_parquet(new.table_location, orders(100, 10))
    result = await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=0, writer_term=new.writer_term, paths=(path,))
    )
    assert result.outcome == PreCommitOutcome.PERSISTED
    assert await admin.checkpoint("orders", new, 0) == 0
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(10), *range(100, 110)]


async def test_the_sink_row_never_goes_back_across_a_reset_and_the_writer_after_it(
    admin: AdminApp, database_url: str
) -> None:
    """Every version of the sink's row, one per statement (the torture's audit trigger): its numbers go back to the
    new numbering's only in a version that still awaits the writer after the reset. A rebase that marked the row no
    longer awaiting before it set the new numbers wrote a version going back from (1, 2, 2, 2) to (1, 2, -1, -1)
    (the torture's seed 5121 found it)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(AUDIT_SQL)
    old = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", old, epoch, epoch * 10)
    await admin.checkpoint("orders", old, 2)
    response = await admin.post("/api/v1/sinks/orders/reset", json=RESET)
    assert response.status_code == 200, response.text
    new = await admin.register("orders", checkpointed_epoch=-1)
    await admin.pre_commit("orders", new, 0, 100)
    await admin.checkpoint("orders", new, 0)

    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        assert sink_row_went_back(connection, sink_id_of(database_url, "orders")) == []
        versions = connection.execute("SELECT count(*) FROM torture_sink_audit").fetchone()
    assert versions is not None and versions[0] > 5  # the audit saw the statements
