"""A metastore restored to an earlier point, another table under a sink's table's name, another catalog: detected
(the sink suspended, with the way back in its reason and a gauge), never served as if nothing happened."""

from __future__ import annotations

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import SinkSuspended
from coordinator_service.engine.protocol import PreCommitRequest
from tests.fixtures.admin import AdminApp, AdminFactory, CatalogDatabase, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders, table_order_ids, write_parquet
from tests.fixtures.postgres import query


async def committed(admin: AdminApp, epochs: int) -> None:
    registration = await admin.register("orders")
    for epoch in range(epochs):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch


def restore_earlier_backup(database_url: str, epoch: int) -> None:
    """What the log looked like when epoch `epoch` was the last one committed (the catalog stays current)."""
    query(database_url, "DELETE FROM pending_sink_state WHERE epoch > %s", epoch)
    query(database_url, "UPDATE sink_tables SET committed_epoch = %s", epoch)
    query(database_url, "UPDATE sinks SET checkpointed_epoch = %s, committed_epoch = %s", epoch, epoch)


async def test_a_metastore_restored_to_an_earlier_point_is_detected_and_reconciled(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """On-call review: a metastore restored to an earlier dump while the catalog stayed current: the pod was ready,
    logged nothing, reported committed epoch 4 for a table holding 9 and refused the running writer."""
    await committed(admin, 5)
    restore_earlier_backup(database_url, 2)

    found = await admin.runtime.checks.check_all()

    assert "holds epoch 4" in found["orders"] and "reconcile" in found["orders"]
    sink = (await admin.get("/api/v1/sinks/orders")).json()
    assert sink["suspended_reason"] == found["orders"]
    assert 'sink_coordinator_sink_suspended{sink="orders"} 1.0' in (await admin.get("/metrics")).text
    term = sink["writer_term"]
    with pytest.raises(SinkSuspended, match="metastore is behind"):
        await admin.runtime.coordinator.pre_commit(PreCommitRequest("orders", 3, term, ()))
    with pytest.raises(SinkSuspended):
        await admin.register("orders", checkpointed_epoch=4)

    wrong = await admin.post("/api/v1/sinks/orders/reconcile", json={"confirm": "other", "reason": "restore"})
    assert wrong.status_code == 422
    response = await admin.post("/api/v1/sinks/orders/reconcile", json={"confirm": "orders", "reason": "restore"})
    assert response.status_code == 200, response.text
    reconciled = response.json()
    assert (reconciled["restart_epoch"], reconciled["tables"]) == (4, {"db.orders": 4})
    assert reconciled["sink"]["suspended_reason"] is None
    assert await admin.runtime.checks.check_all() == {}

    # The documented restart: a new checkpoint, from the restart point's end offsets (new records).
    new = await admin.register("orders", checkpointed_epoch=-1)
    await admin.pre_commit("orders", new, 0, 100)
    assert await admin.checkpoint("orders", new, 0) == 0
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(50), *range(100, 110)]


async def test_another_table_under_the_sinks_table_name_is_detected(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    await committed(admin, 2)
    assert await admin.runtime.checks.check_all() == {}  # records the table's UUID
    catalog.drop_table("db.orders")
    catalog.create_table("db.orders", schema=ORDERS)

    found = await admin.runtime.checks.check_all()
    assert "another table under its name" in found["orders"]
    [(suspended,)] = query(database_url, "SELECT suspended_reason FROM sinks")
    assert suspended == found["orders"]


async def test_a_coordinator_started_on_another_catalog_suspends_the_sink_instead_of_creating_its_table_again(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase, catalog: Catalog, database_url: str
) -> None:
    """On-call review: restarted on another catalog, the coordinator silently created a new empty table and committed
    there while the API still named the old catalog."""
    first = await admin_factory()
    await committed(first, 2)
    await first.runtime.close()

    moved = await admin_factory(catalog=catalog_database.properties, catalog_name="elsewhere")
    found = await moved.runtime.checks.check_all()
    assert "created in catalog 'default'" in found["orders"]
    with pytest.raises(SinkSuspended, match="catalog"):
        await moved.register("orders", checkpointed_epoch=1)
    location = f"{catalog_database.warehouse}/db/orders"
    path = write_parquet(location, orders(20, 10))
    with pytest.raises(SinkSuspended):
        await moved.runtime.coordinator.pre_commit(PreCommitRequest("orders", 2, 2, (path,)))
    assert query(database_url, "SELECT count(*) FROM pending_sink_state WHERE epoch = 2") == [(0,)]
    assert sink_id_of(database_url, "orders") == 1
    # An operator's reconcile cannot take the other catalog's tables as the sink's: refused, nothing changed.
    before = query(database_url, "SELECT generation, writer_term, suspended_reason FROM sinks")
    refused = await moved.post("/api/v1/sinks/orders/reconcile", json={"confirm": "orders", "reason": "moved"})
    assert refused.status_code == 409
    assert "configure the catalog it was created in" in refused.json()["error"]["message"]
    assert query(database_url, "SELECT generation, writer_term, suspended_reason FROM sinks") == before
