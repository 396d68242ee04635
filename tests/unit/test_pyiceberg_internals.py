"""Each use of pyiceberg's private API (coordinator_service.tables.pyiceberg_internals) against the installed
pyiceberg: an upgrade that moves or changes one fails here, by name. The table is a real one, in a SQL catalog on
SQLite in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from coordinator_service.tables import pyiceberg_internals as internals

SCHEMA = Schema(
    NestedField(1, "order_id", LongType(), required=True),
    NestedField(2, "country", StringType(), required=False),
)
ROWS = pa.Table.from_pylist(
    [{"order_id": n, "country": "DE" if n % 2 else "FR"} for n in range(10)],
    schema=pa.schema([pa.field("order_id", pa.int64(), nullable=False), pa.field("country", pa.string())]),
)


@pytest.fixture
def table(tmp_path: Path) -> Iterator[Table]:
    catalog = SqlCatalog("internals", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "country"))
    yield catalog.create_table("db.orders", schema=SCHEMA, partition_spec=spec)
    catalog.engine.dispose()


def test_check_file_schema_takes_a_fitting_file_and_refuses_a_nullable_required_column() -> None:
    internals.check_file_schema(SCHEMA, ROWS.schema, format_version=2)
    nullable = pa.schema([pa.field("order_id", pa.int64()), pa.field("country", pa.string())])
    with pytest.raises(ValueError, match="order_id"):
        internals.check_file_schema(SCHEMA, nullable, format_version=2)


def test_evolved_schema_applies_in_memory_and_commits_nothing(table: Table) -> None:
    wider = pa.schema([*ROWS.schema, pa.field("coupon", pa.string())])
    evolved = internals.evolved_schema(table.update_schema().union_by_name(wider))
    assert evolved.column_names == ["order_id", "country", "coupon"]
    assert table.refresh().schema().column_names == ["order_id", "country"]


def test_partition_values_are_the_records_values_in_order() -> None:
    assert internals.partition_values(Record("DE", 7)) == ("DE", 7)


def test_file_info_tells_size_and_modification_time_in_one_request(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(ROWS, path)
    info = internals.file_info(PyArrowFileIO().new_input(f"file://{path}"))  # type: ignore[arg-type]
    assert info.size == path.stat().st_size
    assert info.mtime_ns == path.stat().st_mtime_ns


def test_data_files_of_writes_files_nothing_references_and_replace_files_swaps_them(table: Table) -> None:
    table.append(ROWS)
    table = table.refresh()
    before = {task.file.file_path for task in table.scan().plan_files()}

    written = list(internals.data_files_of(table.metadata, ROWS, table.io))

    assert {data_file.partition[0] for data_file in written} == {"DE", "FR"}
    assert sum(data_file.record_count for data_file in written) == 10
    assert {task.file.file_path for task in table.refresh().scan().plan_files()} == before

    replaced = [task.file for task in table.scan().plan_files()]
    committed = internals.replace_files(table, replaced, written, {"marker": "test"})

    snapshot = committed.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary["marker"] == "test"
    assert {task.file.file_path for task in committed.scan().plan_files()} == {f.file_path for f in written}
    assert sorted(committed.scan().to_arrow().column("order_id").to_pylist()) == list(range(10))
