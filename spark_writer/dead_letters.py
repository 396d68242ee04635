"""Producing the records that do not fit the schema to a dead-letter topic, from the executors.

Each dead letter keeps the record's key, value and headers as they were, and adds
headers saying where it came from and why it was refused:
``sink-coordinator.source-topic``, ``.source-partition``, ``.source-offset``,
``.reason`` and ``.sink``. The producer is idempotent (no duplicate from its own
retries) and every send is acknowledged before the batch goes on to its files and
its pre-commit. Delivery is at least once: a batch that Spark runs again (after a
crash before its checkpoint) sends its dead letters again; the source coordinates
in the headers identify duplicates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer

HEADER_PREFIX: Final = "sink-coordinator."
FLUSH_TIMEOUT_SECONDS: Final = 120.0
# The columns a dead-letter pass reads (the Kafka source's, plus the reason).
DEAD_LETTER_COLUMNS: Final = ("key", "value", "headers", "topic", "partition", "offset")
SENT_DDL: Final = "sent long"


class DeadLetterError(RuntimeError):
    """A dead letter could not be delivered: the batch fails rather than drop the record."""


@dataclass(frozen=True)
class DeadLetterTarget:
    topic: str
    sink: str
    kafka_config: Mapping[str, str]

    def producer_config(self) -> dict[str, Any]:
        return {**self.kafka_config, "enable.idempotence": True, "acks": "all"}


def dead_letter_headers(row: Mapping[str, Any], reason: str, sink: str) -> list[tuple[str, str | bytes | None]]:
    """The record's own headers, then where it came from and why it is a dead letter."""
    own: list[tuple[str, str | bytes | None]] = [(header["key"], header["value"]) for header in row["headers"] or []]
    return [
        *own,
        (f"{HEADER_PREFIX}source-topic", str(row["topic"]).encode()),
        (f"{HEADER_PREFIX}source-partition", str(row["partition"]).encode()),
        (f"{HEADER_PREFIX}source-offset", str(row["offset"]).encode()),
        (f"{HEADER_PREFIX}reason", reason.encode()),
        (f"{HEADER_PREFIX}sink", sink.encode()),
    ]


@dataclass(frozen=True)
class DeadLetterSender:
    """A mapInArrow function: produce each row as a dead letter, wait for every acknowledgement, yield the count.

    A module-level class, so that Spark ships it to the executors by reference.
    """

    target: DeadLetterTarget
    reason_column: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        producer = Producer(self.target.producer_config())
        errors: list[str] = []

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(str(error))

        sent = 0
        for batch in batches:
            for row in batch.to_pylist():
                producer.produce(
                    self.target.topic,
                    key=row["key"],
                    value=row["value"],
                    headers=dead_letter_headers(row, row[self.reason_column], self.target.sink),
                    on_delivery=on_delivery,
                )
                producer.poll(0)
                sent += 1
        undelivered = producer.flush(FLUSH_TIMEOUT_SECONDS)
        if errors or undelivered:
            raise DeadLetterError(
                f"{len(errors) + undelivered} of {sent} dead letter(s) not delivered to {self.target.topic!r}: "
                f"{errors[:3] or 'flush timed out'}"
            )
        yield pa.RecordBatch.from_pylist([{"sent": sent}], schema=pa.schema([pa.field("sent", pa.int64())]))
