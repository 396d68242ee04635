"""Splitting rows so that every data file lies in exactly one Iceberg partition.

The coordinator reads a file's partition from its Parquet min/max statistics
(it never reads the data), so a file is only valid when the transform gives the
same value for every row in it, nulls in files of their own. The writer groups
each task's rows by the transformed values of the partition fields before it
writes them.

The partition fields use the coordinator's syntax (`region`, `day(ts)`,
`truncate(4, name)`, ...), parsed by the coordinator's own parser so that both
sides read them alike; it refuses `bucket(N, col)`, since a hash does not
preserve order and min/max statistics cannot tell a file's bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.transforms import IdentityTransform, TimeTransform, Transform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from coordinator_service.errors import InvalidArgument
from coordinator_service.iceberg import parse_partition_field

PartitionKey = tuple[Any, ...]


@dataclass(frozen=True)
class PartitionField:
    """One field of the partition spec: a top-level source column and its transform."""

    source: str
    transform: Transform[Any, Any]
    source_type: IcebergType


def iceberg_type_of(arrow_type: pa.DataType) -> IcebergType | None:
    """The Iceberg type of a primitive Arrow column as the coordinator creates it; None for nested types."""
    if pa.types.is_timestamp(arrow_type):
        return TimestamptzType() if arrow_type.tz is not None else TimestampType()
    if isinstance(arrow_type, pa.Decimal128Type):
        return DecimalType(arrow_type.precision, arrow_type.scale)
    simple: list[tuple[Callable[[pa.DataType], bool], IcebergType]] = [
        (pa.types.is_boolean, BooleanType()),
        (lambda t: pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t), IntegerType()),
        (pa.types.is_int64, LongType()),
        (pa.types.is_float32, FloatType()),
        (pa.types.is_float64, DoubleType()),
        (pa.types.is_date32, DateType()),
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), StringType()),
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), BinaryType()),
    ]
    return next((iceberg for matches, iceberg in simple if matches(arrow_type)), None)


def parse_partition_fields(partition_by: Sequence[str], schema: pa.Schema) -> tuple[PartitionField, ...]:
    """Parse and check the partition fields against the data's schema; raise ValueError saying what to change."""
    fields = []
    for text in partition_by:
        try:
            source, transform = parse_partition_field(text)
        except InvalidArgument as error:
            raise ValueError(str(error)) from None
        if source not in schema.names:
            raise ValueError(f"partition field {text!r}: no top-level column {source!r} in {schema.names}")
        source_type = iceberg_type_of(schema.field(source).type)
        if source_type is None or not transform.can_transform(source_type):
            raise ValueError(
                f"partition field {text!r}: {transform} cannot apply to column {source!r} of type "
                f"{schema.field(source).type}"
            )
        fields.append(PartitionField(source, transform, source_type))
    return tuple(fields)


def _internal_values(column: pa.Array) -> pa.Array:
    """Values as Iceberg transforms take them: timestamps as microseconds, dates as days since the epoch."""
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    if pa.types.is_date32(column.type):
        return column.cast(pa.int32())
    return column


def partition_values(column: pa.Array, field: PartitionField) -> pa.Array:
    """The transformed value of every row; the transform runs once per distinct source value."""
    if isinstance(field.transform, IdentityTransform):
        return column
    internal = _internal_values(column)
    encoded = internal.dictionary_encode()
    apply = field.transform.transform(field.source_type)
    result_type = pa.int32() if isinstance(field.transform, TimeTransform) else internal.type
    transformed = pa.array([apply(value) for value in encoded.dictionary.to_pylist()], type=result_type)
    return transformed.take(encoded.indices)


def split_by_partition(table: pa.Table, fields: Sequence[PartitionField]) -> Iterator[tuple[PartitionKey, pa.Table]]:
    """The rows of `table` grouped by their partition (transformed values of every field), with the group's key."""
    if not fields:
        yield (), table
        return
    table = table.combine_chunks()
    key_names = [f"p{index}" for index in range(len(fields))]
    keys = pa.table(
        {
            **{
                name: partition_values(table.column(field.source).combine_chunks(), field)
                for name, field in zip(key_names, fields, strict=True)
            },
            "row": pa.array(range(table.num_rows), type=pa.int64()),
        }
    )
    groups = keys.group_by(key_names, use_threads=False).aggregate([("row", "list")])
    for key, rows in zip(groups.select(key_names).to_pylist(), groups.column("row_list"), strict=True):
        yield tuple(key.values()), table.take(rows.values)
