"""Kafka records as the Kafka source's rows: Arrow record batches in its schema.

The columns are those of Spark's Kafka source with ``includeHeaders=true``. The
Arrow schema must equal pyspark's ``to_arrow_schema(source.KAFKA_SCHEMA, timezone="UTC")``:
Spark checks every batch a Python data source returns against it
(tests/unit/test_kafka_arrow.py). A batch is cut at ``ARROW_BATCH_MAX_ROWS`` rows or
``ARROW_BATCH_MAX_BYTES`` of keys and values, whichever comes first, so that a task's
memory does not grow with its range. Pure: no Spark (a fresh read builds its batches too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

if TYPE_CHECKING:
    from confluent_kafka import Message
    from confluent_kafka._types import HeadersType

ARROW_BATCH_MAX_ROWS: Final = 10_000
ARROW_BATCH_MAX_BYTES: Final = 16 * 1024 * 1024

# confluent-kafka's timestamp type (0 none, 1 create, 2 log-append) -> Kafka's (-1, 0, 1), as Spark shows it.
KAFKA_TIMESTAMP_TYPE: Final = {0: -1, 1: 0, 2: 1}

HEADER_ARROW_TYPE: Final = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
KAFKA_ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(pa.field("element", HEADER_ARROW_TYPE))),
    ]
)


def _header_structs(headers: HeadersType | None) -> list[dict[str, Any]] | None:
    """Message headers as Arrow struct values; None when there are none (as Spark does)."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [{"key": key, "value": _as_bytes(value)} for key, value in pairs]


def _as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _headers_of(message: Message) -> HeadersType | None:
    return message.headers()


def _size(payloads: list[bytes | None]) -> int:
    """The bytes of these keys or values (None: none)."""
    return sum(map(len, filter(None, payloads)))


def _taken_until_full(before: int, keys: list[bytes | None], values: list[bytes | None]) -> int:
    """How many of these messages a batch of `before` bytes takes until it holds ARROW_BATCH_MAX_BYTES."""
    held = before
    for taken, (key, value) in enumerate(zip(keys, values, strict=True), start=1):
        held += len(key or b"") + len(value or b"")
        if held >= ARROW_BATCH_MAX_BYTES:
            return taken
    return len(keys)


class ArrowBatchBuilder:
    """Collects the messages of one partition into Arrow record batches in KAFKA_ARROW_SCHEMA.

    It takes the messages a consume() call gave at once (`add`), each column read with one comprehension: a method
    call and a list append per message and column cost more than reading and parsing the record (bench/OPTIMISATIONS.md,
    24). A batch still ends at the message that fills it, as if the messages were taken one at a time."""

    def __init__(self, topic: str, partition: int) -> None:
        self._topic = topic
        self._partition = partition
        self._reset()

    def _reset(self) -> None:
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps: list[int | None] = []
        self._timestamp_types: list[int] = []
        self._headers: list[list[dict[str, Any]] | None] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, messages: Sequence[Message]) -> Iterator[pa.RecordBatch]:
        """Take these messages (of this partition, in order); yield each batch they fill: one ends at the message
        that brings it to ARROW_BATCH_MAX_ROWS rows or ARROW_BATCH_MAX_BYTES bytes of keys and values."""
        start = 0
        while start < len(messages):
            chunk = messages[start : start + ARROW_BATCH_MAX_ROWS - len(self)]
            keys = [message.key() for message in chunk]
            values = [message.value() for message in chunk]
            size = _size(keys) + _size(values)
            if self.bytes + size >= ARROW_BATCH_MAX_BYTES:
                taken = _taken_until_full(self.bytes, keys, values)
                chunk, keys, values = chunk[:taken], keys[:taken], values[:taken]
                size = _size(keys) + _size(values)
            self._append(chunk, keys, values, size)
            start += len(chunk)
            if self.is_full():
                yield self.build()

    def _append(
        self, messages: Sequence[Message], keys: list[bytes | None], values: list[bytes | None], size: int
    ) -> None:
        timestamps = [message.timestamp() for message in messages]
        self._keys += keys
        self._values += values
        self._offsets += [int(message.offset() or 0) for message in messages]
        self._timestamps += [None if kind == 0 else milliseconds * 1000 for kind, milliseconds in timestamps]
        self._timestamp_types += [KAFKA_TIMESTAMP_TYPE.get(kind, -1) for kind, _ in timestamps]
        self._headers += [_header_structs(headers) if headers else None for headers in map(_headers_of, messages)]
        self.bytes += size

    def is_full(self) -> bool:
        return len(self) >= ARROW_BATCH_MAX_ROWS or self.bytes >= ARROW_BATCH_MAX_BYTES

    def build(self) -> pa.RecordBatch:
        rows = len(self)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self._keys, pa.binary()),
                pa.array(self._values, pa.binary()),
                pa.array([self._topic] * rows, pa.string()),
                pa.array([self._partition] * rows, pa.int32()),
                pa.array(self._offsets, pa.int64()),
                pa.array(self._timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self._timestamp_types, pa.int32()),
                pa.array(self._headers, KAFKA_ARROW_SCHEMA.field("headers").type),
            ],
            schema=KAFKA_ARROW_SCHEMA,
        )
        self._reset()
        return batch
