"""Kafka as a PySpark streaming source, without Spark's Kafka connector jar.

Why: Spark's own Kafka source needs its connector jar (and Maven to fetch it),
which this project must not depend on. This module implements the same contract
as a Python Data Source (``pyspark.sql.datasource``) on top of confluent-kafka:

* Offsets are plain JSON ``{topic: {partition: next_offset}}``. The reader hands
  them to Spark from ``initialOffset``/``latestOffset`` and Spark keeps them in its
  checkpoint; the reader itself stores nothing. A micro-batch is therefore fully
  described by its (start, end) offsets, and Spark can re-run an unfinished batch
  after a crash and get exactly the same records - the basis of exactly-once.
* Batch 0 has no stored start in Spark's checkpoint, and Spark asks
  ``initialOffset`` again each time it plans, runs or re-runs it. The starting
  offsets (``earliest``/``latest`` turned into numbers) are therefore resolved
  once, and batch 0's end offsets carry them under ``$start``: Spark writes them to
  ``offsets/0`` before the batch runs, so a re-run reads exactly the same records
  (and ``failOnDataLoss`` applies to them), as Spark's own source does with its
  ``sources/0/0`` file.
* Every micro-batch reads explicit ranges ``[start, end)`` per topic-partition with
  ``assign`` + seek (no consumer group, no offset commits) at ``read_committed``
  isolation. Aborted transactions and transaction markers leave holes in the offset
  sequence, so a range ends when the consumer position reaches ``end``, not after
  ``end - start`` messages.
* ``maxOffsetsPerTrigger`` caps a batch; the cap is split in proportion to the
  partitions' backlogs, to the record (Spark's split rounds each share down, so its
  batches fall a little short of the cap), and every partition with a backlog gets at
  least one record per batch, as in Spark, so none starves under a small cap.
* ``failOnDataLoss`` decides what happens when retention (or delete-records) removed
  records before they were read: fail with an explicit error, or skip ahead.
* Partitions added to a subscribed topic are discovered on every trigger and read
  from offset 0.

The offset arithmetic is kept in small pure functions (``parse_starting_offsets``,
``spread_max_rows``, ``plan_end_offsets``, ``plan_ranges``,
``apply_data_loss_policy``...) so it can be unit-tested without a broker or a JVM.
Rows are returned to Spark as Arrow record batches.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeVar

import pyarrow as pa
import structlog
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

if TYPE_CHECKING:
    from confluent_kafka._types import HeadersType

log = structlog.get_logger(__name__)

T = TypeVar("T")

SOURCE_NAME: Final = "sink_coordinator_kafka"

EARLIEST: Final = -2
LATEST: Final = -1

# Keys of the offsets JSON that are not topics (a Kafka topic name cannot contain '$').
RESERVED_KEY_PREFIX: Final = "$"
# initialOffset's answer: {"$initial": {topic: {partition: offset}}}, the starting offsets resolved once.
INITIAL_KEY: Final = "$initial"
# Batch 0's end offsets also hold its start, so that Spark's offset log (offsets/0) keeps it durably.
START_KEY: Final = "$start"

ARROW_BATCH_MAX_ROWS: Final = 10_000
ARROW_BATCH_MAX_BYTES: Final = 16 * 1024 * 1024
CONSUME_BATCH_SIZE: Final = 1_000
CONSUME_WAIT_SECONDS: Final = 0.5
METADATA_TIMEOUT_SECONDS: Final = 30.0
METADATA_MAX_BACKOFF_SECONDS: Final = 30.0
DEFAULT_FETCH_OFFSET_RETRIES: Final = 6
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS: Final = 1000
# How long a range reader waits without a record before it looks at the partition's log itself.
LOG_CHECK_INTERVAL_SECONDS: Final = 1.0
DEFAULT_POLL_TIMEOUT_MS: Final = 120_000

# Consumer settings the reader depends on; a `kafka.` option may not override them.
RESERVED_CONSUMER_CONFIG: Final = frozenset(
    {
        "enable.auto.commit",
        "enable.auto.offset.store",
        "isolation.level",
        "auto.offset.reset",
        "enable.partition.eof",
    }
)
# Options of Spark's Kafka source that this one does not implement: refuse rather than ignore.
UNSUPPORTED_OPTIONS: Final = frozenset(
    {
        "assign",
        "subscribepattern",
        "startingtimestamp",
        "startingoffsetsbytimestamp",
        "startingoffsetsbytimestampstrategy",
        "endingoffsets",
        "minoffsetspertrigger",
        "maxtriggerdelay",
    }
)

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

# confluent-kafka's timestamp type (0 none, 1 create, 2 log-append) -> Kafka's (-1, 0, 1), as Spark shows it.
KAFKA_TIMESTAMP_TYPE: Final = {0: -1, 1: 0, 2: 1}

KAFKA_SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
    ]
)

# Must equal pyspark's to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"): Spark checks it batch by batch.
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


class DataLossError(RuntimeError):
    """Records that a batch must read are gone from Kafka (and failOnDataLoss is true)."""


FAIL_ON_DATA_LOSS_HINT: Final = (
    "Set the option failOnDataLoss=false (sink-writer: --no-fail-on-data-loss) to skip what is gone instead of failing"
)


class PartitionKey(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


Offsets = dict[PartitionKey, int]
StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[int, int]]


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic-partition: the unit of work of one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def key(self) -> PartitionKey:
        return PartitionKey(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class KafkaSourceOptions:
    topics: tuple[str, ...]
    starting_offsets: StartingOffsets
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    kafka_config: dict[str, str] = field(default_factory=dict)
    fetch_offset_retries: int = DEFAULT_FETCH_OFFSET_RETRIES
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS


def parse_starting_offsets(value: str) -> StartingOffsets:
    """'earliest' | 'latest' | JSON {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest; "$" keys ignored)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"startingOffsets must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {value!r}'
        ) from error
    return _validated_offsets_json(parsed, value)


