"""The Iceberg side of the protocol on an in-process catalog (pyiceberg's SQL catalog on SQLite), as pyiceberg
tests its own: tables created and evolved, pre-committed files described, appends with markers, the marker walk,
and the files of aborted attempts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, Marker, SinkIdentity
from coordinator_service.tables.iceberg import IcebergGateway
from tests.fixtures.coordinator import ORDERS, orders, table_order_ids, write_parquet

SINK = SinkIdentity(name="orders-sink", incarnation=str(uuid.uuid4()), generation=0)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri())


@pytest.fixture
def tables(catalog: Catalog) -> IcebergGateway:
    return IcebergGateway(catalog)


def test_a_missing_table_is_created_from_the_writers_schema_and_partitioning(
    tables: IcebergGateway, catalog: Catalog
) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ("truncate(4, customer)",))

    table = catalog.load_table("db.orders")
    assert str(table.location()) == location
    assert table.schema().column_names == ["order_id", "customer", "amount"]
    assert [str(field.transform) for field in table.spec().fields] == ["truncate[4]"]


def test_a_table_that_cannot_be_created_is_refused_before_anything_exists(
    tables: IcebergGateway, catalog: Catalog
) -> None:
    with pytest.raises(InvalidArgument, match="no schema to create it"):
        tables.ensure_table("db.orders", None, ())
    with pytest.raises(InvalidArgument, match="partition columns 'region' are not in arrow_schema"):
        tables.ensure_table("db.orders", ORDERS, ("region",))

    assert catalog.list_namespaces() == []


def test_new_columns_of_the_writers_schema_are_added_and_none_removed(tables: IcebergGateway, catalog: Catalog) -> None:
    tables.ensure_table("db.orders", ORDERS, ())
    tables.ensure_table("db.orders", ORDERS.append(pa.field("coupon", pa.string())), ())
    tables.ensure_table("db.orders", pa.schema([ORDERS.field("order_id")]), ())

    assert catalog.load_table("db.orders").schema().column_names == ["order_id", "customer", "amount", "coupon"]


def test_a_precommitted_file_is_described_from_its_footer(tables: IcebergGateway) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    path = write_parquet(location, orders(100, 10))

    [entry] = tables.read_data_files("db.orders", [path], writer_id=3, evolve_schema=False).entries

    assert (entry.path, entry.writer_id, entry.record_count) == (path, 3, 10)
    assert entry.file_size_in_bytes == Path(path.removeprefix("file://")).stat().st_size
    assert entry.null_value_counts == {1: 0, 2: 0, 3: 0}


def test_files_that_do_not_fit_are_refused_by_name(tables: IcebergGateway, tmp_path: Path) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    outside = write_parquet((tmp_path / "elsewhere").as_uri(), orders(0, 1))
    with pytest.raises(InvalidArgument, match="outside the table's data directory"):
        tables.read_data_files("db.orders", [outside], 0, False)

    wrong_type = pa.schema([pa.field("order_id", pa.string(), nullable=False)])
    misfit = write_parquet(location, [{"order_id": "one"}], schema=wrong_type)
    with pytest.raises(InvalidArgument, match=f"data file '{misfit}' does not fit the schema of the table"):
        tables.read_data_files("db.orders", [misfit], 0, False)


def test_a_file_with_a_new_column_evolves_the_table_only_when_asked(tables: IcebergGateway, catalog: Catalog) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    wider = ORDERS.append(pa.field("coupon", pa.string()))
    path = write_parquet(location, [{**row, "coupon": "x"} for row in orders(0, 2)], schema=wider)

    with pytest.raises(InvalidArgument, match="does not fit"):
        tables.read_data_files("db.orders", [path], 0, evolve_schema=False)
    assert "coupon" not in catalog.load_table("db.orders").schema().column_names

    [entry] = tables.read_data_files("db.orders", [path], 0, evolve_schema=True).entries
    assert entry.record_count == 2
    assert "coupon" in catalog.load_table("db.orders").schema().column_names


def test_appends_carry_the_sinks_markers_and_the_walk_finds_them_oldest_first(
    tables: IcebergGateway, catalog: Catalog
) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    snapshots = []
    for epoch in range(3):
        entries = tables.read_data_files(
            "db.orders", [write_parquet(location, orders(epoch * 10, 10))], 0, False
        ).entries
        snapshots.append(tables.append("db.orders", SINK, epoch, f"commit-{epoch}", entries))

    table = catalog.load_table("db.orders")
    assert table_order_ids(table) == list(range(30))
    assert tables.sink_markers("db.orders", SINK, down_to_epoch=0) == [
        Marker(epoch, snapshot) for epoch, snapshot in enumerate(snapshots)
    ]
    # Back to the first marker below the epoch asked for, and no further.
    assert [marker.epoch for marker in tables.sink_markers("db.orders", SINK, down_to_epoch=2)] == [1, 2]
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert (summary[MARKER_SINK], summary[MARKER_EPOCH]) == (SINK.name, "2")  # type: ignore[index]


def test_the_walk_stops_at_an_earlier_incarnation_of_the_sinks_name(tables: IcebergGateway) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    earlier = SinkIdentity(name=SINK.name, incarnation=str(uuid.uuid4()), generation=0)
    for sink, epoch in ((SINK, 0), (earlier, 5), (SINK, 1)):
        entries = tables.read_data_files(
            "db.orders", [write_parquet(location, orders(epoch * 10, 1))], 0, False
        ).entries
        tables.append("db.orders", sink, epoch, uuid.uuid4().hex, entries)

    assert [marker.epoch for marker in tables.sink_markers("db.orders", SINK, down_to_epoch=0)] == [1]


def test_the_walk_finds_markers_written_before_generations_and_incarnations(
    tables: IcebergGateway, catalog: Catalog
) -> None:
    """A table written by a release before generations and incarnations: its markers carry the sink's name and epoch
    alone, and count as the legacy sink's (generation 0). On the old code the walk raised ValueError (int('None')):
    pyiceberg's Summary answered None, not the default "0", for the missing generation."""
    tables.ensure_table("db.orders", ORDERS, ())
    table = catalog.load_table("db.orders")
    for epoch in range(2):
        table.append(
            pa.Table.from_pylist(orders(epoch * 10, 10), schema=ORDERS),
            {MARKER_SINK: SINK.name, MARKER_EPOCH: str(epoch)},
        )
    legacy = SinkIdentity(SINK.name, SINK.incarnation, 0, legacy_markers=True)
    assert [marker.epoch for marker in tables.sink_markers("db.orders", legacy, down_to_epoch=0)] == [0, 1]
    assert tables.sink_markers("db.orders", SINK, down_to_epoch=0) == []  # not a sink created since


def test_an_append_on_a_stale_table_fails_and_appends_nothing(tables: IcebergGateway, catalog: Catalog) -> None:
    location = tables.ensure_table("db.orders", ORDERS, ())
    stale = catalog.load_table("db.orders")
    first = tables.read_data_files("db.orders", [write_parquet(location, orders(0, 1))], 0, False).entries
    tables.append("db.orders", SINK, 0, "commit-0", first)

    second = tables.read_data_files("db.orders", [write_parquet(location, orders(1, 1))], 0, False).entries
    with pytest.raises(CommitFailedException):
        tables.append("db.orders", SINK, 1, "commit-1", second, table=stale)

    assert table_order_ids(catalog.load_table("db.orders")) == [0]
