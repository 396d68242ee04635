"""The metastore's migrations: they build what the models describe, and carry a log of an older release forward."""

from __future__ import annotations

import uuid

import pyarrow as pa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pyiceberg.catalog import Catalog
from sqlalchemy import text

from coordinator_service import precommit_metadata, schema
from coordinator_service.database import create_sync_engine, normalize_url
from coordinator_service.iceberg import MARKER_COMMIT_ID, MARKER_EPOCH, MARKER_GENERATION, MARKER_SINK
from coordinator_service.models import Base
from coordinator_service.precommit_metadata import DataFileEntry, PreCommitMetadata
from tests.fixtures.admin import AdminFactory
from tests.fixtures.coordinator import ORDERS, orders, table_order_ids
from tests.fixtures.postgres import query


def test_the_migrations_build_what_the_models_describe(database_url: str) -> None:
    engine = create_sync_engine(normalize_url(database_url))
    try:
        with engine.begin() as connection:
            schema.upgrade(connection)
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert differences == []


async def test_a_sink_from_before_incarnations_keeps_its_markers(
    database_url: str, catalog: Catalog, admin_factory: AdminFactory
) -> None:
    """A log and a table written by the release before 0003: its markers carry no incarnation, and still count.

    The old committer appended epoch 1 and died before marking it; after the upgrade the committer must find
    that marker its own (and not append epoch 1 a second time), and the epoch's file must be claimed.
    """
    engine = create_sync_engine(normalize_url(database_url))
    with engine.begin() as connection:
        schema.upgrade(connection, "0002")
    catalog.create_namespace("db")
    table = catalog.create_table("db.orders", schema=ORDERS)
    table.append(pa.Table.from_pylist(orders(0, 10), schema=ORDERS))
    old_marker = {MARKER_SINK: "orders", MARKER_EPOCH: "1", MARKER_COMMIT_ID: "old", MARKER_GENERATION: "0"}
    table.append(pa.Table.from_pylist(orders(10, 10), schema=ORDERS), snapshot_properties=old_marker)
    appended = table.current_snapshot()
    assert appended is not None
    path = f"{table.location()}/data/epoch-1.parquet"
    record = PreCommitMetadata(
        table="db.orders",
        data_files=(DataFileEntry(path=path, writer_id=0, record_count=10, file_size_in_bytes=1, spec_id=0),),
    )
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch, committed_epoch, writer_term) "
                "VALUES ('orders', 'db.orders', 'default', 1, 0, 1)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, metadata, attempt, file_count, record_count) "
                "SELECT id, 1, 'PENDING', :metadata, 1, 1, 10 FROM sinks"
            ),
            {"metadata": precommit_metadata.encode(record)},
        )
        schema.upgrade(connection)
    engine.dispose()
    [(incarnation, legacy)] = query(database_url, "SELECT incarnation, legacy_markers FROM sinks")
    assert isinstance(incarnation, uuid.UUID)
    assert legacy is True
    assert query(database_url, "SELECT path, epoch, attempt, discarded_at FROM epoch_files") == [(path, 1, 1, None)]

    admin = await admin_factory()
    admin.runtime.committer.wake(1)
    sink = await admin.runtime.committer.wait_committed(1, 1, (incarnation, 0))
    assert sink == 1
    [(status, snapshot_id)] = query(database_url, "SELECT status, snapshot_id FROM pending_sink_state WHERE epoch = 1")
    assert (status, snapshot_id) == ("COMMITTED", appended.snapshot_id)
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


def test_a_sink_from_before_fan_out_gets_its_own_table_and_its_tables_follow_it(database_url: str) -> None:
    """0006: every sink's own table is one of its tables, at its committed epoch; when the sink's committed epoch
    moves, no table of it stays behind (one that is ahead stays where it is)."""
    engine = create_sync_engine(normalize_url(database_url))
    try:
        with engine.begin() as connection:
            schema.upgrade(connection, "0005")
            connection.execute(
                text(
                    "INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch, committed_epoch) "
                    "VALUES ('orders', 'db.orders', 'default', 9, 3)"
                )
            )
            schema.upgrade(connection)
    finally:
        engine.dispose()
    assert query(database_url, "SELECT table_identifier, committed_epoch FROM sink_tables") == [("db.orders", 3)]
    query(
        database_url,
        "INSERT INTO sink_tables (sink_id, table_identifier, committed_epoch) SELECT id, 'db.eu', 7 FROM sinks",
    )
    query(database_url, "UPDATE sinks SET committed_epoch = 5")
    assert query(database_url, "SELECT table_identifier, committed_epoch FROM sink_tables ORDER BY 1") == [
        ("db.eu", 7),
        ("db.orders", 5),
    ]