def _validated_offsets_json(parsed: object, original: str) -> dict[str, dict[int, int]]:
    if not isinstance(parsed, dict):
        raise ValueError(f"startingOffsets JSON must be an object of topics, got {original!r}")
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if topic.startswith(RESERVED_KEY_PREFIX):
            continue  # "$start" of a batch 0's end offsets (no topic name has a "$"): the entry works as it is
        if not isinstance(partitions, dict):
            raise ValueError(f"startingOffsets for topic {topic!r} must be an object, got {partitions!r}")
        result[topic] = {}
        for partition, offset in partitions.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise ValueError(
                    f"startingOffsets for {topic}-{partition} must be an offset >= 0, "
                    f"-2 (earliest) or -1 (latest), got {offset!r}"
                )
            result[topic][int(partition)] = offset
    return result


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, got {value!r}")
    return lowered == "true"


def _parse_positive_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError as error:
        raise ValueError(f"option {name} must be a positive integer, got {value!r}") from error
    if number <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {value!r}")
    return number


def _parse_non_negative_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError as error:
        raise ValueError(f"option {name} must be an integer >= 0, got {value!r}") from error
    if number < 0:
        raise ValueError(f"option {name} must be an integer >= 0, got {value!r}")
    return number


def kafka_config_from_options(options: Mapping[str, str]) -> dict[str, str]:
    """Every ``kafka.*`` option, prefix removed, for confluent-kafka (librdkafka) clients."""
    config = {key[len("kafka.") :]: value for key, value in options.items() if key.startswith("kafka.")}
    reserved = sorted(RESERVED_CONSUMER_CONFIG & config.keys())
    if reserved:
        raise ValueError(
            f"option(s) {', '.join('kafka.' + key for key in reserved)} cannot be set: the source manages "
            "them (it reads explicit offset ranges at read_committed isolation and never commits offsets)"
        )
    return config


