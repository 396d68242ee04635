"""The offsets a topic still holds in a range: read with a consumer that joins no group and commits nothing, at
read_committed isolation as the writer reads (transaction markers and aborted records are not offsets a row can
have), keeping each record's offset only. confluent-kafka is the writer's dependency, not the server's: only this
check needs it. Offsets a compacted topic dropped are absent, those before the log start
gone: neither is a record the table misses."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator_service.contract.errors import FailedPrecondition, InvalidArgument, Unavailable
from coordinator_service.engine.verification.findings import TopicPartition
from coordinator_service.settings.verification import kafka_access_problem

BATCH = 10_000


@dataclass(frozen=True)
class KafkaAccess:
    """Where the topics are and how to reach them (librdkafka settings)."""

    bootstrap_servers: str
    options: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        problem = kafka_access_problem(self.bootstrap_servers, self.options)
        if problem is not None:
            raise InvalidArgument(problem)
        if not 0 < self.timeout_seconds <= 3600:
            raise InvalidArgument(f"the Kafka timeout must be in (0, 3600] seconds, got {self.timeout_seconds}")


@dataclass
class TopicOffsets:
    topic: str
    partition: int
    offsets: list[int] = field(default_factory=list)
    before_log_start: int = 0


def read_offsets(access: KafkaAccess, ranges: Mapping[TopicPartition, tuple[int, int]]) -> dict[str, TopicOffsets]:
    """The offsets each topic-partition holds in [start, end), by "topic-partition"."""
    try:
        from confluent_kafka import Consumer, KafkaError, KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition
    except ImportError:
        raise FailedPrecondition(
            "verifying against Kafka needs confluent-kafka, which the writer's extra installs: "
            "pip install 'sink-coordinator[all]'"
        ) from None

    config = {
        **access.options,
        "bootstrap.servers": access.bootstrap_servers,
        "group.id": f"sink-coordinator-verify-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": access.options.get("isolation.level", "read_committed"),
    }
    found: dict[str, TopicOffsets] = {}
    try:
        consumer = Consumer(config)
    except KafkaException as error:
        raise InvalidArgument(f"cannot make a Kafka consumer of these settings: {error}") from None
    try:
        for (topic, partition), (start, end) in sorted(ranges.items()):
            held = found[f"{topic}-{partition}"] = TopicOffsets(topic, partition)
            if end <= start:
                continue
            low, high = consumer.get_watermark_offsets(KafkaPartition(topic, partition), timeout=access.timeout_seconds)
            held.before_log_start = max(0, min(low, end) - start)
            begin, stop = max(start, low), min(end, high)
            if begin >= stop:
                continue
            consumer.assign([KafkaPartition(topic, partition, begin)])
            deadline = time.monotonic() + access.timeout_seconds
            done = False
            while not done:
                if time.monotonic() > deadline:
                    raise Unavailable(f"reading {topic}-{partition} took longer than {access.timeout_seconds} s")
                for message in consumer.consume(BATCH, timeout=1.0):
                    failure = message.error()
                    if failure is not None:
                        if failure.code() == KafkaError._PARTITION_EOF:
                            done = True
                            break
                        raise Unavailable(f"reading {topic}-{partition}: {failure.str()}")
                    offset = message.offset()
                    if offset is None or offset >= stop:
                        done = True
                        break
                    held.offsets.append(offset)
    except KafkaException as error:
        raise Unavailable(f"Kafka: {error}") from None
    finally:
        consumer.close()
    return found
