"""Protobuf payloads decoded into Arrow with message classes built from the registry's schemas.

The registry gives a Protobuf schema as a serialized FileDescriptorProto (format
``serialized``); the files it imports come from its schema references, or, for
the well-known ones (``google/protobuf/*``, ``google/type/*``, ``confluent/*``),
from the installed Python packages. Each schema id's descriptors are built once per
process. No ``protoc`` and no generated code are needed.

Every payload of the table's message type is parsed with the class of its own
writer schema (by the id in its header), never with a newer version's: a record
decodes to the same row whatever versions the subject gains later. Its fields then
go to the table's columns by name (``registry_decoding.conformed``): a column the
writer's message lacks is null, a field the table lacks is not read. A record's
message indexes (after the schema id) name its message type in its writer schema;
a record of another message type than the table's does not fit.

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

import base64
import binascii
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

import pyarrow as pa
from confluent_kafka.schema_registry import Schema
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from spark_writer.formats.decoded_batch import UTC
from spark_writer.formats.registry_decoding import (
    ARROW_ERRORS,
    UnreadableSchemaError,
    UnsupportedSchemaError,
    decode_by_writer,
    fitted,
)
from spark_writer.formats.schema_registry import RegistrySettings, schema_by_id, subject_version

SERIALIZED: Final = "serialized"
MAIN_FILE: Final = "registered.proto"
MICROS_PER_SECOND: Final = 1_000_000
# Imports resolved from installed packages rather than schema references: path prefix -> Python package.
BUILTIN_PACKAGES: Final = {
    "google/protobuf/": "google.protobuf.",
    "google/type/": "google.type.",
    "confluent/": "confluent_kafka.schema_registry.confluent.",
}
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


# --- Descriptors from the registry ---------------------------------------------------------------------------------


def _file_proto(name: str, schema_str: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(schema_str, validate=True))
    except (binascii.Error, ValueError, DecodeError) as error:
        raise UnreadableSchemaError(
            "the registry did not give it as a serialized FileDescriptorProto (format=serialized), which the decoder "
            f"reads: {error}"
        ) from None
    proto.name = name
    return proto


def _builtin_file(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """An import the installed packages define (google/protobuf/timestamp.proto, ...), or None."""
    for prefix, package in BUILTIN_PACKAGES.items():
        if name.startswith(prefix):
            module = package + name.removeprefix(prefix).removesuffix(".proto").replace("/", ".") + "_pb2"
            try:
                file: FileDescriptor = importlib.import_module(module).DESCRIPTOR
            except ImportError:
                return None
            return descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb)
    return None


def _add(
    pool: DescriptorPool, proto: descriptor_pb2.FileDescriptorProto, files: dict[str, Any], added: set[str]
) -> None:
    """Add a file to the pool after the files it imports (from `files`: the references, or the installed ones)."""
    if proto.name in added:
        return
    added.add(proto.name)
    for dependency in proto.dependency:
        imported = files.get(dependency) or _builtin_file(dependency)
        if imported is None:
            raise UnreadableSchemaError(f"it imports {dependency}, which is neither a schema reference nor built in")
        _add(pool, imported, files, added)
    pool.Add(proto)


def _referenced(registry: RegistrySettings, schema: Schema, files: dict[str, Any]) -> None:
    for reference in schema.references or []:
        if reference.name is None or reference.name in files or reference.subject is None:
            continue
        if reference.version is None:
            continue
        target = subject_version(registry, reference.subject, reference.version, SERIALIZED).schema
        files[reference.name] = _file_proto(reference.name, str(target.schema_str))
        _referenced(registry, target, files)


@dataclass(frozen=True)
class ParsedProto:
    """A registered Protobuf schema's descriptors (its own pool), and its top-level messages in their order."""

    schema_id: int
    file: FileDescriptor
    messages: tuple[Descriptor, ...]

    def message_at(self, indexes: tuple[int, ...]) -> Descriptor:
        """The message the indexes name: [0] is the file's first message, [1, 0] the first nested one of the
        second; IndexError if there is none."""
        if min(indexes) < 0:
            raise IndexError(indexes)
        message = self.messages[indexes[0]]
        for index in indexes[1:]:
            message = message.nested_types[index]
        return message

    def indexes_of(self, name: str) -> bytes | None:
        """The message indexes of the message `name` as the wire format writes them, None if the file has none."""
        path = _path_to(name, self.messages, ())
        if path is None:
            return None
        if path == (0,):  # the first message: one zero byte
            return b"\x00"
        return b"".join(_zigzag_varint(number) for number in (len(path), *path))

    def message_named(self, name: str | None) -> Descriptor:
        """The message of that full (or, in the file's package, short) name; the file's first one when None."""
        if not self.messages:
            raise UnsupportedSchemaError(f"schema id {self.schema_id} defines no message")
        if name is None:
            return self.messages[0]
        package = self.file.package
        for candidate in (name, f"{package}.{name}" if package else name):
            try:
                return self.file.pool.FindMessageTypeByName(candidate)
            except KeyError:
                continue
        known = [m.full_name for m in self.messages]
        raise UnsupportedSchemaError(f"schema id {self.schema_id} has no message {name!r}; its top-level ones: {known}")