def parse_options(options: Mapping[str, str]) -> KafkaSourceOptions:
    """Validate the data source options (names are case-insensitive, as in Spark)."""
    lowered = {key.lower(): value for key, value in options.items()}
    unsupported = sorted(UNSUPPORTED_OPTIONS & lowered.keys())
    if unsupported:
        raise ValueError(f"option(s) not supported by {SOURCE_NAME}: {', '.join(unsupported)}")
    if not lowered.get("kafka.bootstrap.servers"):
        raise ValueError("option kafka.bootstrap.servers is required")
    topics = tuple(topic.strip() for topic in lowered.get("subscribe", "").split(",") if topic.strip())
    if not topics:
        raise ValueError("option subscribe is required: a comma-separated list of topics")
    max_offsets = lowered.get("maxoffsetspertrigger")
    return KafkaSourceOptions(
        topics=topics,
        starting_offsets=parse_starting_offsets(lowered.get("startingoffsets", "latest")),
        max_offsets_per_trigger=(
            None if max_offsets is None else _parse_positive_int("maxOffsetsPerTrigger", max_offsets)
        ),
        fail_on_data_loss=_parse_bool("failOnDataLoss", lowered.get("failondataloss", "true")),
        poll_timeout_ms=_parse_positive_int(
            "kafkaConsumer.pollTimeoutMs",
            lowered.get("kafkaconsumer.polltimeoutms", str(DEFAULT_POLL_TIMEOUT_MS)),
        ),
        kafka_config=kafka_config_from_options(lowered),
        fetch_offset_retries=_parse_non_negative_int(
            "fetchOffset.numRetries", lowered.get("fetchoffset.numretries", str(DEFAULT_FETCH_OFFSET_RETRIES))
        ),
        fetch_offset_retry_interval_ms=_parse_positive_int(
            "fetchOffset.retryIntervalMs",
            lowered.get("fetchoffset.retryintervalms", str(DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS)),
        ),
    )


# --------------------------------------------------------------------------- offsets (pure)


def offsets_to_json(offsets: Mapping[PartitionKey, int]) -> dict[str, dict[str, int]]:
    """Canonical JSON form: topics and partitions sorted, so equal offsets serialise equally."""
    result: dict[str, dict[str, int]] = {}
    for key in sorted(offsets):
        result.setdefault(key.topic, {})[str(key.partition)] = offsets[key]
    return result


def offsets_from_json(data: Mapping[str, Any]) -> Offsets:
    """Offsets of the topics in an offsets JSON (the reserved ``$`` keys are left out)."""
    return {
        PartitionKey(topic, int(partition)): int(offset)
        for topic, partitions in data.items()
        if not topic.startswith(RESERVED_KEY_PREFIX)
        for partition, offset in partitions.items()
    }


def initial_offsets_json(starting: Mapping[PartitionKey, int]) -> dict[str, Any]:
    """What ``initialOffset`` answers: the resolved starting offsets, marked as not yet in the checkpoint."""
    return {INITIAL_KEY: offsets_to_json(starting)}


def planned_end_json(start: Mapping[str, Any], end: Mapping[PartitionKey, int]) -> dict[str, Any]:
    """End offsets of a batch as Spark stores them; batch 0's also carry its start (the resolved starting
    offsets), so that Spark's offset log keeps them durably before the batch runs."""
    result: dict[str, Any] = offsets_to_json(end)
    if INITIAL_KEY in start:
        result = {START_KEY: start[INITIAL_KEY], **result}
    return result


def batch_start_offsets(start: Mapping[str, Any], end: Mapping[str, Any] | None = None) -> Offsets:
    """Where a batch starts: for batch 0 the starting offsets its end recorded when it was planned (never
    those resolved again when Spark asks ``initialOffset`` once more), else its start."""
    if end is not None and START_KEY in end:
        return offsets_from_json(end[START_KEY])
    if INITIAL_KEY in start:
        return offsets_from_json(start[INITIAL_KEY])
    return offsets_from_json(start)


def resolve_starting_offsets(
    spec: StartingOffsets, earliest: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]
) -> Offsets:
    """Concrete start offsets for the partitions that exist now (keys of ``earliest``)."""
    if spec == "earliest":
        return dict(earliest)
    if spec == "latest":
        return {key: latest[key] for key in earliest}
    _check_spec_covers_partitions(spec, set(earliest))
    resolved: Offsets = {}
    for key in earliest:
        requested = spec[key.topic][key.partition]
        resolved[key] = {EARLIEST: earliest[key], LATEST: latest[key]}.get(requested, requested)
    return resolved


def _check_spec_covers_partitions(spec: Mapping[str, Mapping[int, int]], existing: set[PartitionKey]) -> None:
    requested = {PartitionKey(topic, partition) for topic, parts in spec.items() for partition in parts}
    unknown = sorted(requested - existing)
    missing = sorted(existing - requested)
    if unknown or missing:
        raise ValueError(
            "startingOffsets JSON must name exactly the partitions of the subscribed topics; "
            f"unknown partitions: {[str(k) for k in unknown]}, "
            f"missing partitions: {[str(k) for k in missing]}"
        )


