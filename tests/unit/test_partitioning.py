"""Grouping rows by Iceberg partition on the executors, and refusing partition fields the writer cannot honour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IcebergType

from coordinator_service.tables.table_creation import parse_partition_field
from spark_writer.sink.partitioning import parse_partition_fields, partition_values, split_by_partition

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("region", pa.string()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("tags", pa.list_(pa.string())),
    ]
)


def rows(*values: tuple[int, str | None, datetime]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "region": region, "ts": ts, "tags": []} for i, region, ts in values], schema=SCHEMA
    )


def day(n: int, hour: int = 0) -> datetime:
    return datetime(2025, 3, n, hour, tzinfo=UTC)


def groups(table: pa.Table, *partition_by: str) -> dict[tuple[object, ...], list[int]]:
    fields = parse_partition_fields(partition_by, table.schema)
    return {key: part.column("id").to_pylist() for key, part in split_by_partition(table, fields)}


def test_unpartitioned_is_one_group() -> None:
    table = rows((1, "eu", day(1)), (2, "us", day(2)))
    assert groups(table) == {(): [1, 2]}


def test_identity_and_day_group_independently_with_nulls_apart() -> None:
    table = rows(
        (1, "eu", day(1, 1)), (2, "us", day(1, 2)), (3, "eu", day(1, 23)), (4, "eu", day(2)), (5, None, day(2))
    )
    first_day = (day(1) - datetime(1970, 1, 1, tzinfo=UTC)).days
    assert groups(table, "region", "day(ts)") == {
        ("eu", first_day): [1, 3],
        ("us", first_day): [2],
        ("eu", first_day + 1): [4],
        (None, first_day + 1): [5],
    }


def test_truncate_groups_by_prefix() -> None:
    table = rows((1, "europe-west", day(1)), (2, "europe-north", day(1)), (3, "us-east", day(1)))
    assert groups(table, "truncate(3, region)") == {("eur",): [1, 2], ("us-",): [3]}


@pytest.mark.parametrize(
    ("partition_by", "message"),
    [
        ("bucket(16, id)", "bucket partitioning is not supported"),
        ("country", "no top-level column 'country'"),
        ("day(id)", "cannot apply to column 'id'"),
        ("tags", "cannot apply to column 'tags'"),
        ("month(ts, 2)", "is not understood"),
    ],
)
def test_partition_fields_the_writer_cannot_honour_are_refused(partition_by: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_partition_fields([partition_by], SCHEMA)


# Every transform on every kind of column it applies to, as the coordinator creates the table's columns.
ARROW_TYPES = [
    pa.bool_(),
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.decimal128(12, 3),
    pa.decimal128(38, 0),
    pa.date32(),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("us"),
    pa.timestamp("ms", tz="UTC"),
    pa.string(),
    pa.large_string(),
    pa.binary(),
]
FIELDS = ["identity(c)", "year(c)", "month(c)", "day(c)", "hour(c)", "truncate(1, c)", "truncate(7, c)"]


def iceberg_column(arrow_type: pa.DataType) -> IcebergType:
    """The column's type in a table the coordinator creates from this Arrow schema."""
    schema = Catalog._convert_schema_if_needed(pa.schema([pa.field("c", arrow_type)]))
    return schema.find_field("c").field_type


@pytest.mark.parametrize("arrow_type", ARROW_TYPES, ids=str)
@pytest.mark.parametrize("text", FIELDS)
def test_the_writer_applies_a_transform_where_iceberg_does(arrow_type: pa.DataType, text: str) -> None:
    schema = pa.schema([pa.field("c", arrow_type)])
    _, transform = parse_partition_field(text)
    if transform.can_transform(iceberg_column(arrow_type)):
        parse_partition_fields([text], schema)
    else:
        with pytest.raises(ValueError, match="cannot apply to column 'c'"):
            parse_partition_fields([text], schema)


def arrow_values(arrow_type: pa.DataType) -> st.SearchStrategy[list[object]]:
    """Values of the type across its range (timestamps and dates from year 1 to 9999, before the epoch too)."""
    if pa.types.is_integer(arrow_type):
        bits = arrow_type.bit_width
        # A long within a width of its smallest value truncates to one that no long holds, in Iceberg too.
        smallest = -(2**63) + 2**31 if bits == 64 else -(2 ** (bits - 1))
        values: st.SearchStrategy[object] = st.integers(smallest, 2 ** (bits - 1) - 1)
    elif pa.types.is_decimal(arrow_type):
        whole_digits = arrow_type.precision - arrow_type.scale
        values = st.decimals(
            # Likewise for a decimal of the largest precision (38).
            min_value=-(10**whole_digits) + (10**10 if arrow_type.precision == 38 else 1),
            max_value=10**whole_digits - 1,
            places=arrow_type.scale,
            allow_nan=False,
            allow_infinity=False,
        )
    elif pa.types.is_date(arrow_type):
        values = st.dates()
    elif pa.types.is_timestamp(arrow_type):
        values = st.datetimes(timezones=st.just(UTC) if arrow_type.tz else st.none())
    elif pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        values = st.text(max_size=12)
    elif pa.types.is_binary(arrow_type):
        values = st.binary(max_size=12)
    elif pa.types.is_boolean(arrow_type):
        values = st.booleans()
    else:
        values = st.floats(width=arrow_type.bit_width, allow_nan=False)
    return st.lists(st.one_of(st.none(), values), min_size=1, max_size=30)


def iceberg_source_value(value: object) -> object:
    """A Python value as pyiceberg's transforms take it (timestamps as microseconds since the epoch)."""
    if isinstance(value, datetime):
        epoch = datetime(1970, 1, 1, tzinfo=value.tzinfo)
        return (value - epoch) // timedelta(microseconds=1)
    return value


@pytest.mark.parametrize("arrow_type", ARROW_TYPES, ids=str)
@pytest.mark.parametrize("text", FIELDS)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_the_writers_transforms_are_icebergs(arrow_type: pa.DataType, text: str, data: st.DataObject) -> None:
    source, transform = parse_partition_field(text)
    iceberg_type = iceberg_column(arrow_type)
    if not transform.can_transform(iceberg_type):
        return
    (field,) = parse_partition_fields([text], pa.schema([pa.field(source, arrow_type)]))
    values = data.draw(arrow_values(arrow_type))
    column = pa.array(values, type=arrow_type)
    if isinstance(transform, IdentityTransform):
        expected = column.to_pylist()  # the value itself, whatever its Python form
    else:
        apply = transform.transform(iceberg_type)
        expected = [apply(iceberg_source_value(value)) for value in column.to_pylist()]
    assert partition_values(column, field).to_pylist() == expected
