"""JSON Schema values written by confluent-kafka's own serializer, decoded into Arrow columns as the JSON decoder
decodes JSON: the schema's types, evolution across versions, and the records that do not fit, with where and why."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from spark_writer.formats import schema_registry
from spark_writer.formats.record_decoding import BadRecordError
from spark_writer.formats.registry_decoding import UnsupportedSchemaError
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import FIRST_OFFSET, kafka_batch, next_decoding, reasons, registry_parser

ORDER_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "blob": {"type": "string", "contentEncoding": "base64"},
        "note": {"type": ["string", "null"]},
        "status": {"enum": ["NEW", "PAID"]},
        "items": {"type": "array", "items": {"$ref": "#/definitions/Item"}},
        "customer": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/Customer"}]},
        "small": {"type": "integer", "connect.type": "int32"},
    },
    "required": ["order_id"],
    "definitions": {
        "Item": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}},
        "Customer": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
}
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "coupon": {"type": "string"}}}


def unique_topic() -> str:
    return f"orders-{uuid.uuid4().hex[:12]}"


def produce(registry: RegistrySettings, topic: str, schema: dict[str, Any], *values: dict[str, Any]) -> list[bytes]:
    write = JSONSerializer(json.dumps(schema), registry_client(registry))
    return [write(value, SerializationContext(topic, MessageField.VALUE)) for value in values]


def parser(registry: RegistrySettings, topic: str, **options: Any) -> RegistryBatchParser:
    return registry_parser(registry, RegistrySubject(RegistryFormat.JSON_SCHEMA, f"{topic}-value"), **options)


def order(order_id: int, **extra: Any) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "amount": 1.5,
        "paid": True,
        "created_at": "2025-03-01T10:00:00.5+01:00",
        "day": "2025-03-01",
        "blob": "AP8=",
        "note": None,
        "status": "NEW",
        "items": [{"sku": "a", "qty": order_id}],
        "customer": {"name": "Ann"},
        "small": 7,
        **extra,
    }


def test_json_schema_types_become_their_columns(registry: RegistrySettings) -> None:
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V1, order(1))

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch(values))

    assert decoded.misfits.num_rows == 0
    assert [str(t) for t in decoded.rows.schema.types] == [
        "int64", "double", "bool", "timestamp[us, tz=UTC]", "date32[day]", "binary", "string", "string",
        "list<item: struct<sku: string, qty: int64>>", "struct<name: string>", "int32",
    ]  # fmt: skip
    assert decoded.rows.to_pylist() == [
        {
            "order_id": 1,
            "amount": 1.5,
            "paid": True,
            "created_at": dt.datetime(2025, 3, 1, 9, 0, 0, 500000, tzinfo=dt.UTC),
            "day": dt.date(2025, 3, 1),
            "blob": b"\x00\xff",
            "note": None,
            "status": "NEW",
            "items": [{"sku": "a", "qty": 1}],
            "customer": {"name": "Ann"},
            "small": 7,
        }
    ]


def test_a_new_property_in_a_new_version_becomes_a_column(registry: RegistrySettings) -> None:
    topic = unique_topic()
    old = produce(registry, topic, ORDER_V1, order(1))
    evolving = parser(registry, topic)
    new = produce(registry, topic, ORDER_V2, order(2, coupon="SPRING"))

    decoded = next_decoding(evolving).decoder.decode(kafka_batch([*old, *new]))

    assert evolving.table_schema.names[-1] == "coupon"
    assert [(r["order_id"], r["coupon"]) for r in decoded.rows.to_pylist()] == [(1, None), (2, "SPRING")]


def test_bad_records_say_where_and_why(registry: RegistrySettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_registry, "SCHEMA_ID_LAG_SECONDS", 0.2)  # the unknown id: asked again for 0.2 s
    topic = unique_topic()
    (good,) = produce(registry, topic, ORDER_V1, order(1))
    header = good[:5]
    values = [
        good,
        header + b'{"order_id": 2, "amount": "a lot"}',
        header + b"not json",
        header + b"[1, 2]",
        b"\x00\x7f\xff\xff\xff" + good[5:],
    ]
    decoding = next_decoding(parser(registry, topic))

    with pytest.raises(BadRecordError) as failure:
        decoding.start().rows(kafka_batch(values))
    assert (
        f"does not fit the JSON Schema of subject {topic}-value: topic orders partition 3 offset "
        f"{FIRST_OFFSET + 1}: fields whose value does not fit the schema: amount (double)" in str(failure.value)
    )
    decoded = decoding.decoder.decode(kafka_batch(values))
    assert reasons(decoded.misfits) == {
        101: "fields whose value does not fit the schema: amount (double)",
        102: "not valid JSON",
        103: "a JSON value that is not an object",
        104: f"unknown schema id {0x7FFFFFFF}: the registry at {registry.safe_url} has none",
    }
    assert decoded.rows.column("order_id").to_pylist() == [1]


@pytest.mark.parametrize(
    ("schema", "refusal"),
    [
        ({"type": "object", "properties": {"tags": {"type": "object"}}}, "field tags is an object without properties"),
        (
            {"type": "object", "properties": {"id": {"type": ["integer", "string"]}}},
            r"field id has the types \['integer', 'string'\]",
        ),
        (
            {"type": "object", "properties": {"x": {"$ref": "other.json#/X"}}},
            "field x refers to 'other.json#/X': only references within the schema",
        ),
        ({"type": "array", "items": {"type": "integer"}}, "its values are list<item: int64>, not objects"),
    ],
)
def test_schemas_no_table_can_hold_are_refused_before_the_query_starts(
    registry: RegistrySettings, schema: dict[str, Any], refusal: str
) -> None:
    topic = unique_topic()
    registry_client(registry).register_schema(f"{topic}-value", Schema(json.dumps(schema), "JSON"))

    with pytest.raises(UnsupportedSchemaError, match=refusal):
        parser(registry, topic)


def test_an_integer_beyond_int64_does_not_fit(registry: RegistrySettings) -> None:
    """A JSON Schema "integer" is a bigint column: a larger number is a bad record, not a wrapped one."""
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V1, order(1), order(2**64, items=[]))

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch(values))

    assert decoded.rows.column("order_id").to_pylist() == [1]
    assert reasons(decoded.misfits) == {101: "fields whose value does not fit the schema: order_id (bigint)"}


def test_a_subject_of_another_format_is_refused_naming_its_format(registry: RegistrySettings) -> None:
    topic = unique_topic()
    avro = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "long"}]}
    registry_client(registry).register_schema(f"{topic}-value", Schema(json.dumps(avro), "AVRO"))

    with pytest.raises(
        ValueError, match=f"subject {topic}-value holds AVRO schemas, not JSON ones: pass --format avro"
    ):
        parser(registry, topic)
