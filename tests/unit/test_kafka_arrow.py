"""The rows of the Kafka source (spark_writer.kafka.arrow): the Arrow batches Spark checks against its schema, and
the records a range reader takes of each consume() call (spark_writer.kafka.range_reader), each against the plain
message-by-message way they were first written, kept here as the reference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from spark_writer.kafka import arrow
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA, KAFKA_TIMESTAMP_TYPE, ArrowBatchBuilder
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_reader import RangeReader
from spark_writer.kafka.source import KAFKA_SCHEMA

TOPIC = "orders"


def test_arrow_schema_is_what_spark_expects() -> None:
    assert KAFKA_ARROW_SCHEMA.equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))


def reference_batches(messages: list[Message], max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """One message at a time: a batch ends at the message that brings it to `max_rows` rows or `max_bytes` bytes."""
    columns: dict[str, list[Any]] = {name: [] for name in KAFKA_ARROW_SCHEMA.names}
    held = 0
    for message in messages:
        kind, milliseconds = message.timestamp()
        headers = message.headers()
        columns["key"].append(message.key())
        columns["value"].append(message.value())
        columns["topic"].append(TOPIC)
        columns["partition"].append(3)
        columns["offset"].append(message.offset())
        columns["timestamp"].append(None if kind == 0 else milliseconds * 1000)
        columns["timestampType"].append(KAFKA_TIMESTAMP_TYPE.get(kind, -1))
        pairs = (headers.items() if isinstance(headers, dict) else headers) if headers else None
        columns["headers"].append(
            None
            if pairs is None
            else [{"key": key, "value": value.encode() if isinstance(value, str) else value} for key, value in pairs]
        )
        held += len(message.key() or b"") + len(message.value() or b"")
        if len(columns["offset"]) >= max_rows or held >= max_bytes:
            yield pa.RecordBatch.from_pydict(columns, schema=KAFKA_ARROW_SCHEMA)
            columns = {name: [] for name in KAFKA_ARROW_SCHEMA.names}
            held = 0
    if columns["offset"]:
        yield pa.RecordBatch.from_pydict(columns, schema=KAFKA_ARROW_SCHEMA)


payloads = st.one_of(st.none(), st.binary(max_size=12))
headers = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=3), st.text(max_size=3))), max_size=2
    ),
    st.dictionaries(st.text(max_size=3), st.binary(max_size=3), max_size=2),
)
timestamps = st.tuples(st.sampled_from([0, 1, 2]), st.integers(min_value=0, max_value=2**40))


@st.composite
def messages(draw: st.DrawFn) -> list[Message]:
    count = draw(st.integers(min_value=0, max_value=40))
    return [
        Message(
            topic=TOPIC,
            partition=3,
            offset=offset,
            key=draw(payloads),
            value=draw(payloads),
            headers=draw(headers),
            timestamp=draw(timestamps),
        )
        for offset in range(count)
    ]


@settings(max_examples=300, deadline=None)
@given(
    messages(),
    st.lists(st.integers(min_value=1, max_value=15), max_size=10),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=60),
)
def test_batches_of_consume_calls_are_those_of_one_message_at_a_time(
    taken: list[Message], calls: list[int], max_rows: int, max_bytes: int
) -> None:
    """Whatever the consume() calls gave at once, the same batches, cut at the same messages."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrow, "ARROW_BATCH_MAX_ROWS", max_rows)
        patch.setattr(arrow, "ARROW_BATCH_MAX_BYTES", max_bytes)
        builder = ArrowBatchBuilder(TOPIC, 3)
        built: list[pa.RecordBatch] = []
        start = 0
        for size in [*calls, len(taken)]:
            built += builder.add(taken[start : start + size])
            start += size
        if len(builder):
            built.append(builder.build())
    expected = list(reference_batches(taken, max_rows, max_bytes))
    assert [batch.to_pylist() for batch in built] == [batch.to_pylist() for batch in expected]


class UnknownLog:
    """A consumer that cannot tell a partition's log bounds now (the reader then leaves its position alone)."""

    def list_topics(self, *_: Any, **__: Any) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    def assign(self, *_: Any) -> None:
        """Nothing to do: these tests never read."""


def reference_accept(batch: list[Message], position: int, end: int) -> tuple[list[int], int]:
    """The offsets a reader takes of one consume() call, message by message, and its position after them (an end of
    log moves the position to it, up to the range's end)."""
    taken = []
    for message in batch:
        error = message.error()
        if error is not None:
            position = max(position, min(int(message.offset() or 0), end))
        elif message.offset() >= end:
            position = end
        elif message.offset() >= position:
            position = message.offset() + 1
            taken.append(message.offset())
        if position >= end:
            break
    return taken, position


@st.composite
def consumed(draw: st.DrawFn) -> list[Message]:
    """What consume() might give: offsets rising with gaps (aborted records, markers), at times out of order or
    repeated, and ends of the log among them."""
    offsets = draw(st.lists(st.integers(min_value=0, max_value=5), max_size=30))
    rising = draw(st.booleans())
    batch = []
    offset = draw(st.integers(min_value=0, max_value=20))
    for step in offsets:
        offset = offset + step if rising else draw(st.integers(min_value=0, max_value=60))
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            batch.append(Message(topic=TOPIC, partition=3, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF)))
        else:
            batch.append(Message(topic=TOPIC, partition=3, offset=offset, value=b"v"))
    return batch


@settings(max_examples=500, deadline=None)
@given(consumed(), st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=70))
def test_a_consume_call_gives_the_records_message_by_message_would(
    batch: list[Message], position: int, length: int
) -> None:
    offset_range = OffsetRange(TOPIC, 3, position, position + length)
    reader = RangeReader(
        UnknownLog(), offset_range, parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": TOPIC})
    )  # type: ignore[arg-type]

    taken = [message.offset() for message in reader._accept(batch)]

    assert (taken, reader._position) == reference_accept(batch, position, offset_range.end)
