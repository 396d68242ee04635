"""Avro values written by confluent-kafka's own serializer, decoded into Arrow columns with the registry's schemas:
every type, schema evolution across versions, keys, and the records that do not fit, with where and why."""

from __future__ import annotations

import datetime as dt
import json
import pickle
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from structlog.testing import capture_logs

from spark_writer.formats import schema_registry
from spark_writer.formats.record_decoding import BadRecordError, BadRecordPolicy
from spark_writer.formats.registry_decoding import UnsupportedSchemaError
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject, SchemaChangeError
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import FIRST_OFFSET, kafka_batch, next_decoding, reasons, registry_parser
from tests.fixtures.schema_registry import SchemaRegistryServer

UTC = dt.UTC
ITEM = {"type": "record", "name": "Item", "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}
ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
    ],
}
ORDER_V2 = {
    **ORDER_V1,
    "fields": [
        *ORDER_V1["fields"],
        {"name": "coupon", "type": "string", "default": "NONE"},
        {"name": "discount", "type": ["null", "double"], "default": None},
    ],
}
EVERY_TYPE = {
    "type": "record",
    "name": "Everything",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "exact", "type": "double"},
        {"name": "text", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_millis", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_micros", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_millis", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_ts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "maybe", "type": ["null", "long"], "default": None},
        {
            "name": "address",
            "type": {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]},
        },
        {"name": "previous", "type": ["null", "Address"], "default": None},
    ],
}


def serializer(registry: RegistrySettings, schema: dict[str, Any] | str) -> AvroSerializer:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return AvroSerializer(registry_client(registry), text)


def produce(registry: RegistrySettings, topic: str, schema: dict[str, Any] | str, *values: Any) -> list[bytes]:
    write = serializer(registry, schema)
    return [write(value, SerializationContext(topic, MessageField.VALUE)) for value in values]


def unique_topic() -> str:
    """A topic of its own: a subject the external registry does not have yet."""
    return f"orders-{uuid.uuid4().hex[:12]}"


def order(order_id: int, **extra: Any) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "amount": order_id * 1.5,
        "created_at": dt.datetime(2025, 3, 1, 10, 0, order_id % 60, tzinfo=UTC),
        "note": None,
        "items": [{"sku": "a", "qty": order_id}],
        **extra,
    }


def parser(registry: RegistrySettings, topic: str, **options: Any) -> RegistryBatchParser:
    return registry_parser(registry, RegistrySubject(RegistryFormat.AVRO, f"{topic}-value"), **options)


def test_every_avro_type_becomes_its_arrow_column(registry: RegistrySettings) -> None:
    topic = unique_topic()
    record = {
        "flag": True,
        "small": -7,
        "big": 2**40,
        "ratio": 0.5,
        "exact": 2.25,
        "text": "héllo",
        "blob": b"\x00\xff",
        "digest": b"abcd",
        "color": "GREEN",
        "price": Decimal("12.34"),
        "day": dt.date(2025, 3, 1),
        "at_millis": dt.time(10, 30, 0, 123000),
        "at_micros": dt.time(10, 30, 0, 123456),
        "ts_millis": dt.datetime(2025, 3, 1, 10, 0, 0, 123000, tzinfo=UTC),
        "ts_micros": dt.datetime(2025, 3, 1, 10, 0, 0, 123456, tzinfo=UTC),
        "local_ts": dt.datetime(2025, 3, 1, 10, 0, 0, 5),
        "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "tags": ["x", "y"],
        "counts": {"a": 1},
        "maybe": None,
        "address": {"city": "Lyon"},
        "previous": {"city": "Paris"},
    }
    values = produce(registry, topic, EVERY_TYPE, record)

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch(values))

    assert decoded.misfits.num_rows == 0
    assert dict(zip(decoded.rows.schema.names, decoded.rows.schema.types, strict=True)) == {
        "flag": pa.bool_(),
        "small": pa.int32(),
        "big": pa.int64(),
        "ratio": pa.float32(),
        "exact": pa.float64(),
        "text": pa.string(),
        "blob": pa.binary(),
        "digest": pa.binary(),
        "color": pa.string(),
        "price": pa.decimal128(10, 2),
        "day": pa.date32(),
        "at_millis": pa.time64("us"),
        "at_micros": pa.time64("us"),
        "ts_millis": pa.timestamp("us", tz="UTC"),
        "ts_micros": pa.timestamp("us", tz="UTC"),
        "local_ts": pa.timestamp("us"),
        "id": pa.string(),
        "tags": pa.list_(pa.string()),
        "counts": pa.map_(pa.string(), pa.int64()),
        "maybe": pa.int64(),
        "address": pa.struct([("city", pa.string())]),
        "previous": pa.struct([("city", pa.string())]),
    }
    (row,) = decoded.rows.to_pylist()
    assert row == {**record, "counts": [("a", 1)]}


