"""Avro, Protobuf and JSON Schema topics through the whole pipeline: produced by confluent-kafka's serializers
against a schema registry over HTTP, decoded by the job's Spark tasks, every record once in the table with its
values; a new schema version mid-stream becomes a column; bad records go to the dead-letter topic."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, RecordFormat, SinkSettings
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_reader import read_range
from spark_writer.sink.sink_query import IcebergSinkQuery
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import produce_records
from tests.fixtures.pipeline import kafka_positions, produced_positions, table_arrow
from tests.fixtures.registry_records import compile_proto
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
RECORDS = 600
PARTITIONS = 2
ITEM = {"type": "record", "name": "Item", "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}
AVRO_ORDER: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
    ],
}
AVRO_ORDER_V2 = {
    **AVRO_ORDER,
    "fields": [*AVRO_ORDER["fields"], {"name": "coupon", "type": "string", "default": "NONE"}],
}
PROTO_ORDER = """
    syntax = "proto3";
    package shop;
    import "google/protobuf/timestamp.proto";
    message Item { string sku = 1; int32 qty = 2; }
    message Order {
      int64 order_id = 1;
      double amount = 2;
      google.protobuf.Timestamp created_at = 3;
      repeated Item items = 4;
      map<string, string> labels = 5;
    }
"""
JSON_ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "amount": {"type": "number"},
        "created_at": {"type": "string", "format": "date-time"},
        "items": {
            "type": "array",
            "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}},
        },
    },
}


def created_at(order_id: int) -> dt.datetime:
    return dt.datetime(2025, 3, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=order_id, microseconds=order_id)


def order(order_id: int) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "amount": order_id * 1.25,
        "created_at": created_at(order_id),
        "items": [{"sku": f"s{order_id}", "qty": order_id % 7}],
    }


def value_context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def table_name(topic: str) -> str:
    return f"shop.{topic.replace('-', '_')}"


def start(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    parse: ParseSettings,
) -> IcebergSinkQuery:
    return start_job(
        spark,
        KafkaSettings(bootstrap, (topic,), max_offsets_per_trigger=RECORDS // 3),
        parse,
        SinkSettings(
            sink=topic,
            table=table_name(topic),
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
        ),
    )


def drain(running: IcebergSinkQuery) -> None:
    """Process every record the topic holds, then stop (the query stays between batches until then)."""
    running.query.processAllAvailable()
    running.stop()


def test_avro_values_and_keys_land_once_with_their_values(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    registry_url: str,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    client = registry_client(RegistrySettings.of(registry_url))
    write_value = AvroSerializer(client, json.dumps(AVRO_ORDER))
    write_key = AvroSerializer(client, json.dumps("long"))
    key_context = SerializationContext(topic, MessageField.KEY)
    produced = produce_records(
        kafka_bootstrap,
        topic,
        (
            (i % PARTITIONS, write_key(i, key_context), write_value(order(i), value_context(topic)))
            for i in range(RECORDS)
        ),
    )
    parse = ParseSettings(
        RecordFormat.AVRO, schema_registry_url=registry_url, decode_key=True, kafka_metadata=True, evolve_schema=False
    )

    drain(start(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse))

    assert kafka_positions(catalog, table_name(topic)) == produced_positions(produced)
    rows = table_arrow(catalog, table_name(topic), ("key", "order_id", "amount", "created_at", "items")).to_pylist()
    assert {row["order_id"]: row for row in rows} == {i: {"key": i, **order(i)} for i in range(RECORDS)}
    assert_verified(coordinator.database_url, catalog, topic, kafka_bootstrap)


def test_a_new_avro_version_mid_stream_becomes_a_column(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    registry_url: str,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    client = registry_client(RegistrySettings.of(registry_url))
    write_v1 = AvroSerializer(client, json.dumps(AVRO_ORDER))
    first = produce_records(
        kafka_bootstrap, topic, ((i % PARTITIONS, b"k", write_v1(order(i), value_context(topic))) for i in range(100))
    )
    parse = ParseSettings(RecordFormat.AVRO, schema_registry_url=registry_url, kafka_metadata=True)
    running = start(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse)
    running.query.processAllAvailable()
    assert "coupon" not in catalog.load_table(table_name(topic)).schema().column_names

    write_v2 = AvroSerializer(client, json.dumps(AVRO_ORDER_V2))
    later = produce_records(
        kafka_bootstrap,
        topic,
        (
            (i % PARTITIONS, b"k", write_v2({**order(i), "coupon": f"c{i}"}, value_context(topic)))
            for i in range(100, 200)
        ),
    )
    # A producer still on the first version after the second one was registered.
    late = produce_records(
        kafka_bootstrap,
        topic,
        ((i % PARTITIONS, b"k", write_v1(order(i), value_context(topic))) for i in range(200, 250)),
    )
    drain(running)

    coordinator.wait_for_log("added columns to iceberg table", columns=["coupon"])
    assert kafka_positions(catalog, table_name(topic)) == produced_positions(first + later + late)
    coupons = {row["order_id"]: row["coupon"] for row in table_arrow(catalog, table_name(topic)).to_pylist()}
    assert coupons == {
        **dict.fromkeys(range(100)),  # written before the table had the column
        **{i: f"c{i}" for i in range(100, 200)},
        **dict.fromkeys(range(200, 250)),  # written with the first version, which has no coupon: null, not v2's default
    }
    assert_verified(coordinator.database_url, catalog, topic, kafka_bootstrap)


def test_protobuf_values_land_once_with_their_values(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    registry_url: str,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    classes = compile_proto(tmp_path, {"order.proto": PROTO_ORDER})
    order_class, item_class = classes["shop.Order"], classes["shop.Item"]
    write = ProtobufSerializer(order_class, registry_client(RegistrySettings.of(registry_url)))

    def message(i: int) -> bytes:
        fields = order(i)
        proto = order_class(order_id=i, amount=fields["amount"], labels={"n": str(i)})
        proto.created_at.FromDatetime(fields["created_at"])
        proto.items.append(item_class(**fields["items"][0]))
        value: bytes = write(proto, value_context(topic))
        return value

    produced = produce_records(kafka_bootstrap, topic, ((i % PARTITIONS, b"k", message(i)) for i in range(RECORDS)))
    parse = ParseSettings(
        RecordFormat.PROTOBUF,
        schema_registry_url=registry_url,
        protobuf_message="shop.Order",  # not the file's first message, Item
        kafka_metadata=True,
    )

    drain(start(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse))

    assert kafka_positions(catalog, table_name(topic)) == produced_positions(produced)
    rows = table_arrow(catalog, table_name(topic), ("order_id", "amount", "created_at", "items", "labels"))
    assert {row["order_id"]: row for row in rows.to_pylist()} == {
        i: {**order(i), "labels": [("n", str(i))]} for i in range(RECORDS)
    }
    assert_verified(coordinator.database_url, catalog, topic, kafka_bootstrap)


def test_json_schema_values_land_once_and_bad_ones_go_to_the_dead_letter_topic(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    registry_url: str,
    tmp_path: Path,
) -> None:
    topic, dead_letter_topic = kafka_topic(partitions=PARTITIONS), kafka_topic(partitions=1)
    write = JSONSerializer(json.dumps(JSON_ORDER), registry_client(RegistrySettings.of(registry_url)))

    def value(i: int) -> bytes:
        serialized: bytes = write({**order(i), "created_at": created_at(i).isoformat()}, value_context(topic))
        return serialized

    good = [(i % PARTITIONS, str(i).encode(), value(i)) for i in range(RECORDS)]
    bad = [(0, b"bad", value(0)[:5] + b"not json"), (1, b"bad", b"\x00\x7f\xff\xff\xffnot framed by this registry")]
    produced = produce_records(kafka_bootstrap, topic, [*good, *bad])
    parse = ParseSettings(
        RecordFormat.JSON_SCHEMA,
        schema_registry_url=registry_url,
        kafka_metadata=True,
        on_bad_record=BadRecordPolicy.DEAD_LETTER,
        dead_letter_topic=dead_letter_topic,
    )

    drain(start(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse))

    assert kafka_positions(catalog, table_name(topic)) == produced_positions(r for r in produced if r.key != b"bad")
    rows = table_arrow(catalog, table_name(topic), ("order_id", "amount", "created_at", "items")).to_pylist()
    assert {row["order_id"]: row for row in rows} == {i: order(i) for i in range(RECORDS)}
    options = parse_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": dead_letter_topic})
    letters = [
        row for batch in read_range(OffsetRange(dead_letter_topic, 0, 0, 2), options) for row in batch.to_pylist()
    ]
    headers = [{header["key"]: header["value"].decode() for header in row["headers"]} for row in letters]
    reasons = sorted(letter["sink-coordinator.reason"] for letter in headers)
    assert reasons[0] == "not valid JSON"
    assert reasons[1].startswith(f"unknown schema id {0x7FFFFFFF}: the registry at ")
    assert_verified(coordinator.database_url, catalog, topic, kafka_bootstrap)
