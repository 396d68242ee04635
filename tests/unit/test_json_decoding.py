"""JSON values decoded in Arrow: what fits, what does not and why, and the policies applied in a writer's task."""

from __future__ import annotations

import datetime as dt
import json
import math
import pickle
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from spark_writer.formats.json_decoding import (
    NOT_AN_OBJECT,
    NOT_JSON,
    REASON_COLUMN,
    TOMBSTONE,
    JsonDecoder,
    UnsupportedJsonSchemaError,
)
from spark_writer.formats.record_decoding import BadRecordError, BadRecordPolicy, RecordDecoding
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("amount", pa.float64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("note", pa.string()),
        ("items", pa.list_(pa.struct([("sku", pa.string()), ("quantity", pa.int32())]))),
    ]
)
ORDER_TYPES = ("bigint", "double", "timestamp", "string", "array<struct<sku:string,quantity:int>>")
KAFKA_TIME = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def kafka_batch(values: list[bytes | str | None], topic: str = "orders", partition: int = 3) -> pa.RecordBatch:
    raw = [value.encode() if isinstance(value, str) else value for value in values]
    count = len(raw)
    return pa.RecordBatch.from_pydict(
        {
            "key": [f"k{i}".encode() for i in range(count)],
            "value": raw,
            "topic": [topic] * count,
            "partition": [partition] * count,
            "offset": list(range(100, 100 + count)),
            "timestamp": [KAFKA_TIME] * count,
            "timestampType": [0] * count,
            "headers": [None] * count,
        },
        schema=KAFKA_ARROW_SCHEMA,
    )


def order(order_id: int, **fields: Any) -> str:
    record = {
        "order_id": order_id,
        "amount": 1.5,
        "created_at": "2025-03-01T10:00:00Z",
        "items": [{"sku": "a", "quantity": 2}],
        **fields,
    }
    return json.dumps(record)


def orders_decoder(**options: Any) -> JsonDecoder:
    return JsonDecoder(ORDERS, ORDER_TYPES, **options)


def reasons(decoded_misfits: pa.Table) -> dict[int, str]:
    return {row["offset"]: row[REASON_COLUMN] for row in decoded_misfits.to_pylist()}


def test_fitting_records_become_rows_with_where_they_came_from() -> None:
    decoded = orders_decoder(kafka_metadata=True).decode(kafka_batch([order(i) for i in range(40)]))

    assert decoded.misfits.num_rows == 0
    rows = decoded.rows.to_pylist()
    assert [row["order_id"] for row in rows] == list(range(40))
    assert [row["kafka_offset"] for row in rows] == list(range(100, 140))
    assert rows[7] == {
        "order_id": 7,
        "amount": 1.5,
        "created_at": dt.datetime(2025, 3, 1, 10, tzinfo=dt.UTC),
        "note": None,
        "items": [{"sku": "a", "quantity": 2}],
        "kafka_topic": "orders",
        "kafka_partition": 3,
        "kafka_offset": 107,
        "kafka_timestamp": KAFKA_TIME,
    }
    assert decoded.rows.schema == orders_decoder(kafka_metadata=True).output_schema


def test_a_slice_of_a_batch_decodes_only_its_own_records() -> None:
    batch = kafka_batch([order(i) for i in range(40)])

    decoded = orders_decoder(kafka_metadata=True).decode(batch.slice(7, 5))

    assert [row["order_id"] for row in decoded.rows.to_pylist()] == [7, 8, 9, 10, 11]
    assert [row["kafka_offset"] for row in decoded.rows.to_pylist()] == [107, 108, 109, 110, 111]


def test_missing_fields_are_null_and_unknown_ones_ignored_nested_too() -> None:
    value = '{"order_id": 1, "extra": {"x": 1}, "items": [{"sku": "b", "colour": "red"}]}'
    (row,) = orders_decoder().decode(kafka_batch([value])).rows.to_pylist()
    assert row == {
        "order_id": 1,
        "amount": None,
        "created_at": None,
        "note": None,
        "items": [{"sku": "b", "quantity": None}],
    }


