"""RegisterWriter changes nothing, the table included, for a writer it refuses."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import CheckpointBehind, FailedPrecondition, InvalidArgument
from coordinator_service.engine.writer_requests import TableRequest
from coordinator_service.log import sink_rows
from coordinator_service.tables.table_origin import CREATED, ORIGIN
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import ORDERS
from tests.fixtures.postgres import query


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


TEXT_AMOUNT = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.string()),
    ]
)


async def test_a_schema_that_does_not_fit_another_sinks_table_is_refused_at_registration(
    admin: AdminApp, catalog: Catalog
) -> None:
    """Issue 26.4: a second sink on a table was refused only at its first PreCommit, after Spark wrote its files.
    It is refused when it registers, naming the sink that writes the table, and nothing changes."""
    await admin.register("orders")
    before = catalog.load_table("db.orders").schema()
    for schema in (TEXT_AMOUNT, TEXT_AMOUNT.append(pa.field("coupon", pa.string()))):
        with pytest.raises(InvalidArgument) as refused:
            await admin.runtime.coordinator.register_writer(
                "orders-copy", "db.orders", -1, arrow_schema=schema.serialize().to_pybytes()
            )
        message = refused.value.message
        assert message.startswith("the writer's schema does not fit table 'db.orders', which sink orders writes: ")
        assert "amount: double -> string" in message
        assert message.endswith("Nothing was changed")
    assert catalog.load_table("db.orders").schema() == before
    async with admin.runtime.database.transaction() as session:
        assert await sink_rows.sink_by_name(session, "orders-copy") is None


async def test_a_nullable_column_the_table_requires_is_refused_at_registration(admin: AdminApp) -> None:
    """Files with it would be refused at PreCommit (their column may hold nulls the table refuses)."""
    await admin.register("orders")
    nullable = pa.schema([pa.field("order_id", pa.int64()), pa.field("customer", pa.string())])
    with pytest.raises(InvalidArgument, match=r"1: order_id: required long \(the writer: 1: order_id: optional long\)"):
        await admin.runtime.coordinator.register_writer(
            "orders-copy", "db.orders", -1, arrow_schema=nullable.serialize().to_pybytes()
        )


async def test_a_second_sink_whose_schema_fits_shares_the_table(admin: AdminApp, catalog: Catalog) -> None:
    """Two streams into one table (fewer columns, a narrower integer, a new column) stay welcome."""
    await admin.register("orders")
    fitting = pa.schema([pa.field("order_id", pa.int32(), nullable=False), pa.field("coupon", pa.string())]).serialize()
    registration = await admin.runtime.coordinator.register_writer(
        "orders-copy", "db.orders", -1, arrow_schema=fitting.to_pybytes()
    )
    assert registration.writer_term == 1
    assert "coupon" in catalog.load_table("db.orders").schema().column_names


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