def test_records_of_older_versions_keep_their_own_fields_and_the_newests_fields_become_columns(
    registry: RegistrySettings,
) -> None:
    topic = unique_topic()
    old = produce(registry, topic, ORDER_V1, order(1), order(2))
    evolving = parser(registry, topic, kafka_metadata=True)
    assert "coupon" not in evolving.table_schema.names

    new = produce(registry, topic, ORDER_V2, order(3, coupon="SPRING", discount=0.1))
    decoded = next_decoding(evolving).decoder.decode(kafka_batch([*old, *new]))

    metadata = ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp"]
    assert evolving.table_schema.names[-6:] == ["coupon", "discount", *metadata]
    assert decoded.misfits.num_rows == 0
    rows = {row["order_id"]: row for row in decoded.rows.to_pylist()}
    # v1 records were written without coupon and discount: null (never v2's defaults); the v2 record has its values.
    expected = [(None, None), (None, None), ("SPRING", 0.1)]
    assert [(rows[i]["coupon"], rows[i]["discount"]) for i in (1, 2, 3)] == expected
    assert rows[3]["created_at"] == order(3)["created_at"]
    assert rows[2]["items"] == [{"sku": "a", "qty": 2}]


def test_without_evolution_the_table_keeps_the_version_it_started_with(registry: RegistrySettings) -> None:
    topic = unique_topic()
    produce(registry, topic, ORDER_V1, order(1))
    fixed = parser(registry, topic, evolve=False)
    new = produce(registry, topic, ORDER_V2, order(2, coupon="SPRING"))

    decoded = next_decoding(fixed).decoder.decode(kafka_batch(new))

    assert "coupon" not in fixed.table_schema.names
    assert decoded.rows.column("order_id").to_pylist() == [2]


def test_a_newer_version_that_changes_a_columns_type_fails_the_batch(registry: RegistrySettings) -> None:
    topic = unique_topic()
    produce(registry, topic, ORDER_V1, order(1))
    evolving = parser(registry, topic)
    if not registry.url.startswith("mock://"):  # the in-memory registry checks no compatibility (nor sets it)
        registry_client(registry).set_compatibility(f"{topic}-value", "NONE")
    changed = {**ORDER_V1, "fields": [{"name": "order_id", "type": "string"}, *ORDER_V1["fields"][1:]]}
    produce(registry, topic, changed, {**order(2), "order_id": "two"})

    with pytest.raises(SchemaChangeError, match=r"field order_id is string in the latest version, .* column is int64"):
        next_decoding(evolving)


def test_bad_records_fail_the_batch_naming_topic_partition_offset_and_why(
    registry: RegistrySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema_registry, "SCHEMA_ID_LAG_SECONDS", 0.2)  # the unknown id: asked again for 0.2 s
    topic = unique_topic()
    (good,) = produce(registry, topic, ORDER_V1, order(1))
    values = [
        good,
        b"\x01" + good[1:],  # another magic byte
        b"\x00\x7f\xff\xff\xff" + good[5:],  # a schema id the registry does not have
        good[:-4],  # truncated
        good + b"\x00\x00",  # bytes after the record
        b"\x00\x00",  # shorter than the header
        None,  # a tombstone
    ]
    decoding = next_decoding(parser(registry, topic))

    with pytest.raises(BadRecordError) as failure:
        decoding.start().rows(kafka_batch(values, topic="shop", partition=7))
    assert str(failure.value).startswith(
        f"a Kafka record does not fit the Avro schema of subject {topic}-value: topic shop partition 7 offset "
        f"{FIRST_OFFSET + 1}: not in the Confluent wire format: magic byte 0x01"
    )

    decoded = decoding.decoder.decode(kafka_batch(values))
    why = reasons(decoded.misfits)
    assert sorted(why) == list(range(FIRST_OFFSET + 1, FIRST_OFFSET + 7))
    assert why[101].startswith("not in the Confluent wire format: magic byte 0x01, not 0x00")
    assert why[102] == f"unknown schema id {0x7FFFFFFF}: the registry at {registry.safe_url} has none"
    assert why[103].startswith("not Avro written with schema id ")
    assert why[104].endswith("2 byte(s) left after the record")
    assert why[105] == "not in the Confluent wire format: 2 byte(s), fewer than its 5-byte header"
    assert why[106] == "tombstone: the record has no value"
    assert decoded.rows.column("order_id").to_pylist() == [1]


