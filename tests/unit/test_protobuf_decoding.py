"""Protobuf values written by confluent-kafka's own serializer, decoded into Arrow columns with message classes
built from the registry's schemas: every type, evolution across versions, imports, and the records that do not
fit, with where and why."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.message import Message

from spark_writer.formats import schema_registry
from spark_writer.formats.record_decoding import BadRecordError
from spark_writer.formats.registry_decoding import UnsupportedSchemaError
from spark_writer.formats.registry_subjects import RegistryFormat, RegistrySubject
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.sink.registry_records import RegistryBatchParser
from tests.fixtures.registry_records import (
    FIRST_OFFSET,
    compile_proto,
    kafka_batch,
    next_decoding,
    reasons,
    registry_parser,
)

ORDER_V1 = """
    syntax = "proto3";
    package shop;
    message Order {
      int64 order_id = 1;
      double amount = 2;
      string customer = 3;
    }
    message Refund {
      int64 order_id = 1;
    }
"""
ORDER_V2 = """
    syntax = "proto3";
    package shop;
    message Order {
      int64 order_id = 1;
      double amount = 2;
      string customer = 3;
      optional string coupon = 4;
      repeated string tags = 5;
    }
    message Refund {
      int64 order_id = 1;
    }
"""
EVERYTHING = """
    syntax = "proto3";
    package shop;
    import "google/protobuf/timestamp.proto";
    import "google/protobuf/wrappers.proto";
    enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }
    message Item { string sku = 1; int32 qty = 2; }
    message Everything {
      double f_double = 1;
      float f_float = 2;
      int32 f_int32 = 3;
      int64 f_int64 = 4;
      uint32 f_uint32 = 5;
      uint64 f_uint64 = 6;
      sint32 f_sint32 = 7;
      sint64 f_sint64 = 8;
      fixed32 f_fixed32 = 9;
      fixed64 f_fixed64 = 10;
      sfixed32 f_sfixed32 = 11;
      sfixed64 f_sfixed64 = 12;
      bool f_bool = 13;
      string f_string = 14;
      bytes f_bytes = 15;
      Color color = 16;
      Item item = 17;
      Item no_item = 18;
      repeated int64 numbers = 19;
      repeated Item items = 20;
      map<string, int64> counts = 21;
      map<string, Item> by_sku = 22;
      google.protobuf.Timestamp at = 23;
      google.protobuf.Int64Value maybe_number = 24;
      google.protobuf.StringValue maybe_text = 25;
      optional string optional_text = 26;
      string plain_text = 27;
      oneof choice { string name = 28; int64 number = 29; }
    }
