"""The commit interval coalesces a streaming sink's epochs, and a writer that waits for its commit is not made to
wait it out (the end of an availableNow run, a stop: CommitCheckpoint with wait)."""

from __future__ import annotations

import asyncio

from pyiceberg.catalog import load_catalog

from coordinator_service.contract.markers import MARKER_EPOCH, snapshot_properties
from coordinator_service.runtime import catalog_properties, metastore_url
from tests.fixtures.admin import AdminFactory, sink_id_of

INTERVAL_SECONDS = 600.0  # far longer than the test may take: a commit that waits it out times the test out


async def test_a_waiting_checkpoint_commits_at_once_and_takes_the_coalesced_epochs_along(
    admin_factory: AdminFactory,
) -> None:
    admin = await admin_factory(commit_interval_seconds=INTERVAL_SECONDS)
    writer = await admin.register("orders")
    await admin.pre_commit("orders", writer, 0, 0)
    assert await admin.checkpoint("orders", writer, 0) == 0  # the sink's first commit: no interval before it
    for epoch in (1, 2):
        await admin.pre_commit("orders", writer, epoch, epoch * 10)
        assert await admin.checkpoint("orders", writer, epoch, wait=False) == 0  # within the interval: waits
    await admin.pre_commit("orders", writer, 3, 30)
    async with asyncio.timeout(60):
        assert await admin.checkpoint("orders", writer, 3) == 3

    settings = admin.runtime.settings
    url, _ = metastore_url(settings)
    table = load_catalog(settings.catalog_name, **catalog_properties(settings, url)).load_table("db.orders")
    markers = [snapshot_properties(snapshot).get(MARKER_EPOCH) for snapshot in table.snapshots()]
    assert markers == ["0", "3"]  # epochs 1 to 3 in one snapshot
    assert table.scan().to_arrow().num_rows == 40


SHORT_INTERVAL_SECONDS = 4.0


async def test_the_interval_holds_for_a_sink_whose_checkpoints_reach_another_process(
    admin_factory: AdminFactory, database_url: str
) -> None:
    """Processes of one supervisor (or replicas) share the sink: its next commit waits out the interval since its last
    commit, whichever process made it. A process that had not committed the sink itself took it as never committed
    and committed at once, so with two of them the sink committed at every checkpoint."""
    first = await admin_factory(commit_interval_seconds=SHORT_INTERVAL_SECONDS)
    second = await admin_factory(commit_interval_seconds=SHORT_INTERVAL_SECONDS)
    writer = await first.register("orders")
    await first.pre_commit("orders", writer, 0, 0)
    assert await first.checkpoint("orders", writer, 0) == 0
    await first.pre_commit("orders", writer, 1, 10)
    assert await second.checkpoint("orders", writer, 1, wait=False) == 0
    sink_id = sink_id_of(database_url, "orders")
    async with asyncio.timeout(60):  # committed by either process, each pass of the second's looked at
        while (await second.runtime.coordinator.sink_state("orders")).committed_epoch < 1:
            await second.runtime.committer.wait_for_pass(sink_id, 0.5)

    settings = first.runtime.settings
    url, _ = metastore_url(settings)
    table = load_catalog(settings.catalog_name, **catalog_properties(settings, url)).load_table("db.orders")
    committed = {
        snapshot_properties(snapshot).get(MARKER_EPOCH): snapshot.timestamp_ms for snapshot in table.snapshots()
    }
    assert (committed["1"] - committed["0"]) / 1000 >= SHORT_INTERVAL_SECONDS * 0.95  # the clocks' rounding
