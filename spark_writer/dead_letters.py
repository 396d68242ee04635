"""Producing the records that do not fit the schema to a dead-letter topic, from the executors.

Each dead letter keeps the record's key, value and headers as they were, and adds
headers saying where it came from and why it was refused:
``sink-coordinator.source-topic``, ``.source-partition``, ``.source-offset``,
``.reason`` and ``.sink``. The writer's tasks produce them as they decode the
batch; the producer is idempotent (no duplicate from its own retries) and every
send is acknowledged before the task closes its files, so before the batch's
pre-commit. Delivery is at least once: a batch that Spark runs again (after a
crash before its checkpoint) sends its dead letters again; the source coordinates
in the headers identify duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer

HEADER_PREFIX: Final = "sink-coordinator."
FLUSH_TIMEOUT_SECONDS: Final = 120.0


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


class DeadLetterProducer:
    """One task's dead letters: produced as they come, every acknowledgement awaited by `flush`."""

    def __init__(self, target: DeadLetterTarget) -> None:
        self._target = target
        self._producer = Producer(target.producer_config())
        self._errors: list[str] = []
        self.sent = 0

    def send(self, records: pa.Table, reason_column: str) -> None:
        """Produce each row (the Kafka source's columns and a reason) as a dead letter."""
        for row in records.to_pylist():
            self._producer.produce(
                self._target.topic,
                key=row["key"],
                value=row["value"],
                headers=dead_letter_headers(row, row[reason_column], self._target.sink),
                on_delivery=self._on_delivery,
            )
            self._producer.poll(0)
            self.sent += 1

    def flush(self) -> int:
        """Wait for every acknowledgement; the number sent, or DeadLetterError if any was not delivered."""
        undelivered = self._producer.flush(FLUSH_TIMEOUT_SECONDS)
        if self._errors or undelivered:
            raise DeadLetterError(
                f"{len(self._errors) + undelivered} of {self.sent} dead letter(s) not delivered to "
                f"{self._target.topic!r}: {self._errors[:3] or 'flush timed out'}"
            )
        return self.sent

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._errors.append(str(error))
