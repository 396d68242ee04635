"""Splitting rows so that every data file lies in exactly one Iceberg partition.

The coordinator reads a file's partition from its Parquet min/max statistics
(it never reads the data), so a file is only valid when the transform gives the
same value for every row in it, nulls in files of their own. The writer groups
each task's rows by the transformed values of the partition fields before it
writes them.

The partition fields use the coordinator's syntax (`region`, `day(ts)`,
`truncate(4, name)`, ...), parsed by the coordinator's own parser
(coordinator_service.contract.partition_syntax) so that both sides read them alike; it
refuses `bucket(N, col)`, since a hash does not preserve order and min/max
statistics cannot tell a file's bucket. The transforms are Iceberg's, written
here without pyiceberg (executors do not install the coordinator's
dependencies); tests/unit/test_partitioning.py checks them against pyiceberg's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final

import pyarrow as pa

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.partition_syntax import TIME_TRANSFORMS, PartitionFieldSpec, parse_partition_field

PartitionKey = tuple[Any, ...]

_EPOCH_DATE: Final = date(1970, 1, 1)
_EPOCH_TIMESTAMP: Final = datetime(1970, 1, 1)
_MICROS_PER_DAY: Final = 86_400_000_000
_MICROS_PER_HOUR: Final = 3_600_000_000
_MAX_DECIMAL_PRECISION: Final = 38


class ValueKind(StrEnum):
    """What Iceberg type a primitive Arrow column becomes, as far as partition transforms care."""

    BOOLEAN = "boolean"
    INTEGER = "integer"  # Iceberg int and long
    FLOATING = "floating"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"  # with or without a zone
    STRING = "string"
    BINARY = "binary"


# Which kinds of source column each transform applies to (Iceberg's rules, as pyiceberg's can_transform).
_APPLIES_TO: Final[dict[str, frozenset[ValueKind]]] = {
    "identity": frozenset(ValueKind),
    "year": frozenset({ValueKind.DATE, ValueKind.TIMESTAMP}),
    "month": frozenset({ValueKind.DATE, ValueKind.TIMESTAMP}),
    "day": frozenset({ValueKind.DATE, ValueKind.TIMESTAMP}),
    "hour": frozenset({ValueKind.TIMESTAMP}),
    "truncate": frozenset({ValueKind.INTEGER, ValueKind.DECIMAL, ValueKind.STRING, ValueKind.BINARY}),
}


@dataclass(frozen=True)
class PartitionField:
    """One field of the partition spec: a top-level source column, its transform and the column's kind."""

    spec: PartitionFieldSpec
    kind: ValueKind

    @property
    def source(self) -> str:
        return self.spec.source


def value_kind_of(arrow_type: pa.DataType) -> ValueKind | None:
    """The kind of a primitive Arrow column as the coordinator creates its Iceberg column; None for the rest."""
    if pa.types.is_timestamp(arrow_type):
        return ValueKind.TIMESTAMP
    if isinstance(arrow_type, pa.Decimal128Type):
        return ValueKind.DECIMAL
    simple: list[tuple[Callable[[pa.DataType], bool], ValueKind]] = [
        (pa.types.is_boolean, ValueKind.BOOLEAN),
        (lambda t: pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t), ValueKind.INTEGER),
        (pa.types.is_int64, ValueKind.INTEGER),
        (lambda t: pa.types.is_float32(t) or pa.types.is_float64(t), ValueKind.FLOATING),
        (pa.types.is_date32, ValueKind.DATE),
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), ValueKind.STRING),
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), ValueKind.BINARY),
    ]
    return next((kind for matches, kind in simple if matches(arrow_type)), None)


def parse_partition_specs(partition_by: Sequence[str]) -> tuple[PartitionFieldSpec, ...]:
    """Parse the partition fields (no schema needed: before Spark starts); raise ValueError saying how to write one."""
    try:
        return tuple(parse_partition_field(text) for text in partition_by)
    except InvalidArgument as error:
        raise ValueError(str(error)) from None