def _path_to(name: str, messages: Sequence[Descriptor], path: tuple[int, ...]) -> tuple[int, ...] | None:
    for index, message in enumerate(messages):
        if message.full_name == name:
            return (*path, index)
        found = _path_to(name, message.nested_types, (*path, index))
        if found is not None:
            return found
    return None


def _zigzag_varint(number: int) -> bytes:
    value = (number << 1) ^ (number >> 63)
    encoded = bytearray()
    while value > 0x7F:
        encoded.append((value & 0x7F) | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def parse_proto(registry: RegistrySettings, schema_id: int, schema: Schema) -> ParsedProto:
    """A registered schema's descriptors, with the files it imports; UnreadableSchemaError if they cannot be built."""
    if schema.schema_type != "PROTOBUF":
        raise UnreadableSchemaError(f"it is a {schema.schema_type or 'AVRO'} schema, not Protobuf")
    files: dict[str, Any] = {}
    _referenced(registry, schema, files)
    main = _file_proto(MAIN_FILE, str(schema.schema_str))
    pool = DescriptorPool()
    try:
        _add(pool, main, files, set())
    except (TypeError, ValueError) as error:  # the pool's refusal of an inconsistent file
        raise UnreadableSchemaError(f"its descriptors do not build: {error}") from None
    file = pool.FindFileByName(MAIN_FILE)
    # The indexes count messages in the order the file declares them (a FileDescriptor has them only by name).
    return ParsedProto(schema_id, file, tuple(file.message_types_by_name[m.name] for m in main.message_type))


# --- Messages into Arrow ---------------------------------------------------------------------------------------------


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


class _Message(_Column):
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


def _message(message: Descriptor, path: str, open_messages: list[str]) -> _Message:
    if message.full_name in open_messages:
        raise UnsupportedSchemaError(
            f"Protobuf field {path} is the recursive message {message.full_name}: a table cannot hold it"
        )
    open_messages.append(message.full_name)
    try:
        return _Message(
            [(f, _column(f, f"{path}.{f.name}" if path else f.name, open_messages)) for f in message.fields]
        )
    finally:
        open_messages.pop()


def message_columns(message: Descriptor) -> pa.DataType:
    """The table's Arrow type of a message; UnsupportedSchemaError for a field no column can hold."""
    return _message(message, "", []).type


def protobuf_table_type(registry: RegistrySettings, schema_id: int, message: str | None) -> tuple[pa.DataType, str]:
    """The table's Arrow type of a registered schema's message (`message`, or its first), and the message's full
    name; UnsupportedSchemaError for what no column can hold."""
    try:
        parsed = parse_proto(registry, schema_id, schema_by_id(registry, schema_id, SERIALIZED))
    except UnreadableSchemaError as error:
        raise UnsupportedSchemaError(f"schema id {schema_id}: {error}") from None
    descriptor = parsed.message_named(message)
    return message_columns(descriptor), descriptor.full_name


# --- Payloads --------------------------------------------------------------------------------------------------------


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zigzag varint at `position`, and the position after it; IndexError when the data ends first."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position


def message_indexes(payload: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes at the start of a payload, and where the message starts; ValueError if unreadable."""
    if payload[:1] == b"\x00":  # the first message of the file: one byte, the usual case
        return (0,), 1
    try:
        count, position = _varint(payload, 0)
        if not 0 < count <= len(payload):
            raise ValueError(f"{count} message indexes")
        indexes = []
        for _ in range(count):
            index, position = _varint(payload, position)
            indexes.append(index)
    except IndexError:
        raise ValueError("the payload ends in its message indexes") from None
    return tuple(indexes), position


@dataclass(frozen=True)
class ProtobufPayloads:
    """Decodes Protobuf payloads of the message `message` (full name), each with the class of its own writer schema,
    into values of `target` (the table's type): the writer's fields by name, as ``registry_decoding.conformed``
    maps them."""

    registry: RegistrySettings
    message: str
    target: pa.DataType
    kind: str = "protobuf"
    schema_format: str | None = SERIALIZED

    @cached_property
    def _classes(self) -> dict[int, tuple[Callable[[bytes], Message], _Message]]:
        """Per writer schema id: its class of the table's message and how its messages become Arrow (this process's)."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        names = ("registry", "message", "target", "kind", "schema_format")
        return {name: getattr(self, name) for name in names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def writer(self, registry: RegistrySettings, schema_id: int, schema: Schema) -> ParsedProto:
        return parse_proto(registry, schema_id, schema)

    def decode(self, payloads: pa.Array, writers: Sequence[ParsedProto]) -> tuple[pa.Array, list[str | None]]:
        return decode_by_writer(payloads, writers, self.target, self._decode_written_with)

    def _decode_written_with(self, payloads: pa.Array, writer: ParsedProto) -> tuple[pa.Array, list[str | None]]:
        """Payloads of one writer schema, parsed with its own class of the table's message."""
        nulls = pa.nulls(len(payloads), self.target)
        header = writer.indexes_of(self.message)
        if header is None:  # the writer has no such message: each payload's indexes say which one it is
            return nulls, [self._read(payload, writer, None)[1] for payload in payloads.to_pylist()]
        try:
            parse, columns = self._class_of(writer)
        except UnsupportedSchemaError as error:
            return nulls, [f"schema id {writer.schema_id} cannot be read: {error}"] * len(payloads)
        messages: list[Message | None] = []
        reasons: list[str | None] = []
        for payload in payloads.to_pylist():
            # A payload that starts with the table message's indexes is parsed at once; the others have their
            # indexes read to say which message they are.
            if payload.startswith(header):
                message, reason = self._parsed(payload[len(header) :], writer, parse)
            else:
                message, reason = self._read(payload, writer, parse)
            messages.append(message)
            reasons.append(reason)
        try:
            values = columns.convert(messages)
        except ARROW_ERRORS:  # a value its own schema's type cannot hold (a uint64 above 2^63-1): find which
            values = _message_by_message(messages, reasons, columns)
        fitting, misfits = fitted(values, self.target, writer.schema_id)
        return fitting, [reason or misfit for reason, misfit in zip(reasons, misfits, strict=True)]

    def _class_of(self, writer: ParsedProto) -> tuple[Callable[[bytes], Message], _Message]:
        if writer.schema_id not in self._classes:
            descriptor = writer.message_named(self.message)
            self._classes[writer.schema_id] = (GetMessageClass(descriptor).FromString, _message(descriptor, "", []))
        return self._classes[writer.schema_id]

    def _parsed(
        self, data: bytes, writer: ParsedProto, parse: Callable[[bytes], Message]
    ) -> tuple[Message | None, str | None]:
        try:
            return parse(data), None
        except DecodeError as error:
            return None, f"not a {self.message} message (schema id {writer.schema_id}): {error}"

    def _read(
        self, payload: bytes, writer: ParsedProto, parse: Callable[[bytes], Message] | None
    ) -> tuple[Message | None, str | None]:
        """A payload whose indexes are read first: the table's message (`parse` reads it), or why it is not one."""
        try:
            indexes, start = message_indexes(payload)
        except ValueError as error:
            return None, f"not Protobuf in the Confluent wire format: {error}"
        try:
            name = writer.message_at(indexes).full_name
        except IndexError:
            return None, f"message indexes {list(indexes)} name no message of schema id {writer.schema_id}"
        if name != self.message or parse is None:
            return None, f"a {name} message (schema id {writer.schema_id}), not the table's {self.message}"
        return self._parsed(payload[start:], writer, parse)


def _message_by_message(messages: list[Message | None], reasons: list[str | None], columns: _Message) -> pa.Array:
    arrays = []
    for index, message in enumerate(messages):
        try:
            arrays.append(columns.convert([message]))
        except ARROW_ERRORS as error:
            arrays.append(pa.nulls(1, columns.type))
            reasons[index] = f"a value does not fit the table's column types: {error}"
    return pa.concat_arrays(arrays) if arrays else pa.array([], columns.type)
