"""RegisterWriter changes nothing, the table included, for a writer it refuses."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.errors import CheckpointBehind, FailedPrecondition, InvalidArgument
from coordinator_service.protocol import TableRequest
from coordinator_service.table_origin import CREATED, ORIGIN
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import ORDERS
from tests.fixtures.postgres import query

pytestmark = pytest.mark.every_postgres


async def test_a_refused_writer_does_not_evolve_the_table(admin: AdminApp, catalog: Catalog) -> None:
    """Item 8: the checkpoint check comes before the table is created or altered."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    wider = ORDERS.append(pa.field("coupon", pa.string()))
    with pytest.raises(CheckpointBehind):
        await admin.runtime.coordinator.register_writer(
            "orders", "db.orders", -1, arrow_schema=wider.serialize().to_pybytes()
        )
    assert "coupon" not in catalog.load_table("db.orders").schema().column_names


async def test_a_refused_writer_does_not_create_a_table(admin: AdminApp, catalog: Catalog) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    with pytest.raises(FailedPrecondition, match=r"writes table db\.orders"):
        await admin.runtime.coordinator.register_writer(
            "orders", "db.elsewhere", 0, arrow_schema=ORDERS.serialize().to_pybytes()
        )
    assert not catalog.table_exists("db.elsewhere")


async def test_writers_registering_at_once_create_their_tables_in_one_new_namespace(admin: AdminApp) -> None:
    """Concurrent creations race in the catalog (the SQL catalog's unique keys): none is refused for it."""
    schema = ORDERS.serialize().to_pybytes()
    registrations = await asyncio.gather(
        *(
            admin.runtime.coordinator.register_writer(f"sink-{index}", f"fresh.table_{index}", -1, arrow_schema=schema)
            for index in range(12)
        )
    )
    assert [registration.writer_term for registration in registrations] == [1] * 12


async def test_a_table_named_before_the_name_policy_keeps_its_sink_working(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """The name policy refuses upper case (Glue and Hive fold it): a sink whose table the log recorded before the
    policy existed is not cut off, while no new sink or table may take such a name."""
    catalog.create_namespace("legacy")
    catalog.create_table("legacy.Orders", schema=ORDERS, properties={ORIGIN: CREATED})
    query(
        database_url,
        "WITH s AS (INSERT INTO sinks (name, table_identifier, catalog) VALUES ('old', 'legacy.Orders', 'default') "
        "RETURNING id) INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch) SELECT id, "
        "'legacy.Orders', -1 FROM s",
    )
    registration = await admin.register("old", table="legacy.Orders")
    await admin.pre_commit("old", registration, 0, 0)
    assert await admin.checkpoint("old", registration, 0) == 0
    assert len(catalog.load_table("legacy.Orders").scan().to_arrow()) == 10

    with pytest.raises(InvalidArgument, match="lower-case"):
        await admin.register("new", table="legacy.Orders2")
    with pytest.raises(InvalidArgument, match="lower-case"):
        await admin.runtime.coordinator.ensure_tables(
            "old", registration.writer_term, [TableRequest("legacy.Routed", ORDERS.serialize().to_pybytes())]
        )