def test_the_null_policy_writes_bad_records_as_nulls_and_counts_them(registry: RegistrySettings) -> None:
    topic = unique_topic()
    (good,) = produce(registry, topic, ORDER_V1, order(1))
    evolving = parser(registry, topic, on_bad_record=BadRecordPolicy.NULL, kafka_metadata=True)
    task = next_decoding(evolving).start()

    rows = task.rows(kafka_batch([good, good[:-4], None]))

    assert [(row["kafka_offset"], row["order_id"]) for row in rows.to_pylist()] == [(100, 1), (101, None), (102, None)]
    summary = task.finish()
    assert (summary.bad_records, summary.records_read) == (2, 3)
    assert evolving.batch_properties(2) == {
        "sink-coordinator.bad-records": "2",
        "sink-coordinator.on-bad-record": "null",
    }


def test_keys_decode_into_a_key_column_and_an_absent_key_is_null(registry: RegistrySettings) -> None:
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V1, order(1), order(2), order(3))
    key_writer = serializer(registry, json.dumps("string"))
    keys = [key_writer(key, SerializationContext(topic, MessageField.KEY)) for key in ("one", "two")]
    keyed = registry_parser(
        registry,
        RegistrySubject(RegistryFormat.AVRO, f"{topic}-value"),
        RegistrySubject(RegistryFormat.AVRO, f"{topic}-key"),
    )

    decoded = next_decoding(keyed).decoder.decode(kafka_batch(values, keys=[*keys, None]))

    assert keyed.table_schema.field("key").type == pa.string()
    assert [(row["order_id"], row["key"]) for row in decoded.rows.to_pylist()] == [(1, "one"), (2, "two"), (3, None)]
    bad = next_decoding(keyed).decoder.decode(kafka_batch(values[:1], keys=[b"raw key"]))
    (why,) = reasons(bad.misfits).values()
    assert why.startswith("key: not in the Confluent wire format: magic byte 0x72, not 0x00")


def test_named_types_from_schema_references(registry: RegistrySettings) -> None:
    topic = unique_topic()
    client = registry_client(registry)
    client.register_schema(f"{topic}-item", Schema(json.dumps({**ITEM, "namespace": "shop"}), "AVRO"))
    items = {"name": "items", "type": {"type": "array", "items": "shop.Item"}}
    order_with_reference = {**ORDER_V1, "fields": [*ORDER_V1["fields"][:4], items]}
    reference = SchemaReference("shop.Item", f"{topic}-item", 1)
    schema = Schema(json.dumps(order_with_reference), "AVRO", [reference])
    client.register_schema(f"{topic}-value", schema)
    write = AvroSerializer(client, schema, conf={"auto.register.schemas": False, "use.latest.version": True})
    value = write(order(4), SerializationContext(topic, MessageField.VALUE))

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch([value]))

    assert decoded.rows.column("items").to_pylist() == [[{"sku": "a", "qty": 4}]]


@pytest.mark.parametrize(
    ("field_type", "refusal"),
    [
        (["null", "int", "string"], r"Avro field odd is the union \[\"null\", \"int\", \"string\"\]"),
        ({"type": "long", "logicalType": "timestamp-nanos"}, "Avro field odd is timestamp-nanos"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "at most 38 digits"),
        ({"type": "array", "items": "Node"}, r"Avro field odd\[\] is a recursive record \(Node\)"),
    ],
)
def test_types_no_column_can_hold_are_refused_before_the_query_starts(
    registry: RegistrySettings, field_type: Any, refusal: str
) -> None:
    topic = unique_topic()
    schema = {"type": "record", "name": "Node", "fields": [{"name": "odd", "type": field_type}]}
    registry_client(registry).register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))

    with pytest.raises(UnsupportedSchemaError, match=refusal):
        parser(registry, topic)


