"""The commit interval coalesces a streaming sink's epochs, and a writer that waits for its commit is not made to
wait it out (the end of an availableNow run, a stop: CommitCheckpoint with wait)."""

from __future__ import annotations

import asyncio

from pyiceberg.catalog import load_catalog

from coordinator_service.contract.markers import MARKER_EPOCH, snapshot_properties
from coordinator_service.runtime import catalog_properties, metastore_url
from tests.fixtures.admin import AdminFactory

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
