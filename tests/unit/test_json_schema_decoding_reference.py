"""The JSON Schema decoder against an independent reference: jsonschema's verdict on each record under its writer
schema, and Python's json with exact numbers for its values. Hypothesis draws a subject's versions (properties added
and dropped; a record may hold, undeclared, a property a later version declares), records of every version, valid
or not, and bad records mixed in. The property: a valid record decodes to its values, the properties its writer
schema declares by name (null where it declares none), whatever its neighbours, its batch and the versions after it;
an invalid one is a misfit. Null fits any property: the decoder reads types, not nullability, which the
producer's serializer checks."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any, Final

import jsonschema
import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_writer.formats import schema_registry
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import FIRST_OFFSET, kafka_batch, next_decoding, registry_parser

TOPIC: Final = "events"
INT64: Final = (-(2**63), 2**63 - 1)
PROPERTY_TYPES: Final = {
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "string": {"type": "string"},
    "boolean": {"type": "boolean"},
    "instant": {"type": "string", "format": "date-time"},
    "numbers": {"type": "array", "items": {"type": "integer"}},
    "inner": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "maybe": {"type": ["string", "null"]},
}
instants = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC))
VALUES: Final = {
    "integer": st.integers(-(2**64), 2**64).map(str),
    "number": st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr), st.integers().map(str)),
    "string": st.text(max_size=6).map(json.dumps),
    "boolean": st.sampled_from(["true", "false"]),
    "instant": instants.map(lambda t: json.dumps(t.isoformat().replace("+00:00", "Z"))),
    "numbers": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3).map(json.dumps),
    "inner": st.integers(-(2**63), 2**63 - 1).map(lambda a: json.dumps({"a": a})),
    "maybe": st.one_of(st.none(), st.text(max_size=4)).map(json.dumps),
}
ANY: Final = st.sampled_from(['"text"', "12", "1.5", "true", "null", "[1]", '{"a": "b"}', "1.0"])


def schema_of(properties: dict[str, str], version: int) -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"v{version}",
        "type": "object",
        "properties": {name: PROPERTY_TYPES[kind] for name, kind in properties.items()},
    }


@st.composite
def versions(draw: st.DrawFn) -> list[dict[str, str]]:
    names = iter(f"p{i}" for i in range(100))
    first = {next(names): draw(st.sampled_from(sorted(PROPERTY_TYPES))) for _ in range(draw(st.integers(1, 4)))}
    sequence = [first]
    for _ in range(draw(st.integers(0, 3))):
        properties = dict(sequence[-1])
        if draw(st.booleans()) or len(properties) == 1:
            properties[next(names)] = draw(st.sampled_from(sorted(PROPERTY_TYPES)))
        else:
            del properties[draw(st.sampled_from(sorted(properties)))]
        sequence.append(properties)
    return sequence


@st.composite
def record(draw: st.DrawFn, properties: dict[str, str], later: dict[str, str]) -> bytes:
    """A record of a version: its properties' values (of their type, mostly), and perhaps, undeclared, a property
    a later version declares."""
    fields = {
        name: draw(st.one_of(VALUES[kind], VALUES[kind], ANY))
        for name, kind in properties.items()
        if draw(st.integers(0, 4))
    }
    undeclared = sorted(set(later) - set(properties))
    if undeclared and draw(st.booleans()):
        name = draw(st.sampled_from(undeclared))
        fields[name] = draw(VALUES[later[name]])
    return ("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}").encode()


def as_decoded(schema: Any) -> Any:
    """The schema as the decoder reads it (the JSON decoder's rules): null allowed wherever a type is (it reads
    types, not nullability), and any value where a string is, as its text (but a date-time: a timestamp)."""
    if isinstance(schema, dict):
        relaxed = {key: as_decoded(value) for key, value in schema.items()}
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if "string" in types and "format" not in schema:
                return {}
            relaxed["type"] = sorted({*types, "null"})
        return relaxed
    return schema


def text_of(value: Any) -> str:
    """A value's text as the record wrote it (these records are written by json.dumps), without whitespace."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(text_of(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{text_of(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def expected(kind: str, value: Any) -> Any:
    """The column's value of a JSON value valid under its property's schema; None when the table cannot hold it."""
    if value is None:
        return None
    if kind == "integer":
        return value if INT64[0] <= value <= INT64[1] else Ellipsis
    if kind == "number":
        number = float(value)
        return number if math.isfinite(number) else Ellipsis
    if kind == "instant":  # jsonschema does not check formats; the decoder reads ISO 8601 as --format json does
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(dt.UTC)
        except ValueError:
            return Ellipsis
    if kind == "inner":
        return {"a": value.get("a")}
    if kind in ("string", "maybe") and not isinstance(value, str):
        return text_of(value)
    return value