def test_a_subject_the_registry_does_not_have_is_refused_saying_so(registry: RegistrySettings) -> None:
    with pytest.raises(ValueError, match="subject nowhere-value is not in the schema registry at"):
        parser(registry, "nowhere")


def test_the_decoding_travels_to_the_executors_without_a_registry_client(registry: RegistrySettings) -> None:
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V1, order(1))
    decoding = next_decoding(parser(registry, topic))
    decoding.decoder.decode(kafka_batch(values))  # builds the cached reader schema

    shipped = pickle.dumps(decoding)

    assert b"SchemaRegistryClient" not in shipped and b"httpx" not in shipped
    assert pickle.loads(shipped).decoder.decode(kafka_batch(values)).rows.column("order_id").to_pylist() == [1]


def test_a_timestamp_keeps_its_instant_when_a_newer_version_changes_its_unit(registry: RegistrySettings) -> None:
    topic = unique_topic()
    (v1_record,) = produce(registry, topic, ORDER_V1, order(1))  # created_at in timestamp-millis
    evolving = parser(registry, topic)
    if not registry.url.startswith("mock://"):
        registry_client(registry).set_compatibility(f"{topic}-value", "NONE")
    micros = {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}}
    v2 = {**ORDER_V1, "fields": [ORDER_V1["fields"][0], ORDER_V1["fields"][1], micros, *ORDER_V1["fields"][3:]]}
    (v2_record,) = produce(registry, topic, v2, order(2))

    decoded = next_decoding(evolving).decoder.decode(kafka_batch([v1_record, v2_record]))

    assert decoded.misfits.num_rows == 0
    assert decoded.rows.column("created_at").to_pylist() == [order(1)["created_at"], order(2)["created_at"]]


def test_a_record_keeps_the_value_of_a_field_a_newer_version_drops(registry: RegistrySettings) -> None:
    topic = unique_topic()
    (v1_record,) = produce(registry, topic, ORDER_V1, order(1, note="hello"))
    evolving = parser(registry, topic)
    before = next_decoding(evolving).decoder.decode(kafka_batch([v1_record])).rows.to_pylist()
    without_note = {**ORDER_V1, "fields": [f for f in ORDER_V1["fields"] if f["name"] != "note"]}
    produce(registry, topic, without_note, {k: v for k, v in order(2).items() if k != "note"})

    again = next_decoding(evolving).decoder.decode(kafka_batch([v1_record])).rows.to_pylist()

    assert before == again  # a re-run of the batch after v2 is registered gives the same row
    assert again[0]["note"] == "hello"


def test_a_restart_after_a_version_dropped_a_field_keeps_it_a_column(registry: RegistrySettings) -> None:
    """A record decodes to the same row whether its batch runs before a restart or after it, the newest version
    registered meanwhile lacking one of its fields (found by tests/torture/schema_churn.py)."""
    topic = unique_topic()
    (v1_record,) = produce(registry, topic, ORDER_V1, order(1, note="hello"))
    before = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch([v1_record])).rows.to_pylist()
    without_note = {**ORDER_V1, "fields": [f for f in ORDER_V1["fields"] if f["name"] != "note"]}
    produce(registry, topic, without_note, {k: v for k, v in order(2).items() if k != "note"})

    restarted = parser(registry, topic)
    after = next_decoding(restarted).decoder.decode(kafka_batch([v1_record])).rows.to_pylist()

    assert "note" in restarted.table_schema.names
    assert after == before
    assert after[0]["note"] == "hello"


def test_a_field_a_record_was_written_without_is_null_whatever_later_versions_say(registry: RegistrySettings) -> None:
    topic = unique_topic()
    (v1_record,) = produce(registry, topic, ORDER_V1, order(1))
    evolving = parser(registry, topic)
    produce(registry, topic, ORDER_V2, order(2, coupon="SPRING"))  # coupon's default is "NONE"

    (row,) = next_decoding(evolving).decoder.decode(kafka_batch([v1_record])).rows.to_pylist()

    assert (row["coupon"], row["discount"]) == (None, None)


