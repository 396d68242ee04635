"""Where a batch ended in Kafka: end offsets from Spark's offset log, latest timestamps, the valid-through time."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from coordinator_service.contract.source_positions import END_OFFSETS, VALID_THROUGH_MS, check_positions
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA
from spark_writer.kafka.positions import (
    MAX_END_OFFSETS_CHARS,
    end_offsets,
    latest_timestamps,
    merge_latest,
    position_properties,
    valid_through_ms,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T0_MS = int(T0.timestamp() * 1000)


def records(*rows: tuple[str, int, int | None]) -> pa.RecordBatch:
    """Kafka records (topic, partition, milliseconds after T0 or None for no timestamp)."""
    count = len(rows)
    return pa.RecordBatch.from_pydict(
        {
            "key": [None] * count,
            "value": [b"{}"] * count,
            "topic": [topic for topic, _, _ in rows],
            "partition": [partition for _, partition, _ in rows],
            "offset": list(range(count)),
            "timestamp": [None if ms is None else T0 + dt.timedelta(milliseconds=ms) for _, _, ms in rows],
            "timestampType": [0] * count,
            "headers": [None] * count,
        },
        schema=KAFKA_ARROW_SCHEMA,
    )


def test_end_offsets_merge_every_kafka_source_and_leave_out_the_rest() -> None:
    lines = [
        json.dumps({"orders": {"0": 10, "1": 12}, "$start": {"orders": {"0": 0, "1": 0}}}),
        "-",  # a source with no offset yet
        json.dumps({"refunds": {"0": 3}}),
        "42",  # another kind of source
    ]
    assert end_offsets(lines) == {"orders": {"0": 10, "1": 12}, "refunds": {"0": 3}}


def test_latest_timestamps_per_topic_partition_without_records_that_have_none() -> None:
    batch = records(("orders", 0, 5), ("orders", 0, 9), ("orders", 1, 2), ("refunds", 0, None))
    assert latest_timestamps(batch) == {("orders", 0): T0_MS + 9, ("orders", 1): T0_MS + 2}
    assert latest_timestamps(records()) == {}
    assert latest_timestamps(batch.select(["value", "topic", "partition"])) == {}
    assert merge_latest([{("orders", 0): 5, ("orders", 1): 7}, {("orders", 0): 6}]) == {
        ("orders", 0): 6,
        ("orders", 1): 7,
    }


def test_valid_through_is_the_least_latest_timestamp_and_none_while_a_partition_had_no_records() -> None:
    offsets = {"orders": {"0": 10, "1": 12}}
    assert valid_through_ms(offsets, {("orders", 0): 500, ("orders", 1): 300}) == 300
    assert valid_through_ms(offsets, {("orders", 0): 500}) is None
    assert valid_through_ms({}, {("orders", 0): 500}) is None


def test_position_properties_are_what_the_coordinator_accepts() -> None:
    lines = [json.dumps({"orders": {"0": 10, "1": 12}})]
    properties = position_properties(lines, {("orders", 0): 500, ("orders", 1): 300})

    assert properties == {END_OFFSETS: '{"orders":{"0":10,"1":12}}', VALID_THROUGH_MS: "300"}
    check_positions(properties)
    assert position_properties(lines, None) == {END_OFFSETS: '{"orders":{"0":10,"1":12}}'}
    assert position_properties(["-"], {}) == {}


def test_end_offsets_of_too_many_partitions_are_left_out() -> None:
    many = {"orders": {str(partition): 10**12 for partition in range(2000)}}
    latest = {("orders", partition): 7 for partition in range(2000)}
    properties = position_properties([json.dumps(many)], latest)
    assert len(json.dumps(many)) > MAX_END_OFFSETS_CHARS
    assert properties == {VALID_THROUGH_MS: "7"}


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({END_OFFSETS: "{not json"}, "must be JSON like"),
        ({END_OFFSETS: "[1]"}, "must be JSON like"),
        ({END_OFFSETS: '{"orders": 5}'}, "topic 'orders' maps to 5"),
        ({END_OFFSETS: '{"orders": {"p0": 5}}'}, "partition 'p0' of topic 'orders' is not a number"),
        ({END_OFFSETS: '{"orders": {"0": -1}}'}, "offset -1 of orders-0 is not an offset"),
        ({END_OFFSETS: '{"orders": {"0": true}}'}, "offset True of orders-0"),
        ({VALID_THROUGH_MS: "-5"}, "must be milliseconds since the epoch"),
        ({VALID_THROUGH_MS: "soon"}, "must be milliseconds since the epoch"),
    ],
)
def test_malformed_position_properties_are_refused(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_positions(properties)
