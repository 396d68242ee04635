"""The coordinator's pyiceberg transaction computes the metadata it stands for once per change."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from coordinator_service.tables.iceberg import MetadataOnceTransaction


def test_the_metadata_is_computed_again_only_when_the_transaction_changes(tmp_path: Path) -> None:
    catalog = SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.orders", pa.schema([pa.field("order_id", pa.int64())]))
    transaction = MetadataOnceTransaction(table)

    first = transaction.table_metadata
    assert transaction.table_metadata is first, "read twice without a change: computed twice"

    transaction.set_properties({"owner": "orders-team"})
    changed = transaction.table_metadata
    assert changed is not first
    assert changed.properties["owner"] == "orders-team"
    assert transaction.table_metadata is changed

    committed = transaction.commit_transaction()
    assert committed.properties["owner"] == "orders-team"
    assert catalog.load_table("db.orders").properties["owner"] == "orders-team"
