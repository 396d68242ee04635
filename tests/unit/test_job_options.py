"""The sink-writer job's option parsing, without Spark."""

from __future__ import annotations

import inspect

import pytest

from spark_writer.job import KafkaSettings, KafkaSource, ParseSettings, main, parse_size
from spark_writer.kafka_options import parse_options
from spark_writer.kafka_records import BadRecordPolicy, check_time_zone
from spark_writer.session import retries_tasks, with_task_retries


@pytest.mark.parametrize(
    ("text", "size"),
    [("134217728", 134217728), ("128MiB", 128 * 2**20), ("64 MB", 64 * 10**6), ("1gib", 2**30), ("512B", 512)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "-5MiB", "12 parsecs", "1.5GiB"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a positive number of bytes"):
        parse_size(text)


def test_kafka_settings_become_source_options() -> None:
    settings = KafkaSettings(
        "b1:9092,b2:9092",
        ("orders", "refunds"),
        starting_offsets="latest",
        max_offsets_per_trigger=5000,
        fail_on_data_loss=False,
        consumer_options={"security.protocol": "SSL"},
    )
    assert settings.source_options() == {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "subscribe": "orders,refunds",
        "startingOffsets": "latest",
        "failOnDataLoss": "false",
        "maxOffsetsPerTrigger": "5000",
        "kafka.security.protocol": "SSL",
    }


def test_spark_kafka_source_reads_committed_records_with_their_headers() -> None:
    settings = KafkaSettings("b:9092", ("orders",), source=KafkaSource.SPARK)
    assert settings.source_format == "kafka"
    assert settings.source_options() == {
        "kafka.bootstrap.servers": "b:9092",
        "subscribe": "orders",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    assert KafkaSettings("b:9092", ("orders",)).source_format == "sink_coordinator_kafka"


def test_the_job_and_the_source_start_at_the_same_offsets_by_default() -> None:
    """A new query of sink-writer (flag or settings left out) starts where the source alone does: earliest."""
    source_alone = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "orders"}).starting_offsets
    settings = KafkaSettings("b:9092", ("orders",))
    assert inspect.signature(main).parameters["starting_offsets"].default == settings.starting_offsets
    assert parse_options(settings.source_options()).starting_offsets == source_alone == "earliest"


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", "local[1, 4]"),
        ("local[2]", "local[2, 4]"),
        ("local[*]", "local[*, 4]"),
        ("local[2, 8]", "local[2, 8]"),
        ("spark://host:7077", "spark://host:7077"),
        ("yarn", "yarn"),
    ],
)
def test_local_masters_get_task_retries(master: str, expected: str) -> None:
    assert with_task_retries(master) == expected
    assert retries_tasks(expected)


def test_unknown_json_time_zone_is_refused() -> None:
    assert check_time_zone("Europe/Paris") == "Europe/Paris"
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        check_time_zone("Mars/Olympus")


@pytest.mark.parametrize(
    ("policy", "topic"),
    [(BadRecordPolicy.DEAD_LETTER, None), (BadRecordPolicy.NULL, "dead"), (BadRecordPolicy.FAIL, "d")],
)
def test_dead_letter_topic_goes_with_the_dead_letter_policy(policy: BadRecordPolicy, topic: str | None) -> None:
    with pytest.raises(ValueError, match="--dead-letter-topic is required with --on-bad-record dead-letter"):
        ParseSettings(on_bad_record=policy, dead_letter_topic=topic)
