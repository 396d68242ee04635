"""A sink is one incarnation: markers of another sink, or of an earlier incarnation of its name, are not its own."""

from __future__ import annotations

from pyiceberg.catalog import Catalog

from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import table_order_ids
from tests.fixtures.postgres import query


async def test_a_sink_created_again_under_an_old_name_appends_its_own_epochs(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """Defect 2: the metastore lost the sink (recreated, restored empty, row deleted) while the table stayed."""
    old = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", old, epoch, epoch * 10)
    assert await admin.checkpoint("orders", old, 2) == 2
    query(database_url, "DELETE FROM sinks WHERE name = 'orders'")

    new = await admin.register("orders")
    assert (new.checkpointed_epoch, new.committed_epoch) == (-1, -1)
    await admin.pre_commit("orders", new, 0, 100)
    assert await admin.checkpoint("orders", new, 0) == 0
    # Epoch 0 of the new sink is not epoch 0 of the old one: its rows are appended, not taken as present.
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(30), *range(100, 110)]