def reference(payload: bytes, properties: dict[str, str], schema: dict[str, Any], columns: list[str]) -> Any:
    """The row of a record under its writer schema, or None when it does not fit."""
    loaded = json.loads(payload[5:], parse_float=Decimal)
    if not jsonschema.Draft7Validator(as_decoded(schema)).is_valid(loaded):
        return None
    row = {}
    for column in columns:
        value = expected(properties[column], loaded.get(column)) if column in properties else None
        if value is Ellipsis:
            return None
        row[column] = value
    return row


def framed(schema_id: int, text: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + text


BAD: Final = [None, b"\x00\x00\x00", b"\x00\x7f\xff\xff\xff{}", b"{}"]


@settings(max_examples=60, deadline=None)
@given(st.data(), versions())
def test_a_record_decodes_to_what_its_writer_schema_declares_whatever_came_after(
    data: st.DataObject, sequence: list[dict[str, str]]
) -> None:
    registry = RegistrySettings.of(f"mock://{uuid.uuid4().hex}")
    client = registry_client(registry)
    later = {name: kind for properties in sequence for name, kind in properties.items()}
    written: list[tuple[bytes, dict[str, str], dict[str, Any]]] = []
    parser: RegistryBatchParser | None = None
    for version, properties in enumerate(sequence, start=1):
        schema = schema_of(properties, version)
        schema_id = client.register_schema(f"{TOPIC}-value", Schema(json.dumps(schema), "JSON"))
        for text in data.draw(st.lists(record(properties, later), min_size=1, max_size=4)):
            written.append((framed(schema_id, text), properties, schema))
        if parser is None:  # the job starts after the first version
            parser = registry_parser(registry, RegistrySubject(RegistryFormat.JSON_SCHEMA, f"{TOPIC}-value"))
    assert parser is not None
    mixed = data.draw(st.permutations([*written, *[(bad, None, None) for bad in BAD]]))
    decoding = next_decoding(parser)
    columns = parser.table_schema.names
    # Every property any version declared is a column (an intermediate version's too): no value is left unread.
    assert set(later) <= set(columns)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schema_registry, "SCHEMA_ID_LAG_SECONDS", 0.05)  # the unknown id of BAD
        decoded = decoding.decoder.decode(kafka_batch([payload for payload, _, _ in mixed]))
        alone = [decoding.decoder.decode(kafka_batch([payload])) for payload, _, _ in mixed]

    rows = iter(decoded.rows.to_pylist())
    misfits = set(decoded.misfits.column("offset").to_pylist())
    for index, (payload, properties, schema) in enumerate(mixed):
        expected_row = None if properties is None else reference(payload, properties, schema, columns)
        if expected_row is None:
            assert FIRST_OFFSET + index in misfits and alone[index].misfits.num_rows == 1, payload
            continue
        assert next(rows) == expected_row, payload
        assert alone[index].rows.to_pylist() == [expected_row]
    # A later version changes nothing of what the records written before decode to.
    final = {**sequence[-1], "later": "string"}
    client.register_schema(f"{TOPIC}-value", Schema(json.dumps(schema_of(final, len(sequence) + 1)), "JSON"))
    again = next_decoding(parser).decoder.decode(kafka_batch([p for p, props, _ in mixed if props is not None]))
    assert again.rows.drop_columns(["later"]).to_pylist() == decoded.rows.to_pylist()
