"""Kafka records as the Kafka source's rows: Arrow record batches in its schema.

The columns are those of Spark's Kafka source with ``includeHeaders=true``. The
Arrow schema must equal pyspark's ``to_arrow_schema(source.KAFKA_SCHEMA, timezone="UTC")``:
Spark checks every batch a Python data source returns against it
(tests/unit/test_kafka_arrow.py). A batch is cut at ``ARROW_BATCH_MAX_ROWS`` rows or
``ARROW_BATCH_MAX_BYTES`` of keys and values, whichever comes first, so that a task's
memory does not grow with its range. Pure: no Spark (a fresh read builds its batches too).
"""

from __future__ import annotations

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


class ArrowBatchBuilder:
    """Collects the messages of one partition into Arrow record batches in KAFKA_ARROW_SCHEMA."""

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

    def append(self, message: Message) -> None:
        key, value = message.key(), message.value()
        timestamp_type, timestamp_ms = message.timestamp()
        headers = message.headers()
        self._keys.append(key)
        self._values.append(value)
        self._offsets.append(int(message.offset() or 0))
        self._timestamps.append(None if timestamp_type == 0 else timestamp_ms * 1000)
        self._timestamp_types.append(KAFKA_TIMESTAMP_TYPE.get(timestamp_type, -1))
        self._headers.append(_header_structs(headers))
        self.bytes += len(key or b"") + len(value or b"")

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