def spread_max_rows(available: Mapping[PartitionKey, int], max_rows: int) -> dict[PartitionKey, int]:
    """Share ``max_rows`` between partitions in proportion to their backlogs, to the record.

    Each partition gets its proportional share rounded down, and the records the rounding
    left over go, one each, to the partitions with the largest remainders (the largest
    remainder method), so that a batch holds exactly ``max_rows`` records. Spark's Kafka
    source rounds every share down and stops there: its batches fall short of the cap by up
    to one record per partition, which leaves a last batch of a few records. As in Spark, a
    partition with a backlog always gets at least one record, so none waits behind the
    others however small the cap: a batch can then exceed the cap by at most one record per
    partition whose share was below one. Everything is granted when the backlogs fit under
    the cap; no partition is given more than it has.
    """
    waiting = {key: rows for key, rows in available.items() if rows > 0}
    total = sum(waiting.values())
    if total <= max_rows:
        return {key: max(0, rows) for key, rows in available.items()}
    granted = dict.fromkeys(available, 0)
    for key, rows in waiting.items():
        granted[key] = max(1, max_rows * rows // total)
    left_over = max_rows - sum(granted.values())
    rounded_down = [key for key in waiting if max_rows * waiting[key] >= total]
    for key in sorted(rounded_down, key=lambda key: (-(max_rows * waiting[key] % total), key))[: max(0, left_over)]:
        granted[key] += 1
    return granted


def cap_to_target(latest: Mapping[PartitionKey, int], target: Mapping[PartitionKey, int]) -> Offsets:
    """Latest offsets limited to a Trigger.AvailableNow target (partitions born later are left out)."""
    return {key: min(offset, target[key]) for key, offset in latest.items() if key in target}


def find_lost_partitions(start: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]) -> list[str]:
    """Describe partitions that vanished or whose log end moved below the start offset."""
    problems = []
    for key, offset in sorted(start.items()):
        if key not in latest:
            problems.append(f"partition {key} no longer exists (topic deleted?)")
        elif latest[key] < offset:
            problems.append(
                f"partition {key}: latest offset {latest[key]} is below the start offset {offset} "
                "(topic re-created or records truncated)"
            )
    return problems


def plan_end_offsets(
    start: Mapping[PartitionKey, int],
    earliest: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    max_rows: int | None,
) -> Offsets:
    """End offsets of the next batch.

    New partitions (in ``latest`` but not in ``start``) start at 0. Where records
    below the start were deleted, reading resumes from ``earliest`` (whether that is
    allowed is decided per range by ``apply_data_loss_policy``). Partitions that
    vanished are left out, so that a topic created again is new and read from its
    start (``find_lost_partitions`` decides first whether losing them is allowed);
    a log end below the start becomes the end.
    """
    read_from = {key: max(start.get(key, 0), earliest.get(key, 0)) for key in latest}
    available = {key: max(0, latest[key] - read_from[key]) for key in latest}
    granted = available if max_rows is None else spread_max_rows(available, max_rows)
    end: Offsets = {}
    for key in latest:
        if key in start and latest[key] < start[key]:
            end[key] = latest[key]
        else:
            end[key] = read_from[key] + granted[key]
    return end


def plan_ranges(start: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int]) -> list[OffsetRange]:
    """Non-empty ``[start, end)`` ranges, one per partition; new partitions start at 0."""
    ranges = [OffsetRange(key.topic, key.partition, start.get(key, 0), offset) for key, offset in end.items()]
    return sorted((r for r in ranges if r.size > 0), key=lambda r: r.key)


@dataclass(frozen=True)
class LogBounds:
    """What an existing partition's log holds now: records from ``low`` on, up to ``high`` (None: not looked up)."""

    low: int
    high: int | None = None


