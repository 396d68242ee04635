"""The Kafka source's look-ups on the driver: partitions, earliest and last stable offsets.

Driver side only: the stream reader creates one when planning first needs it and drops it when pickled.
Every call is retried on transient errors (a broker restarting or unreachable, a
leader being elected, a timeout) with exponential backoff (the ``fetchOffset.*``
options), so that they delay planning instead of failing the query; any other
error fails at once. A topic's own error in a metadata answer is such an error
too, never a sign that the topic is gone; a topic the stream reads is taken as
gone only when two answers lack it. Latest offsets are last stable offsets
(``read_committed``): a batch never plans past an open transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import Final, TypeVar

import structlog
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from spark_writer.kafka.offsets import Offsets, PartitionKey
from spark_writer.kafka.options import KafkaSourceOptions

log = structlog.get_logger(__name__)

T = TypeVar("T")

METADATA_TIMEOUT_SECONDS: Final = 30.0
METADATA_MAX_BACKOFF_SECONDS: Final = 30.0

# Retried on top of what librdkafka reports as retriable: the broker is restarting or unreachable.
TRANSIENT_KAFKA_ERRORS: Final = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._NOENT,  # "no leaders found": a leader election under way
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.NETWORK_EXCEPTION,
    }
)


# A topic's metadata error that means it does not exist (the answer is otherwise complete).
ABSENT: Final = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART})


def is_transient(error: BaseException) -> bool:
    """A Kafka error worth retrying: a broker restarting or unreachable, a leader being elected, a timeout."""
    if not isinstance(error, KafkaException) or not error.args or not isinstance(error.args[0], KafkaError):
        return False
    kafka_error: KafkaError = error.args[0]
    return bool(kafka_error.retriable()) or kafka_error.code() in TRANSIENT_KAFKA_ERRORS


class KafkaMetadata:
    """Partition discovery and offset look-ups on the driver, through an AdminClient, with retries."""

    def __init__(self, options: KafkaSourceOptions, timeout_seconds: float = METADATA_TIMEOUT_SECONDS) -> None:
        """`timeout_seconds`: how long one call waits for its answer before it counts as a transient error."""
        self._admin = AdminClient(dict(options.kafka_config))
        self._timeout_seconds = timeout_seconds
        self._retries = options.fetch_offset_retries
        self._retry_interval_seconds = options.fetch_offset_retry_interval_ms / 1000

    def _retried(self, call: str, function: Callable[[], T]) -> T:
        def warn(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("kafka_metadata_retry", call=call, attempt=state.attempt_number, error=str(error))

        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential_jitter(
                multiplier=self._retry_interval_seconds,
                jitter=self._retry_interval_seconds,
                max=METADATA_MAX_BACKOFF_SECONDS,
            ),
            stop=stop_after_attempt(self._retries + 1),
            before_sleep=warn,
            reraise=True,
        )
        return retrying(function)

    def partitions(self, topics: Iterable[str], known: Collection[str] = ()) -> list[PartitionKey]:
        """Partitions of the topics that exist.

        A topic whose metadata carries an error (a leader being elected) is asked for again as any transient error
        is, and one with another error fails; it is never taken as missing. A topic missing from an answer has no
        partitions, but one of `known` (topics the stream read before) only when a second answer, a retry interval
        later, confirms it: one broker's incomplete view is not a deletion.
        """
        wanted = tuple(topics)
        found = self._retried("list_topics", lambda: self._answer(wanted))
        unconfirmed = [topic for topic in wanted if topic in known and topic not in found]
        if unconfirmed:
            time.sleep(self._retry_interval_seconds)
            found.update(self._retried("list_topics", lambda: self._answer(unconfirmed)))
            confirmed = [topic for topic in unconfirmed if topic not in found]
            if confirmed:
                log.info("kafka_topics_missing", topics=confirmed, answers=2)
        return sorted(key for keys in found.values() for key in keys)

    def _answer(self, topics: Iterable[str]) -> dict[str, list[PartitionKey]]:
        """One metadata answer: the partitions of each topic in it; KafkaException for a topic's error."""
        cluster = self._admin.list_topics(timeout=self._timeout_seconds)
        found: dict[str, list[PartitionKey]] = {}
        for topic in topics:
            metadata = cluster.topics.get(topic)
            if metadata is None or (metadata.error is not None and metadata.error.code() in ABSENT):
                continue
            if metadata.error is not None:
                raise KafkaException(metadata.error)
            found[topic] = [PartitionKey(topic, partition) for partition in metadata.partitions]
        return found

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """The topic id of each topic whose broker reports one (Kafka 2.8 and later; KIP-516): a topic deleted and
        created again under its name has another. Topics without one (an older broker, or gone) are left out."""
        wanted = sorted(set(topics))
        if not wanted:
            return {}

        def attempt() -> dict[str, str]:
            futures = self._admin.describe_topics(TopicCollection(wanted), request_timeout=self._timeout_seconds)
            ids: dict[str, str] = {}
            for topic, future in futures.items():
                try:
                    topic_id = future.result(timeout=self._timeout_seconds).topic_id
                except KafkaException as error:
                    if error.args and isinstance(error.args[0], KafkaError) and error.args[0].code() in ABSENT:
                        continue
                    raise
                if topic_id.get_most_significant_bits() or topic_id.get_least_significant_bits():
                    ids[topic] = str(topic_id)
            return ids

        return self._retried("describe_topics", attempt)

    def earliest(self, keys: Iterable[PartitionKey]) -> Offsets:
        """Earliest offsets of those of the partitions that exist."""
        return self._list_offsets(keys, OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def latest(self, keys: Iterable[PartitionKey]) -> Offsets:
        """Last stable offsets (what a read_committed consumer can read up to) of those that exist."""
        return self._list_offsets(keys, OffsetSpec.latest())  # type: ignore[no-untyped-call]

    def log_bounds(self, topics: Iterable[str]) -> tuple[Offsets, Offsets]:
        """Earliest and last stable offsets of every partition of the topics that exist, from one look-up of their
        partitions (a fresh read's, spark_writer.fresh: the latest are its start)."""
        keys = self.partitions(topics)
        earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]
        return self._offsets_of(keys, earliest), self._offsets_of(keys, latest)

    def _list_offsets(self, keys: Iterable[PartitionKey], spec: OffsetSpec) -> Offsets:
        wanted = frozenset(keys)
        topics = {key.topic for key in wanted}
        return self._offsets_of(wanted.intersection(self.partitions(topics, known=topics)), spec)

    def _offsets_of(self, existing: Collection[PartitionKey], spec: OffsetSpec) -> Offsets:
        if not existing:
            return {}
        request = {TopicPartition(key.topic, key.partition): spec for key in existing}

        def attempt() -> Offsets:
            futures = self._admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self._timeout_seconds
            )
            return {
                PartitionKey(tp.topic, tp.partition): int(future.result(timeout=self._timeout_seconds).offset)
                for tp, future in futures.items()
            }

        return self._retried("list_offsets", attempt)
