"""Deletions against claims: no file a pre-commit, a waiting part or an in-flight append relies on is deleted.

Every deletion (the cleaner's, the orphan sweep's, expiration's) goes through coordinator_service.engine.file_deletion,
which marks the paths in the log before it deletes them; a claim of a marked path is refused, and a marked path
someone claims is not deleted. A forced abort first commits a fence to the table, so an append built on the old
head fails instead of landing on files deleted after the abort.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from sqlalchemy import text

from coordinator_service.engine.maintenance_steps import orphan_sweep
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.failpoints import Failpoint
from tests.fixtures.admin import AdminFactory, Gate, eventually, sink_id_of, terminate_commit_lock_holder
from tests.fixtures.coordinator import ORDERS, orders, table_files, table_order_ids, write_parquet
from tests.fixtures.reachable_files import missing_reachable_files

TWO_HOURS = 7200.0


def exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


def backdate(uri: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(uri.removeprefix("file://"), (then, then))


async def test_the_sweep_leaves_the_file_of_a_part_that_waits_for_its_other_writers(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Defect 3: a multi-writer epoch's first part waited past the grace; the sweep must not delete its file."""
    admin = await admin_factory(orphan_grace_seconds=3600, compaction_min_files=1_000_000)
    coordinator = admin.runtime.coordinator
    registration = await coordinator.register_writer(
        "orders", "db.orders", -1, writer_count=2, arrow_schema=ORDERS.serialize().to_pybytes()
    )
    first = write_parquet(registration.table_location, orders(0, 10))
    part = asyncio.create_task(
        coordinator.pre_commit(PreCommitRequest("orders", 0, registration.writer_term, (first,), writer_id=0))
    )

    async def part_stored() -> bool:
        async with admin.runtime.database.transaction() as session:
            return bool((await session.execute(text("SELECT count(*) FROM epoch_parts"))).scalar_one())

    await eventually(part_stored, "the first writer's part stored")
    await asyncio.to_thread(backdate, first, TWO_HOURS)  # the other writer is slow: the part waits past the grace

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert (run.outcome, run.swept) == ("ok", True), run.error

    second = write_parquet(registration.table_location, orders(10, 10))
    await coordinator.pre_commit(PreCommitRequest("orders", 0, registration.writer_term, (second,), writer_id=1))
    await part
    assert await admin.checkpoint("orders", registration, 0) == 0
    assert missing_reachable_files(catalog.load_table("db.orders")) == []
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


async def test_a_path_claimed_while_the_sweep_runs_is_not_deleted(
    admin_factory: AdminFactory,
    catalog: Catalog,
    database_url: str,
    gates: Callable[[Failpoint], Gate],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 4: the sweep looked up the held paths once; a writer then wrote a fresh file under the name of an
    old orphan (deterministic names are legal) and pre-committed it before the sweep's next batch."""
    monkeypatch.setattr(orphan_sweep, "ORPHAN_DELETE_BATCH", 1)
    admin = await admin_factory(orphan_grace_seconds=3600, compaction_min_files=1_000_000)
    registration = await admin.register("orders")
    location = registration.table_location
    oldest = write_parquet(location, orders(900, 3), name="task-00000-attempt-0")
    reused = write_parquet(location, orders(950, 3), name="task-00001-attempt-0")
    await asyncio.to_thread(backdate, oldest, TWO_HOURS + 60)
    await asyncio.to_thread(backdate, reused, TWO_HOURS)

    first_batch = gates(Failpoint.MAINTENANCE_DURING_SWEEP)
    run = asyncio.create_task(admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders")))
    await first_batch.wait_reached()
    assert not await asyncio.to_thread(exists, oldest)
    # The writer's task writes its file under the same name again and pre-commits it.
    assert write_parquet(location, orders(0, 10), name="task-00001-attempt-0") == reused
    await admin.runtime.coordinator.pre_commit(PreCommitRequest("orders", 0, registration.writer_term, (reused,)))
    first_batch.open()
    assert (await run).outcome == "ok"

    assert await admin.checkpoint("orders", registration, 0) == 0
    assert missing_reachable_files(catalog.load_table("db.orders")) == []
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10))


async def test_an_append_in_flight_after_its_lock_was_lost_cannot_land_on_files_a_forced_abort_deleted(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Defect 6: the committer verified its lock, then lost it mid-append; a forced abort by another holder and
    the cleaner (no delay) went ahead. The abort's fence makes the late append fail instead of landing."""
    admin = await admin_factory(cleanup_delay_seconds=0.0)
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    tables = admin.runtime.iceberg
    original = tables.append
    in_append, go_on = threading.Event(), threading.Event()

    def slow_append(*args: Any, **kwargs: Any) -> int:
        in_append.set()
        go_on.wait(30)
        return original(*args, **kwargs)

    tables.append = slow_append  # type: ignore[method-assign]
    await admin.checkpoint("orders", registration, 0, wait=False)
    await asyncio.to_thread(in_append.wait, 15)
    tables.append = original  # type: ignore[method-assign]
    assert await terminate_commit_lock_holder(database_url, sink_id_of(database_url, "orders")) == 1

    forced = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad batch", "force": True})
    assert forced.status_code == 200, forced.text

    async def cleaned() -> bool:
        return bool((await admin.get("/api/v1/sinks/orders/epochs/0")).json()["files_cleaned"])

    await eventually(cleaned, "the aborted epoch's files deleted")
    assert not await asyncio.to_thread(exists, path)
    go_on.set()  # the append goes on, on the table it loaded before the abort

    await admin.pre_commit("orders", registration, 1, 10)
    assert await admin.checkpoint("orders", registration, 1) == 1
    assert missing_reachable_files(catalog.load_table("db.orders")) == []
    assert path not in table_files(catalog.load_table("db.orders"))
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10, 20))