def lost_records(offset_range: OffsetRange, bounds: LogBounds | None) -> tuple[OffsetRange | None, str | None]:
    """The part of the range that can still be read, and what cannot (None: nothing is lost).

    ``bounds`` None means the partition no longer exists.
    """
    requested = (
        f"Kafka data loss in topic {offset_range.topic!r} partition {offset_range.partition}: "
        f"offsets [{offset_range.start}, {offset_range.end}) were requested but "
    )
    if bounds is None:
        return None, requested + f"the partition no longer exists (topic deleted?); {offset_range.size} record(s) lost"
    if offset_range.start < bounds.low:
        lost = min(bounds.low, offset_range.end) - offset_range.start
        remaining = OffsetRange(offset_range.topic, offset_range.partition, bounds.low, offset_range.end)
        return (remaining if remaining.size > 0 else None), (
            requested + f"the earliest available offset is {bounds.low}; {lost} record(s) were deleted "
            "(retention or delete-records) before they were read"
        )
    if bounds.high is not None and bounds.high <= offset_range.start < offset_range.end:
        return None, (
            requested + f"the log ends at offset {bounds.high}; {offset_range.size} record(s) are gone "
            "(the log was truncated or the topic created again)"
        )
    return offset_range, None


def report_data_loss(problem: str, fail_on_data_loss: bool) -> None:
    """Fail with DataLossError saying what to do, or log what is skipped."""
    if fail_on_data_loss:
        raise DataLossError(f"{problem}. {FAIL_ON_DATA_LOSS_HINT}")
    log.warning("kafka_data_loss_skipped", message=f"{problem}; skipped (failOnDataLoss=false)")


def apply_data_loss_policy(
    offset_range: OffsetRange, bounds: LogBounds | None, fail_on_data_loss: bool
) -> OffsetRange | None:
    """The part of the range that still exists; what is gone fails the batch or is skipped with a warning."""
    kept, problem = lost_records(offset_range, bounds)
    if problem is not None:
        report_data_loss(problem, fail_on_data_loss)
    return kept


def max_rows_of(limit: ReadLimit) -> int | None:
    """Row cap of a Spark read limit; None means read everything available."""
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    if not isinstance(limit, ReadAllAvailable):
        log.warning("kafka_read_limit_ignored", limit=repr(limit))
    return None


# --------------------------------------------------------------------------- broker access


def consumer_config(options: KafkaSourceOptions) -> dict[str, str | bool]:
    return {
        "group.id": f"{SOURCE_NAME}-{uuid.uuid4().hex}",  # never joined nor committed to
        **options.kafka_config,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }


def is_transient(error: BaseException) -> bool:
    """A Kafka error worth retrying: a broker restarting or unreachable, a leader being elected, a timeout."""
    if not isinstance(error, KafkaException) or not error.args or not isinstance(error.args[0], KafkaError):
        return False
    kafka_error: KafkaError = error.args[0]
    return bool(kafka_error.retriable()) or kafka_error.code() in TRANSIENT_KAFKA_ERRORS


