"""The Kafka source's name and options: parsed and validated before anything is read.

Option names are case-insensitive, as in Spark. The options of Spark's Kafka
source that this one does not implement and that would change what is read
(``UNSUPPORTED_OPTIONS``) are refused rather than ignored, and so are the
``kafka.*`` consumer settings the source depends on and any other name the
source does not know (a misspelt ``maxOffsetsPerTrigger`` would otherwise read
everything in one batch). Two of Spark's options change nothing here and are
taken as they are: ``includeHeaders=true`` (headers are always read) and
``groupIdPrefix`` (no consumer group is joined).

``DEFAULT_STARTING_OFFSETS`` is the one default of ``startingOffsets``, for this
source and for the ``sink-writer`` job (``--starting-offsets``), whichever source
the job reads with: ``earliest``, so that a new query writes what the topics hold.
Spark's own Kafka source starts streaming queries at ``latest``; give
``startingOffsets=latest`` for that.

No broker, no Spark here (tests/unit/test_writer_imports.py checks it): the job
parses its options before Spark starts.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from spark_writer.kafka.offsets import EARLIEST, RESERVED_KEY_PREFIX, StartingOffsets

# spark.readStream.format(SOURCE_NAME)
SOURCE_NAME: Final = "sink_coordinator_kafka"

DEFAULT_STARTING_OFFSETS: Final = "earliest"
DEFAULT_FETCH_OFFSET_RETRIES: Final = 6
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS: Final = 1000
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
        "minpartitions",  # a topic-partition's range is one task, never split
        "maxrecordsperpartition",
    }
)

# The options this source reads (lower case), besides the `kafka.*` consumer settings.
KNOWN_OPTIONS: Final = frozenset(
    {
        "subscribe",
        "startingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "kafkaconsumer.polltimeoutms",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
        "groupidprefix",
        "includeheaders",
    }
)


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


def parse_options(options: Mapping[str, str]) -> KafkaSourceOptions:
    """Validate the data source options (names are case-insensitive, as in Spark)."""
    lowered = {key.lower(): value for key, value in options.items()}
    unsupported = sorted(UNSUPPORTED_OPTIONS & lowered.keys())
    if unsupported:
        raise ValueError(f"option(s) not supported by {SOURCE_NAME}: {', '.join(unsupported)}")
    unknown = sorted(key for key in lowered if key not in KNOWN_OPTIONS and not key.startswith("kafka."))
    if unknown:
        raise ValueError(f"option(s) unknown to {SOURCE_NAME}: {'; '.join(_with_suggestion(key) for key in unknown)}")
    if not _parse_bool("includeHeaders", lowered.get("includeheaders", "true")):
        raise ValueError("option includeHeaders=false is not supported: the source always reads the headers")
    if not lowered.get("kafka.bootstrap.servers"):
        raise ValueError("option kafka.bootstrap.servers is required")
    topics = tuple(topic.strip() for topic in lowered.get("subscribe", "").split(",") if topic.strip())
    if not topics:
        raise ValueError("option subscribe is required: a comma-separated list of topics")
    max_offsets = lowered.get("maxoffsetspertrigger")
    return KafkaSourceOptions(
        topics=topics,
        starting_offsets=parse_starting_offsets(lowered.get("startingoffsets", DEFAULT_STARTING_OFFSETS)),
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


def _with_suggestion(key: str) -> str:
    close = difflib.get_close_matches(key, sorted(KNOWN_OPTIONS), n=1)
    return f"{key} (did you mean {close[0]}?)" if close else key


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