def parse_partition_fields(partition_by: Sequence[str], schema: pa.Schema) -> tuple[PartitionField, ...]:
    """Parse and check the partition fields against the data's schema; raise ValueError saying what to change."""
    fields = []
    for text, spec in zip(partition_by, parse_partition_specs(partition_by), strict=True):
        if spec.source not in schema.names:
            raise ValueError(f"partition field {text!r}: no top-level column {spec.source!r} in {schema.names}")
        kind = value_kind_of(schema.field(spec.source).type)
        if kind is None or kind not in _APPLIES_TO[spec.transform]:
            raise ValueError(
                f"partition field {text!r}: {spec} cannot apply to column {spec.source!r} of type "
                f"{schema.field(spec.source).type}"
            )
        fields.append(PartitionField(spec, kind))
    return tuple(fields)


def _truncate_decimal(value: Decimal, width: int) -> Decimal:
    """Iceberg's truncate of a decimal: on its unscaled value, keeping its scale."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), f"decimal {value} is not finite"
    unscaled = int(Decimal((sign, digits, 0)))
    truncated_sign, truncated_digits, _ = Decimal(unscaled - unscaled % width).as_tuple()
    return Decimal((truncated_sign, truncated_digits, exponent))


def _date_of(days: int) -> date:
    return _EPOCH_DATE + timedelta(days=days)


def _timestamp_of(micros: int) -> datetime:
    return _EPOCH_TIMESTAMP + timedelta(microseconds=micros)


def _years(moment: date) -> int:
    return moment.year - _EPOCH_DATE.year


def _months(moment: date) -> int:
    return (moment.year - _EPOCH_DATE.year) * 12 + moment.month - 1


_DATE_TRANSFORMS: Final[dict[str, Callable[[int], int]]] = {
    "year": lambda days: _years(_date_of(days)),
    "month": lambda days: _months(_date_of(days)),
    "day": lambda days: days,
}
_TIMESTAMP_TRANSFORMS: Final[dict[str, Callable[[int], int]]] = {
    "year": lambda micros: _years(_timestamp_of(micros)),
    "month": lambda micros: _months(_timestamp_of(micros)),
    "day": lambda micros: micros // _MICROS_PER_DAY,
    "hour": lambda micros: micros // _MICROS_PER_HOUR,
}


def transform_function(field: PartitionField) -> Callable[[Any], Any]:
    """Iceberg's transform of one non-null source value, as _internal_values gives it (dates as days and
    timestamps as microseconds since the epoch)."""
    spec, kind = field.spec, field.kind
    if spec.transform == "identity":
        return lambda value: value
    if spec.transform == "truncate":
        width = int(str(spec.width))
        if kind is ValueKind.INTEGER:
            return lambda value: value - value % width
        if kind is ValueKind.DECIMAL:
            return lambda value: _truncate_decimal(value, width)
        return lambda value: value[:width]
    return (_DATE_TRANSFORMS if kind is ValueKind.DATE else _TIMESTAMP_TRANSFORMS)[spec.transform]


def _internal_values(column: pa.Array) -> pa.Array:
    """Values as Iceberg transforms take them: timestamps as microseconds, dates as days since the epoch."""
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    if pa.types.is_date32(column.type):
        return column.cast(pa.int32())
    return column


def _result_type(field: PartitionField, internal: pa.DataType) -> pa.DataType:
    """Time transforms give ints; truncate keeps the type, but a number's may fall below the smallest value of
    a narrow type (truncate(7) of -127 is -133), so integers are truncated as longs and decimals at the
    largest precision Iceberg has."""
    if field.spec.transform in TIME_TRANSFORMS:
        return pa.int32()
    if field.kind is ValueKind.INTEGER:
        return pa.int64()
    if field.kind is ValueKind.DECIMAL:
        return pa.decimal128(_MAX_DECIMAL_PRECISION, internal.scale)
    return internal


def partition_values(column: pa.Array, field: PartitionField) -> pa.Array:
    """The transformed value of every row; the transform runs once per distinct source value."""
    if field.spec.transform == "identity":
        return column
    internal = _internal_values(column)
    encoded = internal.dictionary_encode()
    apply = transform_function(field)
    result_type = _result_type(field, internal.type)
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
