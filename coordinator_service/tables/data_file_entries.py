"""A data file's entry from its Parquet footer and back: the table's rules for files (schema, partition spec, name
mapping), kept per table version, and the manifest entry the log's record becomes at commit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pyiceberg.conversions import from_bytes
from pyiceberg.io.pyarrow import (
    StatisticsCollector,
    compute_statistics_plan,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import PrimitiveType, StructType

from coordinator_service.log.precommit_metadata import DataFileEntry


def primitive(field_type: object) -> PrimitiveType:
    assert isinstance(field_type, PrimitiveType), f"partition field of type {field_type} is not primitive"
    return field_type


def entry_data_file(metadata: TableMetadata, entry: DataFileEntry) -> DataFile:
    spec = metadata.specs()[entry.spec_id]
    partition_type = spec.partition_type(metadata.schema())
    partition = Record(
        *(
            None if value is None else from_bytes(primitive(field.field_type), value)
            for field, value in zip(partition_type.fields, entry.partition, strict=True)
        )
    )
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=entry.path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=entry.record_count,
        file_size_in_bytes=entry.file_size_in_bytes,
        column_sizes=entry.column_sizes,
        value_counts=entry.value_counts,
        null_value_counts=entry.null_value_counts,
        nan_value_counts=entry.nan_value_counts,
        lower_bounds=entry.lower_bounds,
        upper_bounds=entry.upper_bounds,
        split_offsets=None if entry.split_offsets is None else list(entry.split_offsets),
        sort_order_id=None,
        spec_id=entry.spec_id,
        equality_ids=None,
        key_metadata=None,
    )
    data_file.spec_id = entry.spec_id  # not a field of the manifest entry: from_args drops it
    return data_file


# A table's schema, spec, format version and properties: what describing one of its files depends on.
RulesKey = tuple[uuid.UUID, int, int, int, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class FileRules:
    """How files of one table schema and spec are described: computed once, not per pre-committed file."""

    key: RulesKey
    format_version: TableVersion
    schema: Schema
    spec: PartitionSpec
    partition_type: StructType
    statistics_plan: dict[int, StatisticsCollector]
    column_mapping: dict[str, int]

    @staticmethod
    def key_of(metadata: TableMetadata) -> RulesKey:
        return (
            metadata.table_uuid,
            metadata.current_schema_id,
            metadata.default_spec_id,
            metadata.format_version,
            tuple(sorted(metadata.properties.items())),
        )

    @classmethod
    def of(cls, key: RulesKey, metadata: TableMetadata) -> FileRules:
        schema = metadata.schema()
        spec = metadata.spec()
        return cls(
            key=key,
            format_version=metadata.format_version,
            schema=schema,
            spec=spec,
            partition_type=spec.partition_type(schema),
            statistics_plan=compute_statistics_plan(schema, metadata.properties),
            column_mapping=parquet_path_to_id_mapping(schema),
        )
