"""A key's bytes in the key index: exact and canonical, whatever Arrow type its values arrived in.

A key is the tuple of its columns' values (the table's identifier fields, in order). Its bytes are, column after
column, the value's Iceberg single-value binary serialization (the spec's appendix D: a little-endian integer of the
column's width for boolean, int, long, date, time and timestamps; a UUID's 16 bytes; a fixed's bytes; UTF-8 for a
string; a binary's bytes; a decimal's unscaled value in the fewest two's-complement big-endian bytes), a value of a
type without a fixed width (string, binary, decimal) preceded by its length as an unsigned LEB128 varint. Values are
cast to the Arrow type of their column's Iceberg type first, so an int32 of a long column and a large_string of a
string column give the bytes of their column: two keys of a table are equal exactly when their bytes are (each type
fixes its width or is delimited by its length, and each serialization is one-to-one).

The key index stores these bytes (coordinator_service.log.key_index): an encoding changed later changes what is
stored, and comes with a migration that empties the index (it is rebuilt from the tables).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import to_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FixedType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from coordinator_service.tables.key_resolution import Key, key_columns, key_schema

# The types serialized as a little-endian integer: its width's NumPy type.
_LITTLE_ENDIAN: dict[type[IcebergType], str] = {
    BooleanType: "<u1",
    IntegerType: "<i4",
    DateType: "<i4",
    LongType: "<i8",
    TimeType: "<i8",
    TimestampType: "<i8",
    TimestamptzType: "<i8",
    TimestampNanoType: "<i8",
    TimestamptzNanoType: "<i8",
}
# Up to 2 ** 35 - 1 bytes take 5 varint bytes: more than an Arrow binary array holds.
_VARINT_BYTES = 5


def key_types(schema: Schema) -> tuple[PrimitiveType, ...]:
    """The Iceberg types of the schema's key columns, in the key's order."""
    types = []
    for name in key_columns(schema):
        field_type = schema.find_field(name).field_type
        assert isinstance(field_type, PrimitiveType), f"key column {name} of type {field_type} is not primitive"
        types.append(field_type)
    return tuple(types)


def encode_keys(columns: pa.Table, schema: Schema) -> pa.BinaryArray:
    """The bytes of each row's key, in row order: `columns` holds the schema's key columns by name, in any Arrow type
    that casts to theirs.

    Raises ValueError when a key column is missing, holds a null, or is of a type no key has (float, double)."""
    arrow = key_schema(schema).as_arrow()
    parts: list[pa.Array] = []
    for name, field_type in zip(key_columns(schema), key_types(schema), strict=True):
        if name not in columns.column_names:
            raise ValueError(f"the keys have no column {name}")
        column = columns.column(name).cast(arrow.field(name).type).combine_chunks()
        if column.null_count:
            raise ValueError(f"the keys hold {column.null_count} null {name}: a key is never null")
        parts.extend(_serialized(column, field_type))
    if len(parts) == 1:
        [encoded] = parts
        assert isinstance(encoded, pa.BinaryArray)
        return encoded
    joined = pc.binary_join_element_wise(*parts, b"")
    assert isinstance(joined, pa.BinaryArray)
    return joined


def encode_key_values(keys: Sequence[Key], schema: Schema) -> list[bytes]:
    """The bytes of each key given as a tuple of values (as key_resolution gives keys), in order."""
    arrow = key_schema(schema).as_arrow()
    names = key_columns(schema)
    columns = pa.table(
        {name: pa.array([key[index] for key in keys], arrow.field(name).type) for index, name in enumerate(names)}
    )
    encoded: list[bytes] = encode_keys(columns, schema).to_pylist()
    return encoded


def _serialized(column: pa.Array, field_type: PrimitiveType) -> list[pa.Array]:
    """The column's values serialized (binary arrays to join): preceded by their lengths where they are delimited."""
    width = _LITTLE_ENDIAN.get(type(field_type))
    if width is not None:
        integers = column.cast(pa.uint8()) if isinstance(field_type, BooleanType) else column.view(_physical(column))
        return [_fixed(np.asarray(integers.to_numpy(zero_copy_only=False), dtype=width))]
    if isinstance(field_type, UUIDType | FixedType):
        storage = column.storage if isinstance(column, pa.ExtensionArray) else column
        return [storage.cast(pa.binary())]
    if isinstance(field_type, StringType | BinaryType):
        values = column.cast(pa.large_binary()).cast(pa.binary())
        return [_varints(pc.binary_length(values)), values]
    if isinstance(field_type, DecimalType):
        values = pa.array([to_bytes(field_type, value) for value in column.to_pylist()], pa.binary())
        return [_varints(pc.binary_length(values)), values]
    raise ValueError(f"a key column of type {field_type} cannot be indexed: Iceberg takes no such key column")


def _physical(column: pa.Array) -> pa.DataType:
    """The integer type an integer, date, time or timestamp column is stored as."""
    return pa.int32() if column.type.bit_width == 32 else pa.int64()


def _fixed(values: np.ndarray) -> pa.Array:
    """Each value's bytes as `values` holds them (its dtype's width and byte order), as a binary array."""
    kind = pa.binary(values.dtype.itemsize)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values.tobytes())]).cast(pa.binary())


def _varints(lengths: pa.Array) -> pa.Array:
    """Each length as an unsigned LEB128 varint (7 bits a byte, low first, the high bit set on all but the last)."""
    values = np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.uint64)
    widths = np.ones(len(values), dtype=np.int32)
    for place in range(1, _VARINT_BYTES):
        widths += values >= np.uint64(1 << (7 * place))
    groups = np.empty((len(values), _VARINT_BYTES), dtype=np.uint8)
    for place in range(_VARINT_BYTES):
        more = np.where(place < widths - 1, 0x80, 0).astype(np.uint8)
        groups[:, place] = ((values >> np.uint64(7 * place)) & np.uint64(0x7F)).astype(np.uint8) | more
    data = groups[np.arange(_VARINT_BYTES) < widths[:, None]]
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())]
    )