"""


def serialize(
    registry: RegistrySettings, topic: str, message: Message, field: MessageField = MessageField.VALUE
) -> bytes:
    write = ProtobufSerializer(type(message), registry_client(registry))
    value: bytes = write(message, SerializationContext(topic, field))
    return value


def unique_topic() -> str:
    return f"orders-{uuid.uuid4().hex[:12]}"


def parser(registry: RegistrySettings, topic: str, **options: Any) -> RegistryBatchParser:
    message = options.pop("message", None)
    return registry_parser(registry, RegistrySubject(RegistryFormat.PROTOBUF, f"{topic}-value", message), **options)


def test_every_protobuf_type_becomes_its_arrow_column(registry: RegistrySettings, tmp_path: Path) -> None:
    classes = compile_proto(tmp_path, {"everything.proto": EVERYTHING})
    everything, item = classes["shop.Everything"], classes["shop.Item"]
    topic = unique_topic()
    message = everything(
        f_double=2.5, f_float=0.5, f_int32=-3, f_int64=2**40, f_uint32=2**32 - 1, f_uint64=2**63 - 1,
        f_sint32=-5, f_sint64=-(2**50), f_fixed32=7, f_fixed64=8, f_sfixed32=-9, f_sfixed64=-10, f_bool=True,
        f_string="héllo", f_bytes=b"\x00\xff", color=2, item=item(sku="a", qty=1), numbers=[1, 2],
        items=[item(sku="b", qty=2)], counts={"x": 1}, by_sku={"c": item(sku="c", qty=3)}, number=42,
    )  # fmt: skip
    message.at.FromDatetime(dt.datetime(2025, 3, 1, 10, 0, 0, 123456))
    message.maybe_number.value = 0
    empty = everything()
    values = [serialize(registry, topic, message), serialize(registry, topic, empty)]

    decoded = next_decoding(parser(registry, topic, message="Everything")).decoder.decode(kafka_batch(values))

    assert decoded.misfits.num_rows == 0
    item_type = pa.struct([("sku", pa.string()), ("qty", pa.int32())])
    assert dict(zip(decoded.rows.schema.names, decoded.rows.schema.types, strict=True)) == {
        "f_double": pa.float64(), "f_float": pa.float32(), "f_int32": pa.int32(), "f_int64": pa.int64(),
        "f_uint32": pa.int64(), "f_uint64": pa.int64(), "f_sint32": pa.int32(), "f_sint64": pa.int64(),
        "f_fixed32": pa.int64(), "f_fixed64": pa.int64(), "f_sfixed32": pa.int32(), "f_sfixed64": pa.int64(),
        "f_bool": pa.bool_(), "f_string": pa.string(), "f_bytes": pa.binary(), "color": pa.string(),
        "item": item_type, "no_item": item_type, "numbers": pa.list_(pa.int64()), "items": pa.list_(item_type),
        "counts": pa.map_(pa.string(), pa.int64()), "by_sku": pa.map_(pa.string(), item_type),
        "at": pa.timestamp("us", tz="UTC"), "maybe_number": pa.int64(), "maybe_text": pa.string(),
        "optional_text": pa.string(), "plain_text": pa.string(), "name": pa.string(), "number": pa.int64(),
    }  # fmt: skip
    full, default = decoded.rows.to_pylist()
    assert full == {
        "f_double": 2.5, "f_float": 0.5, "f_int32": -3, "f_int64": 2**40, "f_uint32": 2**32 - 1,
        "f_uint64": 2**63 - 1, "f_sint32": -5, "f_sint64": -(2**50), "f_fixed32": 7, "f_fixed64": 8,
        "f_sfixed32": -9, "f_sfixed64": -10, "f_bool": True, "f_string": "héllo", "f_bytes": b"\x00\xff",
        "color": "GREEN", "item": {"sku": "a", "qty": 1}, "no_item": None, "numbers": [1, 2],
        "items": [{"sku": "b", "qty": 2}], "counts": [("x", 1)], "by_sku": [("c", {"sku": "c", "qty": 3})],
        "at": dt.datetime(2025, 3, 1, 10, 0, 0, 123456, tzinfo=dt.UTC), "maybe_number": 0, "maybe_text": None,
        "optional_text": None, "plain_text": "", "name": None, "number": 42,
    }  # fmt: skip
    # Unset: a message, a wrapper, an optional field, a oneof member are null; a plain proto3 scalar its default.
    assert (default["item"], default["at"], default["maybe_number"], default["number"]) == (None, None, None, None)
    assert (default["f_int64"], default["plain_text"], default["color"], default["numbers"]) == (
        0,
        "",
        "COLOR_UNSPECIFIED",
        [],
    )


def test_records_of_older_versions_keep_their_own_fields(registry: RegistrySettings, tmp_path: Path) -> None:
    """Each record is read with its own writer schema: a field its message lacks is null (never a newer
    version's default), and the newest version's new fields become columns."""
    topic = unique_topic()
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    v1 = compile_proto(tmp_path / "v1", {"order.proto": ORDER_V1})
    old = serialize(registry, topic, v1["shop.Order"](order_id=1, amount=1.5, customer="c1"))
    evolving = parser(registry, topic)
    assert "coupon" not in evolving.table_schema.names
    v2 = compile_proto(tmp_path / "v2", {"order.proto": ORDER_V2})
    new = serialize(registry, topic, v2["shop.Order"](order_id=2, amount=2.5, customer="c2", coupon="X", tags=["t"]))

    decoded = next_decoding(evolving).decoder.decode(kafka_batch([old, new]))

    assert evolving.table_schema.names == ["order_id", "amount", "customer", "coupon", "tags"]
    assert decoded.rows.to_pylist() == [
        {"order_id": 1, "amount": 1.5, "customer": "c1", "coupon": None, "tags": None},
        {"order_id": 2, "amount": 2.5, "customer": "c2", "coupon": "X", "tags": ["t"]},
    ]


def test_bad_records_name_where_they_are_and_why(
    registry: RegistrySettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(schema_registry, "SCHEMA_ID_LAG_SECONDS", 0.2)  # the unknown id: asked again for 0.2 s
    topic = unique_topic()
    classes = compile_proto(tmp_path, {"order.proto": ORDER_V1})
    good = serialize(registry, topic, classes["shop.Order"](order_id=1, amount=1.5, customer="somebody"))
    refund = serialize(registry, topic, classes["shop.Refund"](order_id=1))
    values = [
        good,
        good[:5] + b"\x02\x02" + good[6:],  # message indexes [1]: the file's second message, Refund
        good[:-3],  # truncated inside the customer's text
        b"\x00\x7f\xff\xff\xff" + good[5:],  # an unknown schema id
        good[:5] + b"\x02\x14" + good[6:],  # message indexes [10]: no such message
        refund,
    ]
    decoding = next_decoding(parser(registry, topic))

    with pytest.raises(BadRecordError, match=f"topic orders partition 3 offset {FIRST_OFFSET + 1}: a shop.Refund"):
        decoding.start().rows(kafka_batch(values))
    why = reasons(decoding.decoder.decode(kafka_batch(values)).misfits)

    schema_id = int.from_bytes(good[1:5], "big")
    assert why[101] == f"a shop.Refund message (schema id {schema_id}), not the table's shop.Order"
    assert why[102].startswith(f"not a shop.Order message (schema id {schema_id}): ")
    assert why[103] == f"unknown schema id {0x7FFFFFFF}: the registry at {registry.safe_url} has none"
    assert why[104] == f"message indexes [10] name no message of schema id {schema_id}"
    assert why[105].startswith("a shop.Refund message")
    assert sorted(why) == [101, 102, 103, 104, 105]


def test_a_value_no_column_can_hold_does_not_fit(registry: RegistrySettings, tmp_path: Path) -> None:
    topic = unique_topic()
    proto = 'syntax = "proto3"; message Counter { uint64 total = 1; string name = 2; }'
    counter = compile_proto(tmp_path, {"counter.proto": proto})["Counter"]
    values = [serialize(registry, topic, counter(total=total, name="n")) for total in (5, 2**64 - 1)]

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch(values))

    assert decoded.rows.column("total").to_pylist() == [5]
    assert reasons(decoded.misfits)[101].startswith("a value does not fit the table's column types")


def test_imported_files_come_from_schema_references(registry: RegistrySettings, tmp_path: Path) -> None:
    topic = unique_topic()
    files = {
        "money.proto": 'syntax = "proto3"; package common; message Money { string currency = 1; int64 cents = 2; }',
        "invoice.proto": 'syntax = "proto3"; package shop; import "money.proto"; '
        "message Invoice { int64 id = 1; common.Money total = 2; }",
    }
    classes = compile_proto(tmp_path, files)
    invoice = classes["shop.Invoice"](id=7)
    invoice.total.currency, invoice.total.cents = "EUR", 1250
    value = serialize(registry, topic, invoice)

    decoded = next_decoding(parser(registry, topic)).decoder.decode(kafka_batch([value]))

    assert decoded.rows.to_pylist() == [{"id": 7, "total": {"currency": "EUR", "cents": 1250}}]


def test_a_recursive_message_and_an_unknown_message_are_refused(registry: RegistrySettings, tmp_path: Path) -> None:
    topic = unique_topic()
    proto = 'syntax = "proto3"; package tree; message Node { string name = 1; repeated Node children = 2; }'
    serialize(registry, topic, compile_proto(tmp_path, {"tree.proto": proto})["tree.Node"]())

    with pytest.raises(UnsupportedSchemaError, match=r"field children is the recursive message tree.Node"):
        parser(registry, topic)
    with pytest.raises(UnsupportedSchemaError, match=r"has no message 'Leaf'; its top-level ones: \['tree.Node'\]"):
        parser(registry, topic, message="Leaf")