class KafkaMetadata:
    """Partition discovery and offset look-ups on the driver, through an AdminClient.

    Every call is retried on transient errors with exponential backoff (``fetchOffset.*``
    options), so that a leader election or a broker restart delays planning instead
    of failing the query.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._admin = AdminClient(dict(options.kafka_config))
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

    def partitions(self, topics: Iterable[str]) -> list[PartitionKey]:
        """Partitions of the topics that exist; missing topics have none (yet, or any more)."""
        wanted = tuple(topics)
        return self._retried("list_topics", lambda: self._existing(wanted))

    def _existing(self, topics: Iterable[str]) -> list[PartitionKey]:
        cluster = self._admin.list_topics(timeout=METADATA_TIMEOUT_SECONDS)
        keys: list[PartitionKey] = []
        for topic in topics:
            metadata = cluster.topics.get(topic)
            if metadata is None or metadata.error is not None:
                log.debug("kafka_topic_not_found", topic=topic)
                continue
            keys.extend(PartitionKey(topic, partition) for partition in metadata.partitions)
        return sorted(keys)

    def earliest(self, keys: Iterable[PartitionKey]) -> Offsets:
        """Earliest offsets of those of the partitions that exist."""
        return self._list_offsets(keys, OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def latest(self, keys: Iterable[PartitionKey]) -> Offsets:
        """Last stable offsets (what a read_committed consumer can read up to) of those that exist."""
        return self._list_offsets(keys, OffsetSpec.latest())  # type: ignore[no-untyped-call]

    def _list_offsets(self, keys: Iterable[PartitionKey], spec: OffsetSpec) -> Offsets:
        wanted = frozenset(keys)
        if not wanted:
            return {}

        def attempt() -> Offsets:
            existing = wanted.intersection(self._existing({key.topic for key in wanted}))
            request = {TopicPartition(key.topic, key.partition): spec for key in existing}
            if not request:
                return {}
            futures = self._admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=METADATA_TIMEOUT_SECONDS
            )
            return {
                PartitionKey(tp.topic, tp.partition): int(future.result(timeout=METADATA_TIMEOUT_SECONDS).offset)
                for tp, future in futures.items()
            }

        return self._retried("list_offsets", attempt)


# --------------------------------------------------------------------------- reading one range


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


class RangeReader:
    """Reads exactly the committed records of one OffsetRange with an assigned consumer.

    When the log cannot deliver the rest of the range (records deleted below the
    position, a log that ends below it, a partition that no longer exists), the
    data-loss policy decides at once, rather than waiting for the poll timeout.
    """

    def __init__(self, consumer: Consumer, offset_range: OffsetRange, options: KafkaSourceOptions) -> None:
        self._consumer = consumer
        self._range = offset_range
        self._options = options
        self._position = offset_range.start
        self._checked_at = 0.0

    def messages(self) -> Iterator[Message]:
        self._seek(self._position)
        last_progress = time.monotonic()
        while self._position < self._range.end:
            # No more than the range still needs: consume() waits its whole timeout for a batch it cannot fill,
            # and at the end of a topic (a stream's every batch) the range's last records would wait 0.5 s.
            wanted = min(CONSUME_BATCH_SIZE, self._range.end - self._position)
            batch = self._consumer.consume(num_messages=wanted, timeout=CONSUME_WAIT_SECONDS)
            before = self._position
            yield from self._accept(batch)
            now = time.monotonic()
            if self._position > before:
                last_progress = now
            elif now - max(last_progress, self._checked_at) >= LOG_CHECK_INTERVAL_SECONDS:
                # No record and no error for a while: a deleted partition, for one, says nothing.
                self._check_log()
            if self._position < self._range.end and self._position == before:
                self._check_stalled(last_progress)

    def _seek(self, offset: int) -> None:
        self._consumer.assign([TopicPartition(self._range.topic, self._range.partition, offset)])

    def _accept(self, batch: list[Message]) -> Iterator[Message]:
        for message in batch:
            error = message.error()
            if error is not None:
                self._handle_error(error, message)
            elif int(message.offset() or 0) >= self._range.end:
                self._position = self._range.end
            elif int(message.offset() or 0) >= self._position:
                self._position = int(message.offset() or 0) + 1
                yield message
            if self._position >= self._range.end:
                return

    def _handle_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            # End of the readable log: every committed record before it has been delivered.
            log_end = int(message.offset() or 0)
            self._position = max(self._position, min(log_end, self._range.end))
            if log_end < self._range.end:
                self._check_log()  # the log ends below the planned range
        elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            if not self._check_log():
                self._seek(self._position)
        else:
            raise KafkaException(error)

    def _check_log(self) -> bool:
        """Apply the data-loss policy to what the log can no longer deliver; True if the position moved."""
        self._checked_at = time.monotonic()
        known, bounds = self._log_bounds()
        if not known:
            return False
        remaining = OffsetRange(self._range.topic, self._range.partition, self._position, self._range.end)
        kept = apply_data_loss_policy(remaining, bounds, self._options.fail_on_data_loss)
        if kept == remaining:
            return False
        self._position = self._range.end if kept is None else kept.start
        if kept is not None:
            self._seek(kept.start)
        return True

    def _log_bounds(self) -> tuple[bool, LogBounds | None]:
        """(known, bounds): bounds None when the partition is gone; not known when the broker cannot tell now."""
        topic, partition = self._range.topic, self._range.partition
        try:
            cluster = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_SECONDS)
            metadata = cluster.topics.get(topic)
            if metadata is None or (
                metadata.error is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            ):
                return True, None
            if metadata.error is not None:
                return False, None
            if partition not in metadata.partitions:
                return True, None
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_SECONDS, cached=False
            )
        except KafkaException as error:
            log.debug("kafka_log_bounds_unknown", topic=topic, partition=partition, error=str(error))
            return False, None
        return True, LogBounds(int(low), int(high))

    def _check_stalled(self, last_progress: float) -> None:
        waited_ms = (time.monotonic() - last_progress) * 1000
        if waited_ms > self._options.poll_timeout_ms:
            raise TimeoutError(
                f"no progress reading {self._range.topic}-{self._range.partition} at offset {self._position} "
                f"(range [{self._range.start}, {self._range.end})) for {waited_ms:.0f} ms; "
                "raise kafkaConsumer.pollTimeoutMs if the cluster is just slow"
            )


def read_range(offset_range: OffsetRange, options: KafkaSourceOptions) -> Iterator[pa.RecordBatch]:
    """Arrow batches with the committed records of ``offset_range`` (may be empty)."""
    consumer = Consumer(consumer_config(options))
    try:
        builder = ArrowBatchBuilder(offset_range.topic, offset_range.partition)
        for message in RangeReader(consumer, offset_range, options).messages():
            builder.append(message)
            if builder.is_full():
                yield builder.build()
        if len(builder):
            yield builder.build()
    finally:
        consumer.close()


# --------------------------------------------------------------------------- Spark glue


class KafkaInputPartition(InputPartition):
    """One Spark task: one topic-partition's offset range."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)

    @property
    def offset_range(self) -> OffsetRange:
        assert isinstance(self.value, OffsetRange)
        return self.value


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; reads them on executors.

    The planning methods run in one long-lived Python process on the driver and
    share a lazily created AdminClient. The reader object is also pickled to the
    executors for ``read``, so the client is dropped when pickling.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._metadata: KafkaMetadata | None = None
        self._available_now_target: Offsets | None = None
        self._last_seen_latest: Offsets | None = None
        self._starting: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_metadata"] = None
        return state

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self._options)
        return self._metadata

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's API)
        """The starting offsets, resolved once per reader (Spark asks again when it runs batch 0).

        Only the answer Spark plans batch 0 with counts: ``latestOffset`` copies it
        into batch 0's end offsets, which Spark writes to its offset log before the
        batch runs, and ``partitions`` reads batch 0 from there. A restart (a new
        reader resolving again) therefore re-runs batch 0 from the same offsets.
        """
        if self._starting is None:
            keys = self.metadata.partitions(self._options.topics)
            earliest, latest = self.metadata.earliest(keys), self.metadata.latest(keys)
            self._starting = resolve_starting_offsets(self._options.starting_offsets, earliest, latest)
            log.info("kafka_initial_offsets", offsets=offsets_to_json(self._starting))
        return initial_offsets_json(self._starting)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 (Spark's API)
        if self._options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark's API)
        keys = self.metadata.partitions(self._options.topics)
        self._available_now_target = self.metadata.latest(keys)
        log.info("kafka_available_now_target", offsets=offsets_to_json(self._available_now_target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802 (Spark's API)
        start_offsets = batch_start_offsets(start)
        keys = self.metadata.partitions(self._options.topics)
        latest = self.metadata.latest(keys)
        self._last_seen_latest = latest
        self._check_no_lost_partitions(start_offsets, latest)
        if self._available_now_target is not None:
            latest = cap_to_target(latest, self._available_now_target)
        earliest = self.metadata.earliest(latest)
        end = plan_end_offsets(start_offsets, earliest, latest, max_rows_of(limit))
        return planned_end_json(start, end)

    def _check_no_lost_partitions(self, start: Offsets, latest: Offsets) -> None:
        for problem in find_lost_partitions(start, latest):
            report_data_loss(f"Kafka data loss: {problem}", self._options.fail_on_data_loss)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 (Spark's API)
        return None if self._last_seen_latest is None else offsets_to_json(self._last_seen_latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        ranges = plan_ranges(batch_start_offsets(start, end), offsets_from_json(end))
        earliest = self.metadata.earliest(r.key for r in ranges)
        planned = []
        for offset_range in ranges:
            bounds = LogBounds(earliest[offset_range.key]) if offset_range.key in earliest else None
            kept = apply_data_loss_policy(offset_range, bounds, self._options.fail_on_data_loss)
            if kept is not None:
                planned.append(KafkaInputPartition(kept))
        log.debug("kafka_batch_planned", ranges=[str(p.offset_range) for p in planned])
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition), f"unexpected partition {partition!r}"
        return read_range(partition.offset_range, self._options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        self._metadata = None


class KafkaDataSource(DataSource):
    """``spark.readStream.format("sink_coordinator_kafka")``: Kafka records, Spark Kafka source columns."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802 (Spark's API)
        return KafkaStreamReader(parse_options(self.options))
