"""The Avro decoder against an independent reference: fastavro reading each record with its writer schema, logical
types kept. Hypothesis draws a subject's versions (fields added and dropped, a timestamp's unit changed, a field
made nullable), records of every version with values at the edges (full-precision decimals, far dates, NaN,
unicode, nesting) and bad records mixed in. The property: a record decodes to the reference's row, its fields by
name (null where its writer had none), whatever its neighbours, its batch and the versions registered after it;
a bad one is a misfit."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import fastavro
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_writer.formats import schema_registry
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import FIRST_OFFSET, kafka_batch, next_decoding, registry_parser

TOPIC: Final = "events"
UTC: Final = dt.UTC


@dataclass(frozen=True)
class AvroType:
    """A field type: its Avro schema and a strategy of its values as fastavro writes them."""

    name: str
    schema: Any
    values: st.SearchStrategy[Any]


def _decimals(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    # From the unscaled integer, through text: Decimal arithmetic would round to its context's 28 digits.
    unscaled = st.one_of(st.integers(-(10**precision) + 1, 10**precision - 1), st.sampled_from([10**precision - 1]))
    return unscaled.map(lambda digits: Decimal(f"{digits}E-{scale}"))


far_instants = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31), timezones=st.just(UTC))
ITEM: Final = {
    "type": "record",
    "name": "Item",
    "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "string"}],
}
COLOUR: Final = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}
small_counts = st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2)
TYPES: Final = {
    t.name: t
    for t in (
        AvroType("int", "int", st.integers(-(2**31), 2**31 - 1)),
        AvroType("long", "long", st.integers(-(2**63), 2**63 - 1)),
        AvroType("float", "float", st.floats(width=32)),
        AvroType("double", "double", st.floats()),
        AvroType("string", "string", st.text()),
        AvroType("bytes", "bytes", st.binary(max_size=8)),
        AvroType("boolean", "boolean", st.booleans()),
        AvroType("money", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}, _decimals(9, 2)),
        AvroType("exact", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}, _decimals(38, 10)),
        AvroType("millis", {"type": "long", "logicalType": "timestamp-millis"}, far_instants.map(
            lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
        ),
        AvroType("micros", {"type": "long", "logicalType": "timestamp-micros"}, far_instants),
        AvroType("local", {"type": "long", "logicalType": "local-timestamp-micros"}, st.datetimes()),
        AvroType("date", {"type": "int", "logicalType": "date"}, st.dates()),
        AvroType("time", {"type": "long", "logicalType": "time-micros"}, st.times()),
        AvroType("uuid", {"type": "string", "logicalType": "uuid"}, st.uuids()),
        AvroType("enum", COLOUR, st.sampled_from(["RED", "GREEN"])),
        AvroType("tags", {"type": "array", "items": "string"}, st.lists(st.text(max_size=3), max_size=3)),
        AvroType("counts", {"type": "map", "values": "long"}, small_counts),
        AvroType("item", ITEM, st.fixed_dictionaries({"x": st.integers(0, 2**40), "y": st.text(max_size=4)})),
    )
}  # fmt: skip
UNIT_CHANGES: Final = {"millis": "micros", "micros": "millis"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool = False

    def schema(self) -> dict[str, Any]:
        avro = TYPES[self.type].schema
        if isinstance(avro, dict) and "name" in avro:  # a named type, defined once: named after its field
            avro = {**avro, "name": f"{avro['name']}_{self.name}"}
        if self.nullable:
            return {"name": self.name, "type": ["null", avro], "default": None}
        return {"name": self.name, "type": avro}


def record_schema(fields: tuple[Field, ...], version: int) -> dict[str, Any]:
    return {"type": "record", "name": "Event", "namespace": "reference", "doc": f"v{version}",
            "fields": [f.schema() for f in fields]}  # fmt: skip


@st.composite
def versions(draw: st.DrawFn) -> list[tuple[Field, ...]]:
    """A subject's versions: each the one before with a field added or dropped, a timestamp's unit changed, or a
    field made nullable (changes that keep each column's table type)."""
    names = iter(f"f{i}" for i in range(100))
    first = tuple(Field(next(names), draw(st.sampled_from(sorted(TYPES)))) for _ in range(draw(st.integers(1, 4))))
    sequence = [first]
    for _ in range(draw(st.integers(0, 3))):
        fields = list(sequence[-1])
        change = draw(st.sampled_from(["add", "drop", "unit", "nullable"]))
        if change == "add" or len(fields) == 1:
            fields.append(Field(next(names), draw(st.sampled_from(sorted(TYPES))), draw(st.booleans())))
        elif change == "drop":
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        elif change == "unit" and (timed := [i for i, f in enumerate(fields) if f.type in UNIT_CHANGES]):
            index = draw(st.sampled_from(timed))
            fields[index] = Field(fields[index].name, UNIT_CHANGES[fields[index].type], fields[index].nullable)
        else:
            index = draw(st.integers(0, len(fields) - 1))
            fields[index] = Field(fields[index].name, fields[index].type, True)
        sequence.append(tuple(fields))
    return sequence


def values_of(fields: tuple[Field, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {f.name: st.one_of(st.none(), TYPES[f.type].values) if f.nullable else TYPES[f.type].values for f in fields}
    )


def reference(payload: bytes, schema: dict[str, Any]) -> dict[str, Any]:
    """The record as fastavro reads it with its writer schema alone, logical types kept."""
    return fastavro.schemaless_reader(io.BytesIO(payload[5:]), fastavro.parse_schema(schema), None)  # type: ignore[return-value]


def comparable(value: Any) -> Any:
    """A value as both sides can compare it: NaN as a mark, a UUID as its text, a map as its pairs."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def expected_row(read: dict[str, Any], fields: tuple[Field, ...], columns: list[str]) -> dict[str, Any]:
    maps = {f.name for f in fields if f.type == "counts"}
    row = {}
    for column in columns:
        value = read.get(column)
        row[column] = list(value.items()) if column in maps and value is not None else value
    return comparable(row)


BAD: Final = [None, b"\x00\x00\x00\x00", b"{}", b"\x00\x7f\xff\xff\xff\x02"]


@settings(max_examples=60, deadline=None)
@given(st.data(), versions())
def test_a_record_decodes_to_its_writer_schemas_values_whatever_came_after(
    data: st.DataObject, sequence: list[tuple[Field, ...]]
) -> None:
    registry = RegistrySettings.of(f"mock://{uuid.uuid4().hex}")
    client = registry_client(registry)
    written: list[tuple[bytes, tuple[Field, ...], dict[str, Any]]] = []
    parser: RegistryBatchParser | None = None
    for version, fields in enumerate(sequence, start=1):
        schema = record_schema(fields, version)
        serialize = AvroSerializer(client, json.dumps(schema))
        for value in data.draw(st.lists(values_of(fields), min_size=1, max_size=4)):
            payload = serialize(value, SerializationContext(TOPIC, MessageField.VALUE))
            written.append((payload, fields, schema))
        if parser is None:  # the job starts after the first version
            parser = registry_parser(registry, RegistrySubject(RegistryFormat.AVRO, f"{TOPIC}-value"))
    assert parser is not None
    mixed = data.draw(st.permutations([*[(p, f, s) for p, f, s in written], *[(b, None, None) for b in BAD]]))
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
    for index, (payload, fields, schema) in enumerate(mixed):
        if fields is None:
            assert FIRST_OFFSET + index in misfits and alone[index].misfits.num_rows == 1
            continue
        expected = expected_row(reference(payload, schema), fields, columns)
        assert next(rows) == expected, (schema, payload)
        assert comparable(alone[index].rows.to_pylist()) == [expected]
    # A later version changes nothing of what the records written before decode to.
    later = (*sequence[-1], Field("later", "string", nullable=True))
    AvroSerializer(client, json.dumps(record_schema(later, len(sequence) + 1)))(
        {f.name: None if f.nullable else data.draw(TYPES[f.type].values) for f in later},
        SerializationContext(TOPIC, MessageField.VALUE),
    )
    again = next_decoding(parser).decoder.decode(kafka_batch([p for p, f, _ in mixed if f is not None]))
    assert comparable(again.rows.drop_columns(["later"]).to_pylist()) == comparable(
        decoded.rows.select(columns).to_pylist()
    )
    assert set(again.rows.column("later").to_pylist()) <= {None}
