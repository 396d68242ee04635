"""A key's bytes in the key index (coordinator_service.tables.key_encoding): equal keys have equal bytes and unequal
keys unequal ones, the bytes are Iceberg's single-value serialization of each value (pyiceberg's to_bytes, the
reference), each delimited value preceded by its length, and they do not depend on the Arrow type the values came
in."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.conversions import to_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FixedType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from coordinator_service.tables.key_encoding import encode_key_values, encode_keys

UTC = datetime.UTC
# Each key type, the values it takes (as key_resolution gives them: Arrow's to_pylist of the column's type), and
# whether its serialization is delimited by a length.
VALUES: dict[str, tuple[PrimitiveType, st.SearchStrategy[Any], bool]] = {
    "boolean": (BooleanType(), st.booleans(), False),
    "int": (IntegerType(), st.integers(-(2**31), 2**31 - 1), False),
    "long": (LongType(), st.integers(-(2**63), 2**63 - 1), False),
    "date": (DateType(), st.dates(), False),
    "time": (TimeType(), st.times(), False),
    "timestamp": (TimestampType(), st.datetimes(), False),
    "timestamptz": (TimestamptzType(), st.datetimes(timezones=st.just(UTC)), False),
    "string": (StringType(), st.text(max_size=200), True),
    "binary": (BinaryType(), st.binary(max_size=200), True),
    "uuid": (UUIDType(), st.uuids(), False),
    "fixed": (FixedType(3), st.binary(min_size=3, max_size=3), False),
    "decimal": (
        DecimalType(12, 3),
        st.decimals(min_value=-(10**9) + 1, max_value=10**9 - 1, places=3, allow_nan=False, allow_infinity=False),
        True,
    ),
}


def schema_of(kinds: Sequence[str]) -> Schema:
    fields = [NestedField(index + 1, f"k{index}", VALUES[kind][0], required=True) for index, kind in enumerate(kinds)]
    return Schema(
        *fields, NestedField(len(kinds) + 1, "value", StringType()), identifier_field_ids=list(range(1, len(kinds) + 1))
    )


def varint(length: int) -> bytes:
    encoded = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(encoded)


def reference(kinds: Sequence[str], key: tuple[Any, ...]) -> bytes:
    """pyiceberg's own single-value serialization of each value, a delimited one after its length."""
    encoded = b""
    for kind, value in zip(kinds, key, strict=True):
        field_type, _, delimited = VALUES[kind]
        serialized = to_bytes(field_type, value)
        encoded += varint(len(serialized)) + serialized if delimited else serialized
    return encoded


@st.composite
def keys_of_one_type(draw: st.DrawFn) -> tuple[list[str], list[tuple[Any, ...]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=4))
    key = st.tuples(*(VALUES[kind][1] for kind in kinds))
    # Few distinct values per column, so that equal keys and keys equal in some columns come up.
    keys = draw(st.lists(key, min_size=1, max_size=8))
    keys += draw(st.lists(st.sampled_from(keys), max_size=4))
    return kinds, keys


@settings(max_examples=300, deadline=None)
@given(case=keys_of_one_type())
def test_equal_keys_have_equal_bytes_and_only_they(case: tuple[list[str], list[tuple[Any, ...]]]) -> None:
    kinds, keys = case
    schema = schema_of(kinds)

    encoded = encode_key_values(keys, schema)

    assert encoded == [reference(kinds, key) for key in keys]
    for first, first_bytes in zip(keys, encoded, strict=True):
        for second, second_bytes in zip(keys, encoded, strict=True):
            assert (first == second) == (first_bytes == second_bytes), (first, second)


@settings(max_examples=100, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20),
    names=st.lists(st.text(max_size=150), min_size=1, max_size=20),
    moments=st.lists(st.integers(-(10**12), 10**12), min_size=1, max_size=20),
)
def test_the_bytes_do_not_depend_on_the_arrow_type_the_values_came_in(
    ids: list[int], names: list[str], moments: list[int]
) -> None:
    count = min(len(ids), len(names), len(moments))
    ids, names, moments = ids[:count], names[:count], moments[:count]
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=True),
        NestedField(3, "at", TimestamptzType(), required=True),
        identifier_field_ids=[1, 2, 3],
    )
    as_written = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(names, pa.large_string()),
            "at": pa.array([moment * 1000 for moment in moments], pa.timestamp("us", tz="UTC")),
        }
    )
    narrower = pa.table(
        {
            "at": pa.array(moments, pa.timestamp("ms", tz="UTC")),  # another order of columns, too
            "name": pa.array(names, pa.string()),
            "id": pa.array(ids, pa.int32()),
            "other": pa.array([1] * count),
        }
    )
    dictionary = as_written.set_column(1, "name", pa.array(names, pa.string()).dictionary_encode())

    expected = encode_keys(as_written, schema)

    assert encode_keys(narrower, schema) == expected
    assert encode_keys(dictionary, schema) == expected
    assert expected.to_pylist() == encode_key_values(list(zip(*as_written.to_pydict().values(), strict=True)), schema)


def test_a_long_string_takes_a_varint_of_several_bytes() -> None:
    schema = schema_of(["string", "long"])
    for length in (0, 127, 128, 16_383, 16_384, 300_000):
        [encoded] = encode_key_values([("x" * length, 7)], schema)
        assert encoded == varint(length) + b"x" * length + (7).to_bytes(8, "little")


def test_decimals_of_another_scale_are_cast_to_the_columns() -> None:
    schema = schema_of(["decimal"])
    given_so = pa.table({"k0": pa.array([decimal.Decimal("1.5"), decimal.Decimal("-2")], pa.decimal128(5, 1))})
    assert encode_keys(given_so, schema).to_pylist() == [
        reference(["decimal"], (decimal.Decimal("1.500"),)),
        reference(["decimal"], (decimal.Decimal("-2.000"),)),
    ]


def test_a_null_or_missing_key_column_is_refused() -> None:
    schema = schema_of(["long", "uuid"])
    with pytest.raises(ValueError, match="the keys hold 1 null k0: a key is never null"):
        encode_keys(
            pa.table({"k0": pa.array([1, None]), "k1": pa.array([uuid.uuid4().bytes] * 2, pa.binary(16))}), schema
        )
    with pytest.raises(ValueError, match="the keys have no column k1"):
        encode_keys(pa.table({"k0": [1]}), schema)
    assert encode_keys(
        pa.table({"k0": pa.array([], pa.int64()), "k1": pa.array([], pa.binary(16))}), schema
    ) == pa.array([], pa.binary())
