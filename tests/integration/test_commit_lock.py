"""The commit lock is not trusted blindly: it can vanish with its connection in the middle of a commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pyiceberg.catalog import Catalog

from coordinator_service.failpoints import Failpoint
from tests.fixtures.admin import AdminApp, AdminFactory, Gate, eventually, sink_id_of, terminate_commit_lock_holder
from tests.fixtures.coordinator import table_files, table_order_ids
from tests.fixtures.postgres import query


def exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


async def epoch_json(admin: AdminApp, epoch: int) -> dict[str, object]:
    response = await admin.get(f"/api/v1/sinks/orders/epochs/{epoch}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body, dict)
    return body


async def test_a_committer_that_lost_its_lock_does_not_append(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str, gates: Callable[[Failpoint], Gate]
) -> None:
    """Defect 3: the lock's connection dies after the marker walk; a forced abort and the cleaner go ahead."""
    admin = await admin_factory()
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    before_append = gates(Failpoint.COMMIT_BEFORE_APPEND)
    await admin.checkpoint("orders", registration, 0, wait=False)
    await before_append.wait_reached()
    assert await terminate_commit_lock_holder(database_url, sink_id_of(database_url, "orders")) == 1

    forced = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad", "force": True})
    assert forced.status_code == 200, forced.text

    async def cleaned() -> bool:
        return bool((await epoch_json(admin, 0))["files_cleaned"])

    await eventually(cleaned, "the aborted epoch's files deleted")
    before_append.open()  # the committer wakes up, still believing it holds the lock

    await admin.pre_commit("orders", registration, 1, 10)
    assert await admin.checkpoint("orders", registration, 1) == 1
    table = catalog.load_table("db.orders")
    missing = [file for file in table_files(table) if not await asyncio.to_thread(exists, file)]
    assert missing == []
    assert path not in table_files(table)
    assert table_order_ids(table) == list(range(10, 20))


async def test_an_epoch_aborted_behind_the_committers_back_but_appended_ends_committed(
    admin: AdminApp, catalog: Catalog, database_url: str, gates: Callable[[Failpoint], Gate]
) -> None:
    """The COMMITTED transaction re-checks each epoch under row locks: the table, not the stale row, is the truth."""
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    after_append = gates(Failpoint.COMMIT_AFTER_APPEND)
    checkpoint = asyncio.create_task(admin.checkpoint("orders", registration, 0))
    await after_append.wait_reached()
    # Any path that aborts the epoch while the committer's lock is gone (here: behind everyone's back).
    query(
        database_url,
        "UPDATE pending_sink_state SET status = 'ABORTED', reason = 'lost race', files_cleaned = false, "
        "abort_cause = 'OPERATOR', aborted_at = now() WHERE epoch = 0",
    )
    after_append.open()
    assert await checkpoint == 0
    epoch = await epoch_json(admin, 0)
    table = catalog.load_table("db.orders")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert (epoch["status"], epoch["snapshot_id"]) == ("COMMITTED", snapshot.snapshot_id)
    assert path in table_files(table)
    assert await asyncio.to_thread(exists, path)
