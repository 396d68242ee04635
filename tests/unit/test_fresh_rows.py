"""A fresh read's rows (spark_writer.fresh.tail_rows, with the decoding fresh_read builds from the writer's flags):
the tail decoded, reduced and routed as the sink does, merged with the table's rows. Arrow only: no broker, no
Spark session."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.contract.views import SinkState, SinkTable
from spark_writer.formats.record_decoding import BadRecordError
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.fresh.fresh_read import SinkMismatchError, checked_sink, tail_decoding
from spark_writer.fresh.sink_flags import sink_source
from spark_writer.fresh.tail_rows import fresh_rows
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA
from spark_writer.routing.routes import UnroutedRecordsError

KAFKA_TIME = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
# The table's rows as pyiceberg reads them: a keyed table's key is required.
KEYED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.large_string())])
PLAIN = pa.schema([pa.field("id", pa.int64()), pa.field("country", pa.large_string())])


def state(table: str = "shop.orders", key: tuple[str, ...] = (), tables: Iterable[str] = ()) -> SinkState:
    return SinkState(
        sink="orders",
        table=table,
        catalog="default",
        checkpointed_epoch=3,
        committed_epoch=3,
        writer_term=1,
        writer_count=1,
        tables=tuple(SinkTable(each, 3) for each in (table, *tables)),
        epochs=(),
        key_columns=key,
        incarnation="b0b0b0b0-0000-4000-8000-000000000000",
        generation=0,
    )


def kafka(records: list[tuple[Any, Any]], partition: int = 0, first_offset: int = 0) -> pa.RecordBatch:
    """Records (key, value) of one partition in offset order; a dict is JSON, None a tombstone."""

    def encoded(value: Any) -> bytes | None:
        return value if value is None or isinstance(value, bytes) else json.dumps(value).encode()

    return pa.RecordBatch.from_pylist(
        [
            {
                "key": encoded(key),
                "value": encoded(value),
                "topic": "orders",
                "partition": partition,
                "offset": first_offset + index,
                "timestamp": KAFKA_TIME,
                "timestampType": 0,
                "headers": [],
            }
            for index, (key, value) in enumerate(records)
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )


def read(
    table_rows: pa.Table, batches: list[pa.RecordBatch], sink: SinkState, read_table: str | None = None, **flags: Any
) -> list[dict[str, Any]]:
    source = sink_source({"bootstrap_servers": "127.0.0.1:1", "topic": "orders", **flags})
    decoding = tail_decoding(source, sink, read_table or sink.table, table_rows.schema)
    rows = fresh_rows(table_rows, batches, decoding)
    return sorted(rows.to_pylist(), key=lambda row: (row["id"] is None, row["id"] or 0))


def test_an_append_streams_tail_is_added_to_the_tables_rows() -> None:
    table_rows = pa.Table.from_pylist([{"id": 1, "country": "DE"}, {"id": 2, "country": "FR"}], schema=PLAIN)
    tail = [kafka([(None, {"id": 3, "country": "US"})]), kafka([(None, {"id": 4, "country": "DE", "new": 1})], 1)]
    assert read(table_rows, tail, state()) == [
        {"id": 1, "country": "DE"},
        {"id": 2, "country": "FR"},
        {"id": 3, "country": "US"},
        {"id": 4, "country": "DE"},
    ]


def test_with_kafka_metadata_the_tail_rows_carry_their_positions() -> None:
    schema = pa.schema(
        [
            *PLAIN,
            pa.field("kafka_topic", pa.large_string()),
            pa.field("kafka_partition", pa.int32()),
            pa.field("kafka_offset", pa.int64()),
            pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    table_rows = pa.Table.from_pylist([{"id": 1, "country": "DE", "kafka_partition": 0, "kafka_offset": 0}], schema)
    rows = read(table_rows, [kafka([(None, {"id": 2, "country": "FR"})], 0, 1)], state(), kafka_metadata=True)
    assert [(row["id"], row["kafka_partition"], row["kafka_offset"]) for row in rows] == [(1, 0, 0), (2, 0, 1)]
    assert rows[1]["kafka_topic"] == "orders" and rows[1]["kafka_timestamp"] == KAFKA_TIME


def test_an_upsert_streams_last_version_of_a_key_replaces_the_tables_row_and_a_tombstone_removes_it() -> None:
    table_rows = pa.Table.from_pylist(
        [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}], schema=KEYED
    )
    tail = [
        kafka([({"id": 2}, {"id": 2, "name": "B"}), ({"id": 3}, None), ({"id": 2}, {"id": 2, "name": "BB"})]),
        kafka([({"id": 4}, {"id": 4, "name": "d"}), ({"id": 5}, {"id": 5, "name": "e"}), ({"id": 5}, None)], 1),
    ]
    rows = read(table_rows, tail, state(key=("id",)), mode="upsert", key="id")
    assert rows == [{"id": 1, "name": "a"}, {"id": 2, "name": "BB"}, {"id": 4, "name": "d"}]


def test_a_change_stream_maps_its_ops_as_the_sink_does() -> None:
    schema = pa.schema([*KEYED, pa.field("op", pa.large_string())])
    table_rows = pa.Table.from_pylist([{"id": 1, "name": "a", "op": "c"}, {"id": 2, "name": "b", "op": "c"}], schema)
    tail = [kafka([(None, {"id": 1, "name": "x", "op": "D"}), (None, {"id": 2, "name": "B", "op": "U"})])]
    rows = read(table_rows, tail, state(key=("id",)), mode="cdc", key="id", op_field="op")
    assert rows == [{"id": 2, "name": "B", "op": "U"}]


def test_a_record_that_does_not_fit_fails_the_read_under_fail_as_it_fails_the_sinks_batch() -> None:
    table_rows = PLAIN.empty_table()
    bad = [kafka([(None, {"id": "not a number"})], 2, 7)]
    with pytest.raises(BadRecordError, match="partition 2 offset 7"):
        read(table_rows, bad, state())
    assert read(table_rows, bad, state(), on_bad_record="null") == [{"id": None, "country": None}]


def test_dead_letters_are_left_out_and_sent_nowhere() -> None:
    began = time.monotonic()
    # Nothing listens at the dead-letter topic's broker: a dead letter sent would wait for it and fail.
    rows = read(
        PLAIN.empty_table(),
        [kafka([(None, {"id": "bad"}), (None, {"id": 1, "country": "DE"})])],
        state(),
        on_bad_record="dead-letter",
        dead_letter_topic="orders-dlq",
    )
    assert rows == [{"id": 1, "country": "DE"}]
    assert time.monotonic() - began < 5


def test_a_fan_out_sinks_table_gets_only_the_rows_routed_to_it() -> None:
    sink = state(tables=("shop.orders_de",))
    tail = [kafka([(None, {"id": 1, "country": "DE"}), (None, {"id": 2, "country": "FR"})])]
    routes = {"route_by": "country", "route": ["DE=shop.orders_de"]}
    assert read(PLAIN.empty_table(), tail, sink, read_table="shop.orders_de", **routes) == [{"id": 1, "country": "DE"}]
    assert read(PLAIN.empty_table(), tail, sink, **routes) == [{"id": 2, "country": "FR"}], "unrouted: the sink's own"
    with pytest.raises(UnroutedRecordsError, match="'FR'"):
        read(PLAIN.empty_table(), tail, sink, unrouted="fail", **routes)


def test_a_keyed_fan_out_replaces_and_removes_rows_of_its_own_table_only() -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("region", pa.large_string(), False)])
    sink = state(key=("id", "region"), tables=("shop.orders_eu",))
    table_rows = pa.Table.from_pylist([{"id": 1, "region": "eu"}, {"id": 2, "region": "eu"}], schema)
    tail = [kafka([({"id": 2, "region": "eu"}, None), ({"id": 3, "region": "us"}, {"id": 3, "region": "us"})])]
    flags = {"mode": "upsert", "key": "id,region", "route_by": "region", "route": ["eu=shop.orders_eu"]}
    assert read(table_rows, tail, sink, read_table="shop.orders_eu", **flags) == [{"id": 1, "region": "eu"}]


def test_raw_records_are_the_kafka_columns() -> None:
    raw = pa.schema([KAFKA_ARROW_SCHEMA.field(name) for name in ("key", "value", "topic", "partition", "offset")])
    table_rows = pa.schema([*raw, KAFKA_ARROW_SCHEMA.field("timestamp")]).empty_table()
    rows = fresh_rows(
        table_rows,
        [kafka([(b"k", b"v")])],
        tail_decoding(
            sink_source({"bootstrap_servers": "b:9092", "topic": "orders", "record_format": "raw"}),
            state(),
            "shop.orders",
            table_rows.schema,
        ),
    )
    assert [(row["key"], row["value"], row["offset"]) for row in rows.to_pylist()] == [(b"k", b"v", 0)]


@pytest.mark.parametrize(
    ("table", "key", "message"),
    [
        ("shop.other", (), r"writes the table\(s\) \['shop.orders'\], not 'shop.other'"),
        ("shop.orders", ("id",), r"recorded sink orders with the key \[\], the flags give \['id'\]"),
    ],
)
def test_flags_that_are_not_the_sinks_are_refused(table: str, key: tuple[str, ...], message: str) -> None:
    with pytest.raises(SinkMismatchError, match=message):
        checked_sink(state(), table, key)
    with pytest.raises(SinkMismatchError, match=r"the key \['id'\], the flags give \[\]"):
        checked_sink(state(key=("id",)), "shop.orders", ())


def test_a_coordinator_that_does_not_say_the_incarnation_is_refused() -> None:
    older = SinkState(**{**state().__dict__, "incarnation": None})
    with pytest.raises(SinkMismatchError, match="predates fresh reads"):
        checked_sink(older, "shop.orders", ())


def test_an_avro_tail_is_decoded_each_record_by_its_writer_schema_as_the_table_follows_the_latest_version() -> None:
    registry = RegistrySettings.of("mock://fresh-avro")
    client = registry_client(registry)
    fields = [{"name": "id", "type": "long"}, {"name": "country", "type": "string"}]
    first: dict[str, Any] = {"type": "record", "name": "Order", "fields": fields}
    amount = {"name": "amount", "type": ["null", "double"], "default": None}
    second = {**first, "fields": [*first["fields"], amount]}
    values = SerializationContext("orders", MessageField.VALUE)
    client.register_schema("orders-value", Schema(json.dumps(first), "AVRO"))
    old = AvroSerializer(client, json.dumps(first), conf={"auto.register.schemas": False})(
        {"id": 2, "country": "FR"}, values
    )
    client.register_schema("orders-value", Schema(json.dumps(second), "AVRO"))
    new = AvroSerializer(client, json.dumps(second), conf={"auto.register.schemas": False})(
        {"id": 3, "country": "US", "amount": 1.5}, values
    )
    table_rows = pa.Table.from_pylist([{"id": 1, "country": "DE"}], schema=PLAIN)
    tail = [kafka([(None, old), (None, new)])]
    flags = {"record_format": "avro", "schema_registry_url": "mock://fresh-avro"}
    assert read(table_rows, tail, state(), **flags) == [
        {"id": 1, "country": "DE", "amount": None},
        {"id": 2, "country": "FR", "amount": None},
        {"id": 3, "country": "US", "amount": 1.5},
    ], "the column the sink adds when it commits the tail is there, null in the table's rows"
    assert read(table_rows, tail, state(), evolve_schema=False, **flags) == [
        {"id": 1, "country": "DE"},
        {"id": 2, "country": "FR"},
        {"id": 3, "country": "US"},
    ], "without --evolve-schema the sink writes the table's columns only"


@settings(max_examples=60, deadline=None)
@given(
    table=st.dictionaries(st.integers(0, 30), st.text(max_size=3)),
    tail=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 30), st.one_of(st.none(), st.text(max_size=3))), max_size=40
    ),
)
def test_an_upsert_read_is_the_table_with_the_tails_changes_applied_in_kafka_order(
    table: dict[int, str], tail: list[tuple[int, int, str | None]]
) -> None:
    """Against a reference that applies each change to the table's rows one by one: a key's records in one partition
    (its own: id % 3), in any interleaving of the partitions' batches."""
    table_rows = pa.Table.from_pylist([{"id": key, "name": name} for key, name in table.items()], schema=KEYED)
    expected = dict(table)
    by_partition: dict[int, list[tuple[Any, Any]]] = {}
    for _, key, name in tail:
        if name is None:
            expected.pop(key, None)
        else:
            expected[key] = name
        by_partition.setdefault(key % 3, []).append(({"id": key}, None if name is None else {"id": key, "name": name}))
    batches = [kafka(records, partition) for partition, records in sorted(by_partition.items(), reverse=True)]
    rows = read(table_rows, batches, state(key=("id",)), mode="upsert", key="id")
    assert rows == [{"id": key, "name": expected[key]} for key in sorted(expected)]