def test_an_older_versions_field_is_widened_to_its_column_or_does_not_fit(registry: RegistrySettings) -> None:
    topic = unique_topic()
    if not registry.url.startswith("mock://"):
        registry_client(registry).set_compatibility(f"{topic}-value", "NONE")
    as_int = {**ORDER_V1, "fields": [{"name": "order_id", "type": "int"}, *ORDER_V1["fields"][1:]]}
    as_text = {**ORDER_V1, "fields": [{"name": "order_id", "type": "string"}, *ORDER_V1["fields"][1:]]}
    (narrow,) = produce(registry, topic, as_int, order(1))
    (text,) = produce(registry, topic, as_text, {**order(2), "order_id": "2"})
    (current,) = produce(registry, topic, ORDER_V1, order(3))  # order_id long: the table's column

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch([narrow, text, current]))

    assert decoded.rows.column("order_id").to_pylist() == [1, 3]
    (why,) = reasons(decoded.misfits).values()
    assert "field order_id is written as string, which the table's column, int64, cannot take as written" in why


def test_a_schema_id_a_lagging_registry_does_not_know_yet_is_asked_again(
    registry: RegistrySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic()
    produce(registry, topic, ORDER_V1, order(1))
    fixed = parser(registry, topic, evolve=False, on_bad_record=BadRecordPolicy.NULL)
    unique_v2 = {**ORDER_V2, "doc": topic}  # a schema id of its own, which no process has asked for yet
    (just_registered,) = produce(registry, topic, unique_v2, order(2, coupon="SPRING"))
    client = registry_client(registry)
    answer = client.get_schema
    lagging = [SchemaRegistryError(404, 40403, "Schema not found"), SchemaRegistryError(404, 40403, "Schema not found")]

    def replica(*args: Any, **kwargs: Any) -> Schema:
        if lagging:
            raise lagging.pop(0)
        return answer(*args, **kwargs)

    monkeypatch.setattr(client, "get_schema", replica)
    task = next_decoding(fixed).start()

    rows = task.rows(kafka_batch([just_registered]))

    assert task.bad_records == 0 and not lagging
    assert rows.column("order_id").to_pylist() == [2]


def test_a_deleted_subject_keeps_the_stream_decoding_with_the_versions_known(registry: RegistrySettings) -> None:
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V1, order(1), order(2))
    evolving = parser(registry, topic)
    next_decoding(evolving).decoder.decode(kafka_batch(values))  # this process now knows the schema by its id
    registry_client(registry).delete_subject(f"{topic}-value")

    with capture_logs() as logs:
        decoded = next_decoding(evolving).decoder.decode(kafka_batch(values))

    assert decoded.rows.column("order_id").to_pylist() == [1, 2]
    assert [line["log_level"] for line in logs if line["event"] == "schema registry subject deleted"] == ["error"]


def test_a_restart_after_the_subject_was_deleted_follows_its_last_version(
    local_registry_server: SchemaRegistryServer,
) -> None:
    registry = RegistrySettings.of(local_registry_server.url)
    topic = unique_topic()
    values = produce(registry, topic, ORDER_V2, order(1, coupon="SPRING"))
    registry_client(registry).delete_subject(f"{topic}-value")  # soft: its versions stay, marked deleted

    with capture_logs() as logs:
        restarted = parser(registry, topic)

    assert restarted.table_schema.names[-2:] == ["coupon", "discount"]
    assert next_decoding(restarted).decoder.decode(kafka_batch(values)).rows.column("coupon").to_pylist() == ["SPRING"]
    assert [line["event"] for line in logs].count("schema registry subject deleted") == 1
    registry_client(registry).delete_subject(f"{topic}-value", permanent=True)
    with pytest.raises(ValueError, match="not even among its deleted subjects"):
        parser(registry, topic)


def test_a_field_of_a_version_between_two_batches_is_a_column(registry: RegistrySettings) -> None:
    """v2 adds coupon and v3 drops it again before the next batch: v2's records still have their coupons read."""
    topic = unique_topic()
    produce(registry, topic, ORDER_V1, order(1))
    evolving = parser(registry, topic)
    (with_coupon,) = produce(registry, topic, ORDER_V2, order(2, coupon="SPRING"))
    produce(registry, topic, {**ORDER_V1, "doc": "v3: v1 again"}, order(3))

    decoded = next_decoding(evolving).decoder.decode(kafka_batch([with_coupon]))

    assert decoded.rows.column("coupon").to_pylist() == ["SPRING"]
