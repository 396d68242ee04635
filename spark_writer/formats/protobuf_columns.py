"""How a Protobuf message's fields become the table's Arrow columns, over a batch of messages at once.

Messages become Arrow column by column (one Python list per field over the
batch's messages, then one Arrow array), not row by row.

Protobuf -> Arrow (-> Iceberg): double, float; int32, sint32, sfixed32 (int32);
int64, sint64, sfixed64, uint32, fixed32 (int64); uint64, fixed64 (int64: a value
above 2^63-1 does not fit); bool; string; bytes (binary); enum (the value's name,
or its number as text for a number the schema does not name); message (struct);
repeated (list); map (map); google.protobuf.Timestamp (timestamptz, microseconds);
the wrappers google.protobuf.Int64Value, StringValue, ... (their value, nullable).
A field with presence (proto3 ``optional``, a oneof member, a message, proto2
fields) is null when it is not set; a proto3 scalar without presence has its
default (0, "", false) as Protobuf itself gives it. Refused before the query
starts: recursive messages, groups.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from spark_writer.formats.decoded_batch import UTC
from spark_writer.formats.registry_decoding import UnsupportedSchemaError

MICROS_PER_SECOND: Final = 1_000_000
SCALARS: Final = {
    FieldDescriptor.TYPE_DOUBLE: pa.float64(),
    FieldDescriptor.TYPE_FLOAT: pa.float32(),
    FieldDescriptor.TYPE_INT32: pa.int32(),
    FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(),
    FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(),
    FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    FieldDescriptor.TYPE_UINT32: pa.int64(),
    FieldDescriptor.TYPE_FIXED32: pa.int64(),
    FieldDescriptor.TYPE_UINT64: pa.int64(),
    FieldDescriptor.TYPE_FIXED64: pa.int64(),
    FieldDescriptor.TYPE_BOOL: pa.bool_(),
    FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(),
}
WRAPPERS: Final = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.int64(),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
TIMESTAMP: Final = "google.protobuf.Timestamp"


class _Column:
    """How one field's values over a batch of messages become an Arrow array."""

    type: pa.DataType

    def convert(self, values: list[Any]) -> pa.Array:
        raise NotImplementedError


class _Scalar(_Column):
    def __init__(self, data_type: pa.DataType) -> None:
        self.type = data_type

    def convert(self, values: list[Any]) -> pa.Array:
        return pa.array(values, self.type)


class _Enum(_Column):
    type = pa.string()

    def __init__(self, field: FieldDescriptor) -> None:
        assert field.enum_type is not None
        self._names = {value.number: value.name for value in field.enum_type.values}

    def convert(self, values: list[Any]) -> pa.Array:
        names = self._names
        return pa.array([None if v is None else names.get(v, str(v)) for v in values], self.type)


class _Timestamp(_Column):
    type = pa.timestamp("us", tz=UTC)

    def convert(self, values: list[Any]) -> pa.Array:
        micros = [None if m is None else m.seconds * MICROS_PER_SECOND + m.nanos // 1000 for m in values]
        return pa.array(micros, self.type)


class _Wrapper(_Column):
    def __init__(self, data_type: pa.DataType) -> None:
        self.type = data_type

    def convert(self, values: list[Any]) -> pa.Array:
        return pa.array([None if m is None else m.value for m in values], self.type)


class _Repeated(_Column):
    def __init__(self, element: _Column) -> None:
        self._element = element
        self.type = pa.list_(element.type)

    def convert(self, values: list[Any]) -> pa.Array:
        offsets, flat = _flattened(values)
        return pa.ListArray.from_arrays(offsets, self._element.convert(flat), type=self.type)


class _Map(_Column):
    def __init__(self, key: _Column, item: _Column) -> None:
        self._key, self._item = key, item
        self.type = pa.map_(key.type, item.type)

    def convert(self, values: list[Any]) -> pa.Array:
        offsets, keys = _flattened(values)
        items = [container[key] for container in values if container is not None for key in container]
        return pa.MapArray.from_arrays(offsets, self._key.convert(keys), self._item.convert(items), type=self.type)


def _flattened(containers: list[Any]) -> tuple[pa.Array, list[Any]]:
    """The containers' elements one after the other, and where each container's start (a None one is empty)."""
    offsets = [0]
    flat: list[Any] = []
    for container in containers:
        if container is not None:
            flat.extend(container)
        offsets.append(len(flat))
    return pa.array(offsets, pa.int32()), flat


class MessageColumn(_Column):
    def __init__(self, fields: list[tuple[FieldDescriptor, _Column]]) -> None:
        self._fields = fields
        self.type = pa.struct([pa.field(field.name, column.type) for field, column in fields])

    def convert(self, values: list[Any]) -> pa.Array:
        children = []
        for field, column in self._fields:
            name = field.name
            if field.has_presence:
                child = [None if m is None or not m.HasField(name) else getattr(m, name) for m in values]
            else:
                child = [None if m is None else getattr(m, name) for m in values]
            children.append(column.convert(child))
        mask = pa.array([m is None for m in values], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=mask)


def _column(field: FieldDescriptor, path: str, open_messages: list[str]) -> _Column:
    if field.type == FieldDescriptor.TYPE_GROUP:
        raise UnsupportedSchemaError(f"Protobuf field {path} is a group, which the decoder does not read")
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name
        return _Map(_single(entry["key"], f"{path}{{}}", open_messages), _single(entry["value"], path, open_messages))
    element = _single(field, path, open_messages)
    return _Repeated(element) if field.is_repeated else element


def _single(field: FieldDescriptor, path: str, open_messages: list[str]) -> _Column:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _Enum(field)
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return _Scalar(SCALARS[field.type])
    assert field.message_type is not None
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return _Timestamp()
    if name in WRAPPERS:
        return _Wrapper(WRAPPERS[name])
    return _message(field.message_type, path, open_messages)


def _message(message: Descriptor, path: str, open_messages: list[str]) -> MessageColumn:
    if message.full_name in open_messages:
        raise UnsupportedSchemaError(
            f"Protobuf field {path} is the recursive message {message.full_name}: a table cannot hold it"
        )
    open_messages.append(message.full_name)
    try:
        return MessageColumn(
            [(f, _column(f, f"{path}.{f.name}" if path else f.name, open_messages)) for f in message.fields]
        )
    finally:
        open_messages.pop()


def message_column(message: Descriptor) -> MessageColumn:
    """How a message's fields become the table's Arrow struct (its `type`); UnsupportedSchemaError for a field no
    column can hold."""
    return _message(message, "", [])
