"""The cleaner deletes an aborted attempt's files only when nothing can need them any more."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from coordinator_service.engine.file_deletion import Deletion
from coordinator_service.engine.writer_requests import PreCommitRequest
from tests.fixtures.admin import AdminFactory, eventually
from tests.fixtures.coordinator import orders, table_files, table_order_ids, write_parquet
from tests.fixtures.postgres import query


def exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


async def test_the_cleaner_never_deletes_a_path_a_new_attempt_holds(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    """Defect 5: a re-attempt of an aborted epoch names the same path (deterministic names, a client retry)."""
    admin = await admin_factory(recovery_files_keep_seconds=0)
    first = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", first, epoch, epoch * 10)
    assert await admin.checkpoint("orders", first, 2) == 2
    reused = write_parquet(first.table_location, orders(30, 10), name="epoch-3-deterministic")
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=3, writer_term=first.writer_term, paths=(reused,))
    )

    # The cleaner is held after it read the aborted attempt's paths, just before it marks them for deletion.
    reached, release = threading.Event(), threading.Event()
    deleter = admin.runtime.cleaner.deleter
    delete = deleter.delete

    async def held_delete(*args: Any, **kwargs: Any) -> Deletion:
        if reused in args[4]:
            reached.set()
            await asyncio.to_thread(release.wait, 15.0)
        return await delete(*args, **kwargs)

    deleter.delete = held_delete  # type: ignore[method-assign]
    second = await admin.register("orders", checkpointed_epoch=2)  # recovery aborts epoch 3
    assert second.aborted_epochs == (3,)
    assert await asyncio.to_thread(reached.wait, 15.0)
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=3, writer_term=second.writer_term, paths=(reused,))
    )
    release.set()

    assert await admin.checkpoint("orders", second, 3) == 3
    table = catalog.load_table("db.orders")
    assert reused in table_files(table)
    assert await asyncio.to_thread(exists, reused)
    assert table_order_ids(table) == list(range(40))


async def test_files_of_an_epoch_aborted_by_recovery_are_kept_until_it_runs_again(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    """Issue 17 item 6: Kafka retention may remove the records before Spark re-runs the batch."""
    admin = await admin_factory()
    first = await admin.register("orders")
    await admin.pre_commit("orders", first, 0, 0)
    assert await admin.checkpoint("orders", first, 0) == 0
    stranded = await admin.pre_commit("orders", first, 1, 10)
    second = await admin.register("orders", checkpointed_epoch=0)
    assert second.aborted_epochs == (1,)
    assert await admin.runtime.cleaner.clean() == 0
    assert await asyncio.to_thread(exists, stranded)

    rerun = await admin.pre_commit("orders", second, 1, 10)  # Spark runs batch 1 again: a new attempt
    admin.runtime.cleaner.wake()

    async def deleted() -> bool:
        return not await asyncio.to_thread(exists, stranded)

    await eventually(deleted, "the replaced attempt's file deleted")
    assert await admin.checkpoint("orders", second, 1) == 1
    assert table_files(catalog.load_table("db.orders")) >= {rerun}
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


async def test_an_aborted_empty_epoch_is_cleaned(admin_factory: AdminFactory, database_url: str) -> None:
    """An epoch with no file holds nothing: once due, it is cleaned (the torture runs settle on it)."""
    admin = await admin_factory(recovery_files_keep_seconds=0)
    first = await admin.register("orders")
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=0, writer_term=first.writer_term, paths=())
    )
    second = await admin.register("orders", checkpointed_epoch=-1)
    assert second.aborted_epochs == (0,)

    async def cleaned() -> bool:
        return query(database_url, "SELECT files_cleaned FROM pending_sink_state WHERE epoch = 0") == [(True,)]

    await eventually(cleaned, "the aborted empty epoch cleaned")
