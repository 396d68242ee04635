"""The Kafka side of the torture runs: records that do not fit the schema, retention, a producer under load.

Each helper acts on the real broker through confluent-kafka's clients; what it
did (which positions it deleted, which bad records it produced, where) is what
the checks compare the table and the dead-letter topic against.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Message, TopicPartition

from tests.fixtures.kafka_broker import ProducedRecord, admin_client, client_config, produce_records
from tests.fixtures.pipeline import order

ADMIN_TIMEOUT_SECONDS = 30.0
SOURCE_HEADER = "sink-coordinator.source-"


@dataclass(frozen=True)
class BadRecord:
    kind: str
    key: int | None  # the order_id a `null` policy still writes (None: an all-null row)
    value: bytes | None


def bad_records(rng: random.Random, count: int, first_key: int) -> list[BadRecord]:
    """`count` records that do not fit the orders schema, of every kind the job knows."""
    made = []
    for index in range(count):
        key = first_key + index
        kind = ("wrong_type", "bad_timestamp", "not_json", "array", "tombstone")[index % 5]
        if kind == "wrong_type":
            made.append(BadRecord(kind, key, json.dumps({**order(key), "amount": "abc"}).encode()))
        elif kind == "bad_timestamp":
            made.append(BadRecord(kind, key, json.dumps({**order(key), "created_at": "yesterday"}).encode()))
        elif kind == "not_json":
            made.append(BadRecord(kind, None, b"order " + str(key).encode()))
        elif kind == "array":
            made.append(BadRecord(kind, None, json.dumps([order(key)]).encode()))
        else:
            made.append(BadRecord(kind, None, None))
    rng.shuffle(made)
    return made


# The run's good records of these keys (orders, or its upsert stream's next changes), where each landed.
Produce = Callable[[Sequence[int]], list[ProducedRecord]]


def produce_with_bad(
    produce: Produce, bootstrap: str, topic: str, keys: list[int], partitions: int, bad: list[BadRecord]
) -> tuple[list[ProducedRecord], dict[tuple[int, int], BadRecord]]:
    """The good records in two halves with the bad records between them; where each landed."""
    half = len(keys) // 2
    good = produce(keys[:half])
    landed = produce_records(
        bootstrap, topic, ((index % partitions, f"bad-{index}".encode(), r.value) for index, r in enumerate(bad))
    )
    good += produce(keys[half:])
    by_key = {f"bad-{index}".encode(): record for index, record in enumerate(bad)}
    return good, {(r.partition, r.offset): by_key[r.key] for r in landed}


def _read_all(bootstrap: str, topic: str) -> Iterator[Message]:
    """Every record of the topic, from each partition's log start up to its high watermark."""
    consumer = Consumer(client_config(bootstrap, **{"group.id": f"torture-{topic}", "enable.auto.commit": False}))
    try:
        metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_SECONDS)
        partitions = sorted(metadata.topics[topic].partitions)
        bounds = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in bounds.items()])
        remaining = sum(high - low for low, high in bounds.values())
        while remaining > 0:
            message = consumer.poll(10)
            if message is None:
                raise TimeoutError(f"the topic {topic} stopped answering with {remaining} records unread")
            if message.error():
                continue
            yield message
            remaining -= 1
    finally:
        consumer.close()


def dead_letters(bootstrap: str, topic: str) -> Counter[tuple[int, int]]:
    """(source partition, source offset) of every record in the dead-letter topic, with repeats."""
    seen: Counter[tuple[int, int]] = Counter()
    for message in _read_all(bootstrap, topic):
        raw = message.headers() or []
        pairs = raw.items() if isinstance(raw, dict) else raw
        headers = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs if v is not None}
        seen[(int(headers[f"{SOURCE_HEADER}partition"]), int(headers[f"{SOURCE_HEADER}offset"]))] += 1
    return seen


def held_keys(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes | None]:
    """What the broker holds: the key at each (partition, offset) of the topic."""
    return {position: key for position, (key, _) in held_records(bootstrap, topic).items()}


def held_records(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple[bytes, bytes | None]]:
    """What the broker holds: the key and value at each (partition, offset) of the topic."""
    return {(m.partition(), m.offset()): (m.key(), m.value()) for m in _read_all(bootstrap, topic)}  # type: ignore[misc]


def log_starts(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's log start: records below it were deleted (retention, delete-records), not lost."""
    consumer = Consumer(client_config(bootstrap, **{"group.id": f"torture-{topic}", "enable.auto.commit": False}))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_SECONDS).topics[topic].partitions)
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in partitions}
    finally:
        consumer.close()


def lost_by_broker(
    acknowledged: list[ProducedRecord], held: dict[tuple[int, int], bytes | None], starts: dict[int, int]
) -> list[ProducedRecord]:
    """Records the broker acknowledged that it does not hold where it said it put them (above the log start)."""
    return [
        r
        for r in acknowledged
        if r.offset >= starts.get(r.partition, 0) and held.get((r.partition, r.offset), b"\0") != r.key
    ]


def delete_before(
    bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int], fraction: float
) -> dict[int, int]:
    """Retention inside a batch: each partition's records below start + fraction of the batch are deleted.

    Returns the new log start of each partition it cut (at least one record of the batch goes)."""
    cuts = {p: start.get(p, 0) + max(1, math.ceil(fraction * (e - start.get(p, 0)))) for p, e in end.items()}
    cuts = {p: min(cut, end[p]) for p, cut in cuts.items() if end[p] > start.get(p, 0)}
    admin = admin_client(bootstrap)
    futures = admin.delete_records([TopicPartition(topic, p, cut) for p, cut in cuts.items()])
    for future in futures.values():
        future.result(timeout=ADMIN_TIMEOUT_SECONDS)
    return cuts


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete the topic and return once the broker no longer lists it."""
    admin = admin_client(bootstrap)
    admin.delete_topics([topic])[topic].result(timeout=ADMIN_TIMEOUT_SECONDS)
    gone = threading.Event()
    for _ in range(int(ADMIN_TIMEOUT_SECONDS * 10)):
        if topic not in admin.list_topics(timeout=ADMIN_TIMEOUT_SECONDS).topics:
            return
        gone.wait(0.1)  # the broker's metadata catches up with the deletion
    raise TimeoutError(f"the broker still lists topic {topic} {ADMIN_TIMEOUT_SECONDS:.0f} s after its deletion")


@dataclass
class LoadProducer:
    """The run's records produced at a steady rate while the job starts (`latest` resolves its start meanwhile)."""

    produce: Produce
    keys: list[int]
    per_second: float
    produced: list[ProducedRecord] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="load-producer", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        pace = threading.Event()
        chunk = max(1, int(self.per_second / 10))
        try:
            for first in range(0, len(self.keys), chunk):
                batch = self.keys[first : first + chunk]
                self.produced += self.produce(batch)
                pace.wait(0.1)  # the producer's rate: chunk records every 100 ms
        except Exception as error:  # reported as an anomaly by the run
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.done.set()


def positions(records: list[ProducedRecord]) -> dict[tuple[int, int], int]:
    return {(r.partition, r.offset): int(r.key) for r in records}