def test_each_kind_of_bad_record_has_its_reason_and_its_partial_row() -> None:
    values: list[bytes | str | None] = [order(i) for i in range(30)]
    values[3] = order(3, amount="abc")
    values[4] = order(4, created_at="yesterday")
    values[5] = "not json at all"
    values[6] = json.dumps([{"order_id": 6}])
    values[7] = None
    values[8] = order(8, items=[{"sku": "b", "quantity": "many"}])
    values[9] = '{"order_id": 9} {"order_id": 10}'
    values[10] = order(10, amount="abc", created_at="yesterday")
    values[11] = '{"order_id": 11, "amount": "NaN"}'

    decoded = orders_decoder(kafka_metadata=True).decode(kafka_batch(values))

    misfit = "fields whose value does not fit the schema: "
    assert reasons(decoded.misfits) == {
        103: misfit + "amount (double)",
        104: misfit + "created_at (timestamp)",
        105: NOT_JSON,
        106: NOT_AN_OBJECT,
        107: TOMBSTONE,
        108: misfit + "items (array<struct<sku:string,quantity:int>>)",
        109: NOT_JSON,
        110: misfit + "amount (double), created_at (timestamp)",
        111: misfit + "amount (double)",
    }
    assert sorted(row["order_id"] for row in decoded.rows.to_pylist()) == sorted(set(range(30)) - set(range(3, 12)))
    partial = {row["kafka_offset"]: row for row in decoded.misfit_rows.to_pylist()}
    assert (partial[103]["order_id"], partial[103]["amount"], partial[103]["created_at"]) == (
        3,
        None,
        KAFKA_TIME.replace(month=3, hour=10),
    )
    assert (partial[108]["order_id"], partial[108]["items"]) == (8, None)
    assert all(partial[offset]["order_id"] is None for offset in (105, 106, 107, 109))
    # The Kafka columns of each misfit travel with it (dead letters need them).
    assert decoded.misfits.column("key").to_pylist() == [f"k{i}".encode() for i in range(3, 12)]


def test_bare_nan_and_infinity_are_doubles() -> None:
    values = ['{"order_id": 1, "amount": NaN}', '{"order_id": 2, "amount": -Infinity}', "bad"]
    amounts = [row["amount"] for row in orders_decoder().decode(kafka_batch(values)).rows.to_pylist()]
    assert math.isnan(amounts[0]) and amounts[1] == -math.inf


def test_a_string_column_takes_any_json_value_as_its_text() -> None:
    values = [order(1, note=12), order(2, note={"a": [1, 2]}), order(3, note=True), order(4, note="plain")]
    rows = orders_decoder().decode(kafka_batch(values)).rows.to_pylist()
    assert [row["note"] for row in rows] == ["12", '{"a":[1,2]}', "true", "plain"]


def test_timestamps_without_a_zone_are_read_in_the_decoders_zone() -> None:
    at = pa.schema([("at", pa.timestamp("us", tz="UTC"))])
    values = [
        '{"at": "2025-03-01T23:30:00"}',
        '{"at": "2025-03-01 23:30:00.250"}',
        '{"at": "2025-03-01T23:30:00-05:00"}',
        '{"at": "2025-03-01T23:30:00Z"}',
        '{"at": "2025-03-01"}',
    ]

    def instants(zone: str) -> list[dt.datetime]:
        decoded = JsonDecoder(at, ("timestamp",), time_zone=zone).decode(kafka_batch(values))
        return [row["at"] for row in decoded.rows.to_pylist()]

    utc = dt.UTC
    assert instants("UTC") == [
        dt.datetime(2025, 3, 1, 23, 30, tzinfo=utc),
        dt.datetime(2025, 3, 1, 23, 30, 0, 250000, tzinfo=utc),
        dt.datetime(2025, 3, 2, 4, 30, tzinfo=utc),
        dt.datetime(2025, 3, 1, 23, 30, tzinfo=utc),
        dt.datetime(2025, 3, 1, tzinfo=utc),
    ]
    assert instants("America/New_York") == [
        dt.datetime(2025, 3, 2, 4, 30, tzinfo=utc),
        dt.datetime(2025, 3, 2, 4, 30, 0, 250000, tzinfo=utc),
        dt.datetime(2025, 3, 2, 4, 30, tzinfo=utc),  # an offset is kept
        dt.datetime(2025, 3, 1, 23, 30, tzinfo=utc),  # so is Z
        dt.datetime(2025, 3, 1, 5, tzinfo=utc),
    ]


def test_dates_binary_and_decimals() -> None:
    schema = pa.schema([("day", pa.date32()), ("blob", pa.binary()), ("price", pa.decimal128(10, 2))])
    decoder = JsonDecoder(schema, ("date", "binary", "decimal(10,2)"))
    decoded = decoder.decode(kafka_batch(['{"day": "2025-03-01", "blob": "aGk=", "price": 12.34}', '{"blob": "*"}']))
    assert decoded.rows.to_pylist() == [{"day": dt.date(2025, 3, 1), "blob": b"hi", "price": Decimal("12.34")}]
    assert reasons(decoded.misfits) == {101: "fields whose value does not fit the schema: blob (binary)"}


def test_a_json_object_over_several_lines_fits() -> None:
    pretty = json.dumps({"order_id": 1, "items": [{"sku": "a"}]}, indent=2)
    rows = orders_decoder().decode(kafka_batch([pretty, order(2)])).rows.to_pylist()
    assert [row["order_id"] for row in rows] == [1, 2]


