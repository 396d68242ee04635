"""Grouping rows by Iceberg partition on the executors, and refusing partition fields the writer cannot honour."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from spark_writer.partitioning import parse_partition_fields, split_by_partition

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
