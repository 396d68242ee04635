"""The coordinator on S3-compatible storage, with a SQL catalog and with Glue (moto's server, or a real endpoint)."""

from __future__ import annotations

import asyncio

import pytest
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service.protocol import PreCommitRequest, Registration
from tests.fixtures.admin import AdminApp, AdminFactory, eventually, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders
from tests.fixtures.object_store import ObjectStore


def catalogs(object_store: ObjectStore, warehouse: str, database_url: str) -> dict[str, dict[str, str]]:
    return {
        "sql": {"type": "sql", "uri": database_url, "warehouse": warehouse, **object_store.properties},
        "glue": {
            "type": "glue",
            "glue.endpoint": object_store.endpoint,
            "glue.region": object_store.region,
            "glue.access-key-id": object_store.access_key_id,
            "glue.secret-access-key": object_store.secret_access_key,
            "warehouse": warehouse,
            **object_store.properties,
        },
    }


def order_ids(catalog: Catalog, table: str) -> list[int]:
    loaded = catalog.load_table(table)
    return sorted(loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())


async def pre_commit(admin: AdminApp, store: ObjectStore, registration: Registration, epoch: int, first: int) -> str:
    uri = await asyncio.to_thread(store.write_parquet, registration.table_location, orders(first, 10), ORDERS)
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=epoch, writer_term=registration.writer_term, paths=(uri,))
    )
    return uri


@pytest.mark.parametrize("kind", ["sql", "glue"])
async def test_commits_recovery_and_cleanup_on_object_storage(
    kind: str, admin_factory: AdminFactory, object_store: ObjectStore, s3_warehouse: str, database_url: str
) -> None:
    properties = catalogs(object_store, s3_warehouse, database_url)[kind]
    admin = await admin_factory(catalog_name=f"s3-{kind}", catalog=properties, recovery_files_keep_seconds=0)
    catalog = load_catalog(f"s3-{kind}", **properties)
    table = f"db_{kind}.orders"
    first = await admin.register("orders", table=table)
    assert first.table_location.startswith("s3://")
    for epoch in range(2):
        await pre_commit(admin, object_store, first, epoch, epoch * 10)
    assert await admin.checkpoint("orders", first, 1) == 1
    stranded = await pre_commit(admin, object_store, first, 2, 20)

    second = await admin.runtime.coordinator.register_writer(
        "orders", table, 1, arrow_schema=ORDERS.serialize().to_pybytes()
    )
    assert second.aborted_epochs == (2,)
    await pre_commit(admin, object_store, second, 2, 20)  # Spark's re-run of the batch
    assert await admin.checkpoint("orders", second, 2) == 2
    assert order_ids(catalog, table) == list(range(30))

    async def cleaned() -> bool:
        return not await asyncio.to_thread(object_store.exists, stranded)

    await eventually(cleaned, "the aborted attempt's file deleted from the object store")

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert (run.outcome, run.swept) == ("ok", True), run.error
    assert order_ids(catalog, table) == list(range(30))