def test_a_map_column_is_refused_with_what_to_do() -> None:
    nested = pa.schema([("attributes", pa.struct([("tags", pa.map_(pa.string(), pa.string()))]))])
    with pytest.raises(UnsupportedJsonSchemaError, match=r"attributes\.tags is a MAP.*STRUCT of its keys"):
        JsonDecoder(nested, ("struct<tags:map<string,string>>",))


def test_a_decoder_travels_to_the_executors_without_its_caches() -> None:
    decoder = orders_decoder(kafka_metadata=True)
    decoder.decode(kafka_batch([order(1), "bad"]))  # builds the cached parse options and field decoders

    copy = pickle.loads(pickle.dumps(decoder))

    assert copy == decoder
    assert copy.decode(kafka_batch([order(5)])).rows.column("order_id").to_pylist() == [5]


def test_the_fail_policy_names_the_first_bad_record() -> None:
    task = RecordDecoding(orders_decoder()).start()
    task.rows(kafka_batch([order(1)]))
    with pytest.raises(BadRecordError) as failure:
        task.rows(kafka_batch([order(2), order(3, amount="x")], topic="shop", partition=7))
    assert str(failure.value).startswith(
        "a Kafka record does not fit the JSON schema: topic shop partition 7 offset 101: "
        "fields whose value does not fit the schema: amount (double). Fix the record"
    )


def test_the_null_policy_writes_what_fits_and_counts() -> None:
    task = RecordDecoding(orders_decoder(), BadRecordPolicy.NULL).start()
    first = task.rows(kafka_batch([order(1), order(2, amount="x"), None]))
    second = task.rows(kafka_batch([order(3)]))

    assert sorted((row["order_id"], row["amount"]) for row in first.to_pylist() if row["order_id"]) == [
        (1, 1.5),
        (2, None),
    ]
    assert first.num_rows == 3 and second.num_rows == 1
    summary = task.finish()
    assert summary.bad_records == 2
    assert summary.latest_timestamps == {("orders", 3): int(KAFKA_TIME.timestamp() * 1000)}


def test_dead_letters_need_a_topic_and_only_with_that_policy() -> None:
    with pytest.raises(ValueError, match="dead-letter topic"):
        RecordDecoding(orders_decoder(), BadRecordPolicy.DEAD_LETTER)


def test_a_decimal_is_exact_whatever_its_neighbours() -> None:
    schema = pa.schema([("price", pa.decimal128(30, 10))])
    decoder = JsonDecoder(schema, ("decimal(30,10)",))
    record = '{"price": 12345678901234567890.1234567891}'
    alone = decoder.decode(kafka_batch([record])).rows.to_pylist()
    beside_a_bad_one = decoder.decode(kafka_batch([record, "not json"])).rows.to_pylist()
    assert alone == beside_a_bad_one == [{"price": Decimal("12345678901234567890.1234567891")}]


def test_a_string_column_keeps_the_records_own_text_of_a_value() -> None:
    values = [
        order(1, note=12),
        '{"order_id": 2, "note": 19.000000000000000001}',
        '{"order_id": 3, "note": 1E2}',
        '{"order_id": 4, "note": {"city": "M\u00fcnchen", "n": [1.50, 2]}}',
        '{"order_id": 5, "note": {"esc": "\\u00fc"}}',
        '{"order_id": 6, "note": {\n  "a": 1\n}}',
    ]
    rows = orders_decoder().decode(kafka_batch(values)).rows.to_pylist()
    assert [row["note"] for row in rows] == [
        "12",
        "19.000000000000000001",
        "1E2",
        '{"city":"M\u00fcnchen","n":[1.50,2]}',
        '{"esc":"\\u00fc"}',
        '{"a":1}',
    ]


def test_wall_clock_times_in_a_dst_change_take_the_documented_instant() -> None:
    at = pa.schema([("at", pa.timestamp("us", tz="UTC"))])
    decoder = JsonDecoder(at, ("timestamp",), time_zone="America/New_York")
    values = ['{"at": "2025-11-02T01:30:00"}', '{"at": "2025-03-09T02:30:00"}']
    decoded = decoder.decode(kafka_batch(values))
    assert decoded.misfits.num_rows == 0
    assert [row["at"] for row in decoded.rows.to_pylist()] == [
        dt.datetime(2025, 11, 2, 5, 30, tzinfo=dt.UTC),  # ambiguous: the earlier instant (01:30 EDT)
        dt.datetime(2025, 3, 9, 7, 30, tzinfo=dt.UTC),  # in the gap: shifted forward by the gap (03:30 EDT)
    ]


def test_a_field_given_twice_does_not_fit_wherever_the_record_is() -> None:
    twice = '{"order_id": 1, "order_id": 2}'
    alone = orders_decoder().decode(kafka_batch([twice]))
    beside_a_bad_one = orders_decoder().decode(kafka_batch([twice, "not json"]))
    assert reasons(alone.misfits)[100] == reasons(beside_a_bad_one.misfits)[100]
    assert "order_id" in reasons(alone.misfits)[100]
