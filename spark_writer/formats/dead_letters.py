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

Neither a full local queue nor a record too large fails the task: the producer
waits for acknowledgements to free its queue, and a dead letter over the
producer's (``message.max.bytes``) or the topic's (``max.message.bytes``) size is
sent without its value, with the header ``sink-coordinator.value-omitted`` saying
so: its source coordinates say where the record still is. (The broker refuses a
whole request for one record too large, so a refused dead letter is first sent
again alone: only one too large by itself loses its value.)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

HEADER_PREFIX: Final = "sink-coordinator."
VALUE_OMITTED_HEADER: Final = f"{HEADER_PREFIX}value-omitted"
FLUSH_TIMEOUT_SECONDS: Final = 120.0
# How long the producer serves acknowledgements before it tries again a dead letter its full queue refused.
QUEUE_WAIT_SECONDS: Final = 1.0

Headers = list[tuple[str, str | bytes | None]]


class DeadLetterError(RuntimeError):
    """A dead letter could not be delivered: the batch fails rather than drop the record."""


@dataclass(frozen=True)
class DeadLetterTarget:
    topic: str
    sink: str
    kafka_config: Mapping[str, str]

    def producer_config(self) -> dict[str, Any]:
        return {**self.kafka_config, "enable.idempotence": True, "acks": "all"}


def dead_letter_headers(row: Mapping[str, Any], reason: str, sink: str) -> Headers:
    """The record's own headers, then where it came from and why it is a dead letter."""
    own: Headers = [(header["key"], header["value"]) for header in row["headers"] or []]
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
        # Refused by the broker as too large (with what else shared its request): sent again alone, then without value.
        self._too_large: list[tuple[bytes | None, bytes, Headers, bool]] = []
        self.sent = 0

    def send(self, records: pa.Table, reason_column: str) -> None:
        """Produce each row (the Kafka source's columns and a reason) as a dead letter."""
        for row in records.to_pylist():
            self._produce(row["key"], row["value"], dead_letter_headers(row, row[reason_column], self._target.sink))
            self.sent += 1

    def flush(self) -> int:
        """Wait for every acknowledgement; the number sent, or DeadLetterError if any was not delivered."""
        undelivered = self._producer.flush(FLUSH_TIMEOUT_SECONDS)
        while self._too_large and not undelivered:
            resend, self._too_large = self._too_large, []
            for key, value, headers, alone in resend:
                if alone:
                    self._produce(key, None, _omitted(headers, len(value)))
                else:  # in a request of its own: too large by itself, or only with the others of its request?
                    self._produce(key, value, headers, alone=True)
                    undelivered += self._producer.flush(FLUSH_TIMEOUT_SECONDS)
            undelivered += self._producer.flush(FLUSH_TIMEOUT_SECONDS)
        if self._errors or undelivered:
            raise DeadLetterError(
                f"{len(self._errors) + undelivered} of {self.sent} dead letter(s) not delivered to "
                f"{self._target.topic!r}: {self._errors[:3] or 'flush timed out'}"
            )
        return self.sent

    def _produce(self, key: bytes | None, value: bytes | None, headers: Headers, *, alone: bool = False) -> None:
        """Queue one dead letter: once the full queue has room, and without its value when it is too large."""
        while True:
            try:
                self._producer.produce(
                    self._target.topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=functools.partial(self._on_delivery, headers=headers, alone=alone),
                )
            except BufferError:  # the local queue is full: acknowledgements free it
                self._producer.poll(QUEUE_WAIT_SECONDS)
                continue
            except KafkaException as error:  # over the producer's message.max.bytes
                if value is None or error.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                headers = _omitted(headers, len(value))
                value = None
                continue
            self._producer.poll(0)
            return

    def _on_delivery(self, error: KafkaError | None, message: Message, headers: Headers, alone: bool) -> None:
        if error is None:
            return
        value = message.value()
        if error.code() == KafkaError.MSG_SIZE_TOO_LARGE and value is not None:  # over the topic's max.message.bytes
            self._too_large.append((message.key(), value, headers, alone))
        else:
            self._errors.append(str(error))


def _omitted(headers: Headers, size: int) -> Headers:
    return [*headers, (VALUE_OMITTED_HEADER, f"{size} bytes, over the dead-letter producer's message size".encode())]
