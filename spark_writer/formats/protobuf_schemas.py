"""A registered Protobuf schema's descriptors, built from the registry, and the message indexes that name its messages.

The registry gives a Protobuf schema as a serialized FileDescriptorProto (format
``serialized``); the files it imports come from its schema references, or, for
the well-known ones (``google/protobuf/*``, ``google/type/*``, ``confluent/*``),
from the installed Python packages. No ``protoc`` and no generated code are needed.

A record's message indexes (after the schema id in its header) name its message type in
its writer schema: [0] the file's first message, [1, 0] the first nested one of the second.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka.schema_registry import Schema
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError

from spark_writer.formats.registry_decoding import UnreadableSchemaError, UnsupportedSchemaError
from spark_writer.formats.schema_registry import RegistrySettings, subject_version

SERIALIZED: Final = "serialized"
MAIN_FILE: Final = "registered.proto"
# Imports resolved from installed packages rather than schema references: path prefix -> Python package.
BUILTIN_PACKAGES: Final = {
    "google/protobuf/": "google.protobuf.",
    "google/type/": "google.type.",
    "confluent/": "confluent_kafka.schema_registry.confluent.",
}


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
