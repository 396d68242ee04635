"""Partitioned tables, schema evolution and a catalog outage, through the real coordinator."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from sqlalchemy.engine import make_url

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.log.embedded import start_embedded_postgres, stop_embedded_postgres
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet

SCHEMA = ORDERS.serialize().to_pybytes()


def test_partitioned_table_gets_partition_values_from_the_files(
    coordinator: CoordinatorProcess, catalog: Catalog
) -> None:
    with coordinator.client(retry_seconds=0) as client:
        writer = client.register_writer("parts", "shop.by_customer", -1, arrow_schema=SCHEMA, partition_by=["customer"])
        rows = orders(0, 70)
        paths = [
            write_parquet(writer.table_location, [row for row in rows if row["customer"] == customer])
            for customer in sorted({str(row["customer"]) for row in rows})
        ]
        mixed = write_parquet(writer.table_location, orders(100, 5))
        with pytest.raises(CoordinatorRpcError) as raised:
            client.pre_commit("parts", 0, writer.writer_term, [mixed])
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "one partition" in raised.value.message
        client.pre_commit("parts", 0, writer.writer_term, paths)
        client.commit_checkpoint("parts", 0, writer.writer_term, wait=True)
    table = catalog.load_table("shop.by_customer")
    assert [field.name for field in table.spec().fields] == ["customer"]
    assert table_order_ids(table) == list(range(70))
    scan = table.scan(row_filter="customer == 'c3'")
    assert len(list(scan.plan_files())) == 1, "partition pruning needs the partition values in the manifest"
    assert sorted(scan.to_arrow().column("order_id").to_pylist()) == [i for i in range(70) if i % 7 == 3]


def test_new_columns_evolve_the_table(coordinator: CoordinatorProcess, catalog: Catalog) -> None:
    wider = ORDERS.append(pa.field("coupon", pa.string()))
    with coordinator.client() as client:
        writer = client.register_writer("evolving", "shop.evolving", -1, arrow_schema=SCHEMA)
        client.pre_commit("evolving", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 3))])
        new_rows = [{**row, "coupon": "SPRING"} for row in orders(3, 3)]
        client.pre_commit(
            "evolving",
            1,
            writer.writer_term,
            [write_parquet(writer.table_location, new_rows, wider)],
            evolve_schema=True,
        )
        client.commit_checkpoint("evolving", 1, writer.writer_term, wait=True)
    table = catalog.load_table("shop.evolving")
    assert "coupon" in table.schema().column_names
    result = table.scan().to_arrow().sort_by("order_id")
    assert result.column("coupon").to_pylist() == [None, None, None, "SPRING", "SPRING", "SPRING"]


def test_catalog_outage_is_retried_until_it_ends(
    coordinator_factory: Callable[..., CoordinatorProcess], tmp_path: Path
) -> None:
    """The catalog (here a SQL catalog in its own PostgreSQL) goes away: commits retry visibly, then land."""
    pgdata = Path(tempfile.mkdtemp(prefix="sink-coordinator-catalog-")) / "data"
    catalog_url = start_embedded_postgres(pgdata)
    warehouse = tmp_path / "lake"
    warehouse.mkdir()
    process = coordinator_factory(
        SINK_COORDINATOR_CATALOG__TYPE="sql",
        SINK_COORDINATOR_CATALOG__URI=catalog_url,
        SINK_COORDINATOR_CATALOG__WAREHOUSE=warehouse.as_uri(),
    )
    try:
        with process.client(retry_seconds=0) as client:
            writer = client.register_writer("outage", "shop.outage", -1, arrow_schema=SCHEMA)
            client.pre_commit("outage", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 10))])
            stop_embedded_postgres(pgdata)
            client.commit_checkpoint("outage", 0, writer.writer_term)
            process.wait_for_log("commit failed; retrying", sink="outage")
            # The log does not wait for the catalog: an empty epoch is persisted (and checkpointed) meanwhile.
            assert client.pre_commit("outage", 1, writer.writer_term, []).outcome is PreCommitOutcome.PERSISTED
            client.commit_checkpoint("outage", 1, writer.writer_term)
            assert make_url(start_embedded_postgres(pgdata)) == make_url(catalog_url)
            process.wait_for_log("epochs committed", sink="outage", epochs=[0, 1])  # one snapshot, once it is back
        lake = load_catalog("default", type="sql", uri=catalog_url, warehouse=warehouse.as_uri())
        assert table_order_ids(lake.load_table("shop.outage")) == list(range(10))
    finally:
        process.stop()
        stop_embedded_postgres(pgdata)
