"""The Protobuf decoder against an independent reference: google.protobuf.json_format's view of each record parsed
with its writer's class. Hypothesis draws a message's versions (fields added and dropped, a field given presence),
built as descriptors (no protoc), records of every version with values at the edges (64-bit extremes, NaN, unicode,
far timestamps, nesting) and bad records mixed in. The property: a record decodes to the reference's row, its
fields by name (null where its writer had none), whatever its neighbours, its batch and the versions after it."""

from __future__ import annotations

import base64
import datetime as dt
import math
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Final

import pytest
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format, timestamp_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_writer.formats import schema_registry
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import FIRST_OFFSET, kafka_batch, next_decoding, registry_parser

TOPIC: Final = "events"
FieldProto = descriptor_pb2.FieldDescriptorProto
TIMESTAMP_FILE: Final = "google/protobuf/timestamp.proto"


@dataclass(frozen=True)
class ProtoType:
    name: str
    type: int
    values: st.SearchStrategy[Any]
    type_name: str = ""


seconds = st.integers(-62135596800, 253402300799)  # 0001-01-01 to 9999-12-31, Timestamp's own range
TYPES: Final = {
    t.name: t
    for t in (
        ProtoType("int32", FieldProto.TYPE_INT32, st.integers(-(2**31), 2**31 - 1)),
        ProtoType("int64", FieldProto.TYPE_INT64, st.integers(-(2**63), 2**63 - 1)),
        ProtoType("uint32", FieldProto.TYPE_UINT32, st.integers(0, 2**32 - 1)),
        ProtoType("uint64", FieldProto.TYPE_UINT64, st.integers(0, 2**63 - 1)),
        ProtoType("sint64", FieldProto.TYPE_SINT64, st.integers(-(2**63), 2**63 - 1)),
        ProtoType("fixed32", FieldProto.TYPE_FIXED32, st.integers(0, 2**32 - 1)),
        ProtoType("sfixed64", FieldProto.TYPE_SFIXED64, st.integers(-(2**63), 2**63 - 1)),
        ProtoType("double", FieldProto.TYPE_DOUBLE, st.floats()),
        ProtoType("float", FieldProto.TYPE_FLOAT, st.floats(width=32)),
        ProtoType("bool", FieldProto.TYPE_BOOL, st.booleans()),
        ProtoType("string", FieldProto.TYPE_STRING, st.text()),
        ProtoType("bytes", FieldProto.TYPE_BYTES, st.binary(max_size=8)),
        ProtoType(
            "timestamp",
            FieldProto.TYPE_MESSAGE,
            st.tuples(seconds, st.integers(0, 999_999).map(lambda us: us * 1000)),
            ".google.protobuf.Timestamp",
        ),
        ProtoType(
            "item",
            FieldProto.TYPE_MESSAGE,
            st.fixed_dictionaries({"x": st.integers(-(2**63), 2**63 - 1), "y": st.text(max_size=4)}),
            ".ref.Item",
        ),
    )
}
SIXTY_FOUR_BITS: Final = {"int64", "uint64", "sint64", "sfixed64"}


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    type: str
    label: str = "singular"  # singular (no presence, but a message), optional (presence), repeated


def file_of(fields: tuple[Field, ...], version: int) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name=f"events_v{version}.proto", package="ref", syntax="proto3")
    file.dependency.append(TIMESTAMP_FILE)
    item = file.message_type.add(name="Item")
    item.field.add(name="x", number=1, type=FieldProto.TYPE_INT64, label=FieldProto.LABEL_OPTIONAL, json_name="x")
    item.field.add(name="y", number=2, type=FieldProto.TYPE_STRING, label=FieldProto.LABEL_OPTIONAL, json_name="y")
    event = file.message_type.add(name="Event")
    for field in fields:
        kind = TYPES[field.type]
        label = FieldProto.LABEL_REPEATED if field.label == "repeated" else FieldProto.LABEL_OPTIONAL
        added = event.field.add(name=field.name, number=field.number, type=kind.type, label=label, json_name=field.name)
        if kind.type_name:
            added.type_name = kind.type_name
        if field.label == "optional":
            added.proto3_optional = True
            added.oneof_index = len(event.oneof_decl)
            event.oneof_decl.add(name=f"_{field.name}")
    return file


def class_of(file: descriptor_pb2.FileDescriptorProto) -> type[Message]:
    pool = DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("ref.Event"))


@st.composite
def versions(draw: st.DrawFn) -> list[tuple[Field, ...]]:
    numbers = iter(range(1, 100))

    def new_field() -> Field:
        number = next(numbers)
        kind = draw(st.sampled_from(sorted(TYPES)))
        labels = ["singular", "optional", "repeated"] if kind not in ("timestamp", "item") else ["singular", "repeated"]
        return Field(f"f{number}", number, kind, draw(st.sampled_from(labels)))

    sequence = [tuple(new_field() for _ in range(draw(st.integers(1, 4))))]
    for _ in range(draw(st.integers(0, 3))):
        fields = list(sequence[-1])
        if draw(st.booleans()) or len(fields) == 1:
            fields.append(new_field())
        else:
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        sequence.append(tuple(fields))
    return sequence


