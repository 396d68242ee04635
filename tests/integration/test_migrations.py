"""The metastore's migrations: they build what the models describe, and carry a log of an older release forward."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pyarrow as pa
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pyiceberg.catalog import Catalog
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from coordinator_service.contract.errors import SchemaNotCurrent
from coordinator_service.contract.markers import MARKER_COMMIT_ID, MARKER_EPOCH, MARKER_GENERATION, MARKER_SINK
from coordinator_service.log import precommit_metadata, schema
from coordinator_service.log.database import create_sync_engine, libpq_url, normalize_url
from coordinator_service.log.models import Base
from coordinator_service.log.precommit_metadata import DataFileEntry, PreCommitMetadata
from coordinator_service.runtime import migrate
from tests.fixtures.admin import AdminFactory
from tests.fixtures.coordinator import ORDERS, orders, table_order_ids
from tests.fixtures.postgres import columns_of, new_database, query


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


def require(url: str) -> None:
    engine = create_sync_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            schema.require_current_schema(connection)
    finally:
        engine.dispose()


def test_a_rolling_upgrade_keeps_the_replaced_release_ready_and_rolls_back(
    database_url: str, postgres_url: str
) -> None:
    """On-call review: readiness demanded the exact revision, so once the pre-upgrade hook migrated, every old pod
    turned unready before a new one was ready. A release stays ready on a newer schema that declares its code
    compatible (expand-then-contract), and `migrate --to` rolls the schema back for the release before."""
    url = normalize_url(database_url)
    migrate(url, "0006")
    query(database_url, "INSERT INTO sinks (name, table_identifier, catalog) VALUES ('orders', 'db.orders', 'default')")
    with pytest.raises(SchemaNotCurrent, match="older than this release"):
        require(database_url)

    assert migrate(url) == schema.head_revision()
    assert query(database_url, "SELECT oldest_compatible_code FROM schema_compatibility") == [("0006",)]
    require(database_url)

    # The next release's expanding migration ran: this release's pods stay ready beside it.
    query(database_url, "UPDATE alembic_version SET version_num = '0099'")
    query(database_url, "UPDATE schema_compatibility SET oldest_compatible_code = %s", schema.head_revision())
    require(database_url)
    # A contracting one would not leave them serving code that no longer fits.
    query(database_url, "UPDATE schema_compatibility SET oldest_compatible_code = '0099'")
    with pytest.raises(SchemaNotCurrent, match="not compatible with it"):
        require(database_url)
    query(database_url, "UPDATE alembic_version SET version_num = %s", schema.head_revision())

    # Rolled back for the release before (its head 0006): its schema exactly, the sink still there.
    assert migrate(url, "0006") == "0006"
    with new_database(postgres_url) as fresh:
        migrate(normalize_url(fresh), "0006")
        assert columns_of(database_url) == columns_of(fresh)
    assert query(database_url, "SELECT name FROM sinks") == [("orders",)]


# Targets `migrate --to` refuses: alembic took some of them as something else (an empty one failed inside alembic with
# a bare AssertionError, -1 rolled the schema back a step, base answered the current revision as if it had gone there).
UNKNOWN_TARGETS = ("", " ", "9999", "0000", "-1", "+1", "base", "heads", "0011; DROP TABLE sinks", "0011\x00", "١٢")


def test_a_revision_this_release_does_not_know_is_refused_with_nothing_changed(database_url: str) -> None:
    url = normalize_url(database_url)
    migrate(url)
    for target in UNKNOWN_TARGETS:
        with pytest.raises(ValueError, match="this release knows no schema revision"):
            migrate(url, target)
        assert query(database_url, "SELECT version_num FROM alembic_version") == [(schema.head_revision(),)], target


def test_a_migration_never_queues_behind_a_serving_pods_transaction_for_long(database_url: str) -> None:
    """0003 rewrote whole tables while old pods served: a migration waiting for a lock queues every later statement
    of theirs behind it. Each migration gives up after MIGRATION_LOCK_TIMEOUT_SECONDS instead."""
    url = normalize_url(database_url)
    migrate(url, "0006")
    with psycopg.connect(libpq_url(database_url)) as serving:  # a transaction of an old pod, open
        serving.execute("SELECT count(*) FROM sinks")
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"):
            migrate(url, "head", lock_timeout_seconds=0.5)
        assert time.monotonic() - started < 5
    assert migrate(url) == schema.head_revision()


def test_a_migration_that_gave_up_on_a_lock_is_tried_again_until_the_serving_transaction_ends(
    database_url: str,
) -> None:
    """A migration that meets a serving pod's transaction gives up after MIGRATION_LOCK_TIMEOUT_SECONDS (above), or is
    the victim of a deadlock with it (0014's foreign key against a pod locking a sink and then writing its files):
    the whole run is rolled back, and `migrate` tries it again from the start for MIGRATION_RETRY_SECONDS, instead of
    failing the upgrade's hook on a moment's contention."""
    url = normalize_url(database_url)
    migrate(url, "0006")
    serving = psycopg.connect(libpq_url(database_url))
    serving.execute("SELECT count(*) FROM sinks")  # an old pod's transaction, open for a while
    ended = threading.Timer(1.5, serving.commit)
    ended.start()
    try:
        started = time.monotonic()
        assert migrate(url, "head", lock_timeout_seconds=0.3, retry_seconds=30) == schema.head_revision()
        assert time.monotonic() - started >= 1.0, "the migration did not wait for the serving transaction"
    finally:
        ended.join()
        serving.close()


def test_the_key_index_migration_only_adds_its_tables_and_rolls_back(database_url: str) -> None:
    """0015 adds the key index's three tables and changes nothing else (code at 0014 runs on it); rolled back to 0014
    the schema is 0014's exactly and the sinks stay; dropping an index's row takes its files with it."""
    url = normalize_url(database_url)
    migrate(url, "0014")
    query(database_url, "INSERT INTO sinks (name, table_identifier, catalog) VALUES ('orders', 'db.orders', 'default')")
    before = columns_of(database_url)

    assert migrate(url, "0015") == "0015"
    after = columns_of(database_url)
    assert set(after) - set(before) == {"key_index", "key_index_files", "key_index_tables"}
    assert {table: after[table] for table in before} == before
    assert query(database_url, "SELECT oldest_compatible_code FROM schema_compatibility") == [("0006",)]
    [(index_id,)] = query(
        database_url,
        "INSERT INTO key_index_tables (table_uuid, table_identifier, key_columns, key_types) "
        "VALUES (gen_random_uuid(), 'db.orders', '{id}', '{long}') RETURNING index_id",
    )
    query(
        database_url,
        "INSERT INTO key_index_files (index_id, file_id, path, spec_id, schema_id, data_file) "
        "VALUES (%s, 1, 'file:///a.parquet', 0, 0, '\\x00')",
        index_id,
    )
    place = "INSERT INTO key_index (index_id, file_row, key) VALUES (%s, 4294967296, %s)"
    query(database_url, place, index_id, b"\x01")
    with pytest.raises(psycopg.errors.UniqueViolation):  # one row at a place
        query(database_url, place, index_id, b"\x02")
    query(database_url, "DELETE FROM key_index_tables")
    assert query(database_url, "SELECT count(*) FROM key_index_files") == [(0,)]

    assert migrate(url, "0014") == "0014"
    assert columns_of(database_url) == before
    assert query(database_url, "SELECT name FROM sinks") == [("orders",)]
    assert migrate(url) == schema.head_revision()
