"""An upsert or change stream's records decoded into rows with their op (spark_writer.mutations.decoding): plain
upserts and tombstones, a flat change with an op field, Debezium's envelope in JSON (both of Kafka Connect's forms)
and in Avro from a schema registry, and the records that do not fit."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_writer.arrow_schema import arrow_schema_of
from spark_writer.formats.decoded_batch import REASON_COLUMN
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject, key_values
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA
from spark_writer.mutations.decoding import json_value_schema
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations, Op, parse_op_map
from spark_writer.mutations.mutation_parser import MutationParser
from spark_writer.mutations.reduction import OP_COLUMN
from spark_writer.sink.kafka_records import JsonBatchParser
from tests.fixtures.registry_records import registry_parser

ROW = StructType(
    [StructField("id", LongType(), False), StructField("name", StringType()), StructField("op", StringType())]
)
KAFKA_TIME = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def kafka(records: list[tuple[Any, Any]], topic: str = "t") -> pa.RecordBatch:
    """Kafka records (key, value) of one partition, in offset order; a dict is JSON, None a tombstone."""

    def encoded(value: Any) -> bytes | None:
        return value if value is None or isinstance(value, bytes) else json.dumps(value).encode()

    rows = [
        {
            "key": encoded(key),
            "value": encoded(value),
            "topic": topic,
            "partition": 0,
            "offset": offset,
            "timestamp": KAFKA_TIME,
            "timestampType": 0,
            "headers": [],
        }
        for offset, (key, value) in enumerate(records)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=KAFKA_ARROW_SCHEMA)


def json_parser(mutations: Mutations, row: StructType = ROW) -> MutationParser:
    values = from_arrow_schema(json_value_schema(arrow_schema_of(row), mutations))
    return MutationParser(JsonBatchParser(values, evolve=False, read_keys=True), mutations)


def decoded(parser: MutationParser, batch: pa.RecordBatch) -> tuple[list[dict[str, Any]], list[str]]:
    decoder = parser.decoding.decoder
    result = decoder.decode(batch)
    rows = [
        {**{name: row[name] for name in ("id", "name") if name in row}, "op": Op(row[OP_COLUMN]).name.lower()}
        for row in result.rows.to_pylist()
    ]
    return rows, [row[REASON_COLUMN] for row in result.misfits.to_pylist()]


UPSERT = Mutations(MutationMode.UPSERT, ("id",))


def test_an_upsert_streams_records_are_rows_and_its_tombstones_delete_their_keys() -> None:
    parser = json_parser(UPSERT)
    batch = kafka(
        [
            ({"id": 1}, {"id": 1, "name": "a"}),
            ({"id": 2}, None),
            ({"schema": {}, "payload": {"id": 3}}, None),  # the JSON converter's form of a key
            ({"nope": 1}, None),  # a tombstone whose key lacks the key column
            ({"id": 4}, {"name": "no key"}),
        ]
    )
    rows, reasons = decoded(parser, batch)
    assert rows == [
        {"id": 1, "name": "a", "op": "upsert"},
        {"id": 2, "name": None, "op": "delete"},
        {"id": 3, "name": None, "op": "delete"},
    ]
    assert reasons == [
        "tombstone key: key column id is null: a row of a keyed table has its whole key",
        "key column id is null: a row of a keyed table has its whole key",
    ]
    assert parser.table_schema.field("id").nullable is False


def test_a_change_streams_op_field_is_mapped() -> None:
    mutations = Mutations(MutationMode.CDC, ("id",), op_field="op", op_map=parse_op_map("I=upsert,D=delete"))
    batch = kafka([(None, {"id": 1, "op": "I"}), (None, {"id": 1, "op": "D"}), (None, {"id": 2, "op": "X"})])
    rows, reasons = decoded(json_parser(mutations), batch)
    assert rows == [{"id": 1, "name": None, "op": "upsert"}, {"id": 1, "name": None, "op": "delete"}]
    assert reasons == ["op 'X' is not in --op-map (I=upsert,D=delete)"]


DEBEZIUM = Mutations(MutationMode.CDC, ("id",), envelope=Envelope.DEBEZIUM)
ROW_NO_OP = StructType([StructField("id", LongType(), False), StructField("name", StringType())])


def test_debezium_json_in_both_forms_gives_after_or_before_by_op() -> None:
    def envelope(op: str, before: Any, after: Any) -> dict[str, Any]:
        return {"before": before, "after": after, "op": op, "source": {"db": "shop"}, "ts_ms": 1}

    batch = kafka(
        [
            ({"id": 1}, envelope("c", None, {"id": 1, "name": "new"})),
            ({"id": 1}, {"schema": {"type": "struct"}, "payload": envelope("u", {"id": 1}, {"id": 1, "name": "x"})}),
            ({"id": 2}, envelope("r", None, {"id": 2, "name": "snap"})),
            ({"id": 2}, envelope("d", {"id": 2, "name": "snap"}, None)),
            ({"id": 2}, None),  # Debezium's tombstone after a delete
            ({"id": 3}, envelope("d", None, None)),
            ({"id": 4}, envelope("t", None, None)),
        ]
    )
    rows, reasons = decoded(json_parser(DEBEZIUM, ROW_NO_OP), batch)
    assert rows == [
        {"id": 1, "name": "new", "op": "upsert"},
        {"id": 1, "name": "x", "op": "upsert"},
        {"id": 2, "name": "snap", "op": "upsert"},
        {"id": 2, "name": "snap", "op": "delete"},
        {"id": 2, "name": None, "op": "delete"},
    ]
    assert reasons == [
        "a delete without its before image",
        "op 't' is not in --op-map (c=upsert,r=upsert,u=upsert,d=delete,I=upsert,U=upsert,D=delete)",
    ]
    assert json_parser(DEBEZIUM, ROW_NO_OP).table_schema.names == ["id", "name"]


AVRO_VALUE = {"type": "record", "name": "Value", "namespace": "shop.orders", "fields": [
    {"name": "id", "type": "long"}, {"name": "status", "type": ["null", "string"], "default": None}]}  # fmt: skip
AVRO_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.orders",
    "fields": [
        {"name": "before", "type": ["null", AVRO_VALUE], "default": None},
        {"name": "after", "type": ["null", "shop.orders.Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [{"name": "db", "type": "string"}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
AVRO_KEY = {"type": "record", "name": "Key", "namespace": "shop.orders", "fields": [{"name": "id", "type": "long"}]}


def test_debezium_avro_from_a_registry_gives_after_or_before_by_op() -> None:
    registry = RegistrySettings.of("mock://debezium-avro")
    client = registry_client(registry)
    client.register_schema("orders-value", Schema(json.dumps(AVRO_ENVELOPE), "AVRO"))
    client.register_schema("orders-key", Schema(json.dumps(AVRO_KEY), "AVRO"))
    value = AvroSerializer(client, json.dumps(AVRO_ENVELOPE))
    key = AvroSerializer(client, json.dumps(AVRO_KEY))
    values = SerializationContext("orders", MessageField.VALUE)
    keys = SerializationContext("orders", MessageField.KEY)
    inner = registry_parser(
        registry, RegistrySubject(RegistryFormat.AVRO, "orders-value"), evolve=False, read_keys=True
    )
    parser = MutationParser(
        inner, DEBEZIUM, registry_keys=key_values(registry, RegistrySubject(RegistryFormat.AVRO, "orders-key"))
    )
    assert parser.table_schema.names == ["id", "status"]
    assert parser.table_schema.field("id").nullable is False

    def change(op: str, before: Any, after: Any) -> bytes:
        encoded = value({"before": before, "after": after, "source": {"db": "shop"}, "op": op, "ts_ms": 1}, values)
        assert encoded is not None
        return encoded

    batch = kafka(
        [
            (key({"id": 7}, keys), change("c", None, {"id": 7, "status": "new"})),
            (key({"id": 7}, keys), change("u", {"id": 7, "status": "new"}, {"id": 7, "status": "paid"})),
            (key({"id": 7}, keys), change("d", {"id": 7, "status": "paid"}, None)),
            (key({"id": 7}, keys), None),
            (b"not avro", None),
        ]
    )
    rows, reasons = decoded(parser, batch)
    assert [(row["id"], row["op"]) for row in rows] == [(7, "upsert"), (7, "upsert"), (7, "delete"), (7, "delete")]
    assert len(reasons) == 1 and reasons[0].startswith("tombstone key: ")


@pytest.mark.parametrize(
    ("row", "mutations", "message"),
    [
        (ROW, Mutations(MutationMode.UPSERT, ("name",)), "declare it NOT NULL"),
        (ROW, Mutations(MutationMode.UPSERT, ("missing",)), "--key 'missing' is not a column"),
        (ROW, Mutations(MutationMode.CDC, ("id",), op_field="absent"), "--op-field 'absent' is not a column"),
    ],
)
def test_a_key_or_op_field_the_schema_cannot_have_is_refused(
    row: StructType, mutations: Mutations, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        mutations.table_schema(arrow_schema_of(row), declares_nullability=True)
