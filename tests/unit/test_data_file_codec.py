"""A data file's manifest description as bytes and back (coordinator_service.tables.data_file_codec): every field the
manifest entry has comes back, under partition types that a schema evolution widened since."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField, StringType

from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables.data_file_codec import DataFileDecoder, DescriptionOutdated, encode_data_file
from tests.fixtures.key_index import described

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "bucket", IntegerType(), required=False),
    NestedField(3, "weight", FloatType(), required=False),
    NestedField(4, "region", StringType(), required=False),
    identifier_field_ids=[1],
)
SPEC = PartitionSpec(
    PartitionField(2, 1000, IdentityTransform(), "bucket"),
    PartitionField(3, 1001, IdentityTransform(), "weight"),
    PartitionField(4, 1002, IdentityTransform(), "region"),
)


def test_a_data_file_comes_back_whole_even_after_its_partition_columns_were_widened(tmp_path: Path) -> None:
    catalog = SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=SPEC, properties={"format-version": "2"})
    arrow = table.schema().as_arrow()
    table.append(
        pa.Table.from_pylist(
            [
                {"id": 1, "bucket": 7, "weight": 1.5, "region": "eu"},
                {"id": 2, "bucket": None, "weight": 2.25, "region": "us"},
            ],
            arrow,
        )
    )
    table = catalog.load_table("db.t")
    files = cp.live_files(table).data
    encoded = {data_file.file_path: encode_data_file(table.metadata, data_file) for data_file in files}
    schema_id = table.metadata.current_schema_id

    with table.update_schema() as update:  # a float of 4 bytes, an int of a 4-byte zigzag, widened
        update.update_column("bucket", LongType())
        update.update_column("weight", DoubleType())
    table = catalog.load_table("db.t")
    assert table.metadata.current_schema_id != schema_id

    decoder = DataFileDecoder(table.metadata)  # one for every file, its readers resolved once per (spec, schema)
    for data_file in files:
        decoded = decoder.decode(encoded[data_file.file_path], data_file.spec_id, schema_id)
        assert described(decoded) == described(data_file)
        again = encode_data_file(table.metadata, decoded)  # under the widened types now
        assert described(decoder.decode(again, 0, table.metadata.current_schema_id)) == described(data_file)
        assert described(decoder.decode(encoded[data_file.file_path], data_file.spec_id, schema_id)) == described(
            data_file
        )
    with pytest.raises(DescriptionOutdated, match="no schema 9"):
        decoder.decode(encoded[files[0].file_path], 0, 9)
