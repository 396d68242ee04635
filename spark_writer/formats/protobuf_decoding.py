"""Protobuf payloads decoded into Arrow with message classes built from the registry's schemas.

Each schema id's descriptors are built once per process (``protobuf_schemas``).
Every payload of the table's message type is parsed with the class of its own
writer schema (by the id in its header), never with a newer version's: a record
decodes to the same row whatever versions the subject gains later. Its fields then
go to the table's columns by name (``registry_decoding.conformed``): a column the
writer's message lacks is null, a field the table lacks is not read. A record's
message indexes (after the schema id) name its message type in its writer schema;
a record of another message type than the table's does not fit. How messages
become Arrow, and which Protobuf types a table holds: ``protobuf_columns``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa
from confluent_kafka.schema_registry import Schema
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from spark_writer.formats.protobuf_columns import MessageColumn, message_column
from spark_writer.formats.protobuf_schemas import SERIALIZED, ParsedProto, message_indexes, parse_proto
from spark_writer.formats.registry_decoding import (
    ARROW_ERRORS,
    UnreadableSchemaError,
    UnsupportedSchemaError,
    decode_by_writer,
    fitted,
)
from spark_writer.formats.schema_registry import RegistrySettings, schema_by_id


def protobuf_table_type(registry: RegistrySettings, schema_id: int, message: str | None) -> tuple[pa.DataType, str]:
    """The table's Arrow type of a registered schema's message (`message`, or its first), and the message's full
    name; UnsupportedSchemaError for what no column can hold."""
    try:
        parsed = parse_proto(registry, schema_id, schema_by_id(registry, schema_id, SERIALIZED))
    except UnreadableSchemaError as error:
        raise UnsupportedSchemaError(f"schema id {schema_id}: {error}") from None
    descriptor = parsed.message_named(message)
    return message_column(descriptor).type, descriptor.full_name


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
    def _classes(self) -> dict[int, tuple[Callable[[bytes], Message], MessageColumn]]:
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

    def _class_of(self, writer: ParsedProto) -> tuple[Callable[[bytes], Message], MessageColumn]:
        if writer.schema_id not in self._classes:
            descriptor = writer.message_named(self.message)
            self._classes[writer.schema_id] = (GetMessageClass(descriptor).FromString, message_column(descriptor))
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


def _message_by_message(messages: list[Message | None], reasons: list[str | None], columns: MessageColumn) -> pa.Array:
    arrays = []
    for index, message in enumerate(messages):
        try:
            arrays.append(columns.convert([message]))
        except ARROW_ERRORS as error:
            arrays.append(pa.nulls(1, columns.type))
            reasons[index] = f"a value does not fit the table's column types: {error}"
    return pa.concat_arrays(arrays) if arrays else pa.array([], columns.type)
