"""The dead-letter producer against a real broker: a dead letter is delivered, or the batch fails; a full local
queue or a record over the producer's size limit is neither a loss nor a failure on every run."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pyarrow as pa
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from spark_writer.formats.dead_letters import DeadLetterProducer, DeadLetterTarget
from spark_writer.formats.decoded_batch import REASON_COLUMN
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_reader import read_range
from tests.fixtures.kafka_broker import ADMIN_TIMEOUT_SECONDS, admin_client, delete_topics

TopicFactory = Callable[..., str]


def misfits(values: list[bytes]) -> pa.Table:
    """Records that did not fit, as the decoders give them (the Kafka source's columns and a reason)."""
    count = len(values)
    return pa.table(
        {
            "key": [f"k{i}".encode() for i in range(count)],
            "value": values,
            "topic": ["orders"] * count,
            "partition": [3] * count,
            "offset": list(range(100, 100 + count)),
            "headers": [[{"key": "trace", "value": b"t"}]] * count,
            REASON_COLUMN: ["not valid JSON"] * count,
        }
    )


def delivered(bootstrap: str, topic: str, count: int) -> list[dict[str, object]]:
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    rows = [row for batch in read_range(OffsetRange(topic, 0, 0, count), options) for row in batch.to_pylist()]
    return [{**row, "headers": {h["key"]: h["value"] for h in row["headers"]}} for row in rows]


def test_more_dead_letters_than_the_producers_queue_holds_are_all_delivered(
    kafka_bootstrap: str, kafka_topic: TopicFactory
) -> None:
    topic = kafka_topic(partitions=1)
    config = {"bootstrap.servers": kafka_bootstrap, "queue.buffering.max.messages": "5"}
    producer = DeadLetterProducer(DeadLetterTarget(topic, "orders", config))

    producer.send(misfits([f"bad {i}".encode() for i in range(200)]), REASON_COLUMN)

    assert producer.flush() == 200
    assert [row["value"] for row in delivered(kafka_bootstrap, topic, 200)] == [f"bad {i}".encode() for i in range(200)]


def test_a_dead_letter_over_the_producers_size_limit_is_sent_without_its_value(
    kafka_bootstrap: str, kafka_topic: TopicFactory
) -> None:
    topic = kafka_topic(partitions=1)
    config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": "10000"}
    producer = DeadLetterProducer(DeadLetterTarget(topic, "orders", config))

    producer.send(misfits([b"small", b"x" * 50_000]), REASON_COLUMN)

    assert producer.flush() == 2
    small, large = delivered(kafka_bootstrap, topic, 2)
    assert small["value"] == b"small"
    assert large["value"] is None and large["key"] == b"k1"
    headers = large["headers"]
    assert isinstance(headers, dict)
    assert headers["sink-coordinator.source-offset"] == b"101" and headers["trace"] == b"t"
    assert headers["sink-coordinator.value-omitted"] == b"50000 bytes, over the dead-letter producer's message size"


def test_a_dead_letter_over_the_topics_size_limit_is_sent_again_without_its_value(kafka_bootstrap: str) -> None:
    topic = f"dead-letters-{uuid.uuid4().hex[:12]}"
    admin = admin_client(kafka_bootstrap)
    small_messages = NewTopic(topic, num_partitions=1, replication_factor=1, config={"max.message.bytes": "2000"})
    admin.create_topics([small_messages])[topic].result(timeout=ADMIN_TIMEOUT_SECONDS)
    try:
        producer = DeadLetterProducer(DeadLetterTarget(topic, "orders", {"bootstrap.servers": kafka_bootstrap}))

        producer.send(misfits([b"x" * 5000, b"small"]), REASON_COLUMN)

        assert producer.flush() == 2
        rows = {row["key"]: row for row in delivered(kafka_bootstrap, topic, 2)}
        assert rows[b"k1"]["value"] == b"small"
        assert rows[b"k0"]["value"] is None
        headers = rows[b"k0"]["headers"]
        assert isinstance(headers, dict) and headers["sink-coordinator.value-omitted"].startswith(b"5000 bytes")
    finally:
        delete_topics(kafka_bootstrap, [topic])