@st.composite
def message_of(draw: st.DrawFn, cls: type[Message], fields: tuple[Field, ...]) -> Message:
    message = cls()
    for field in fields:
        count = draw(st.integers(0, 2)) if field.label == "repeated" else draw(st.sampled_from([0, 1, 1]))
        for _ in range(count):
            value = draw(TYPES[field.type].values)
            target = getattr(message, field.name)
            if field.type == "timestamp":
                stamp = target.add() if field.label == "repeated" else target
                stamp.seconds, stamp.nanos = value
            elif field.type == "item":
                item = target.add() if field.label == "repeated" else target
                item.x, item.y = value["x"], value["y"]
            elif field.label == "repeated":
                target.append(value)
            else:
                setattr(message, field.name, value)
    return message


def reference(message: Message, fields: tuple[Field, ...], columns: list[str]) -> dict[str, Any]:
    """The row json_format's view of the message gives: each field by name, None where the writer had none."""
    view = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    by_name = {field.name: field for field in fields}
    row: dict[str, Any] = {}
    for column in columns:
        field = by_name.get(column)
        if field is None or column not in view:
            row[column] = None
        elif field.label == "repeated":
            row[column] = [_value(field.type, item) for item in view[column]]
        else:
            row[column] = _value(field.type, view[column])
    return comparable(row)


def _value(kind: str, value: Any) -> Any:
    if kind in SIXTY_FOUR_BITS:
        return int(value)
    if kind in ("double", "float"):
        number = float(value)  # "NaN", "Infinity" as json_format writes them
        return struct.unpack("f", struct.pack("f", number))[0] if kind == "float" else number
    if kind == "bytes":
        return base64.b64decode(value)
    if kind == "timestamp":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if kind == "item":
        return {"x": int(value.get("x", 0)), "y": value.get("y", "")}
    return value


def comparable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


BAD: Final = [None, b"\x00\x00\x00\x00\x01\x00\xff\xff", b"\x00\x7f\xff\xff\xff\x00", b"[]"]


@settings(max_examples=50, deadline=None)
@given(st.data(), versions())
def test_a_record_decodes_to_its_writer_classes_values_whatever_came_after(
    data: st.DataObject, sequence: list[tuple[Field, ...]]
) -> None:
    registry = RegistrySettings.of(f"mock://{uuid.uuid4().hex}")
    client = registry_client(registry)
    written: list[tuple[bytes, tuple[Field, ...], Message]] = []
    parser: RegistryBatchParser | None = None
    for version, fields in enumerate(sequence, start=1):
        cls = class_of(file_of(fields, version))
        serialize = ProtobufSerializer(cls, client)
        for message in data.draw(st.lists(message_of(cls, fields), min_size=1, max_size=4)):
            written.append((serialize(message, SerializationContext(TOPIC, MessageField.VALUE)), fields, message))
        if parser is None:  # the job starts after the first version
            subject = RegistrySubject(RegistryFormat.PROTOBUF, f"{TOPIC}-value", "ref.Event")
            parser = registry_parser(registry, subject)
    assert parser is not None
    mixed = data.draw(st.permutations([*written, *[(bad, None, None) for bad in BAD]]))
    decoding = next_decoding(parser)
    columns = parser.table_schema.names
    # Every field any version wrote is a column (an intermediate version's too): no value is left unread.
    assert {field.name for fields in sequence for field in fields} <= set(columns)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schema_registry, "SCHEMA_ID_LAG_SECONDS", 0.05)  # the unknown id of BAD
        decoded = decoding.decoder.decode(kafka_batch([payload for payload, _, _ in mixed]))
        alone = [decoding.decoder.decode(kafka_batch([payload])) for payload, _, _ in mixed]

    rows = iter(comparable(decoded.rows.to_pylist()))
    misfits = set(decoded.misfits.column("offset").to_pylist())
    for index, (_, fields, message) in enumerate(mixed):
        if fields is None:
            assert FIRST_OFFSET + index in misfits and alone[index].misfits.num_rows == 1
            continue
        assert message is not None
        expected = reference(message, fields, columns)
        assert next(rows) == expected, (fields, message)
        assert comparable(alone[index].rows.to_pylist()) == [expected]
    # A later version changes nothing of what the records written before decode to.
    later_fields = (*sequence[-1], Field("later", 99, "string", "optional"))
    later = class_of(file_of(later_fields, len(sequence) + 1))
    ProtobufSerializer(later, client)(later(), SerializationContext(TOPIC, MessageField.VALUE))
    again = next_decoding(parser).decoder.decode(kafka_batch([p for p, f, _ in mixed if f is not None]))
    assert comparable(again.rows.drop_columns(["later"]).to_pylist()) == comparable(decoded.rows.to_pylist())
