"""Options of the Kafka source (spark_writer.kafka.options): parsed and validated, no broker, no JVM."""

from __future__ import annotations

import pytest

from spark_writer.kafka.options import DEFAULT_STARTING_OFFSETS, parse_options, parse_starting_offsets

BOOTSTRAP = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "a"}


# ------------------------------------------------------------------ startingOffsets


@pytest.mark.parametrize(("text", "expected"), [("earliest", "earliest"), (" LATEST ", "latest")])
def test_parse_starting_offsets_keywords(text: str, expected: str) -> None:
    assert parse_starting_offsets(text) == expected


def test_parse_starting_offsets_json() -> None:
    assert parse_starting_offsets('{"a": {"0": 23, "1": -2, "2": -1}}') == {"a": {0: 23, 1: -2, 2: -1}}


def test_a_batch_0_end_offsets_entry_is_a_starting_offsets_value() -> None:
    # docs/operations.md: after a reset, start the new query from the last committed epoch's
    # spark.end_offsets entry; batch 0's entry carries its resolved start under "$start" too.
    entry = '{"$start": {"a": {"0": 0, "1": 4}}, "a": {"0": 23, "1": 17}}'
    assert parse_starting_offsets(entry) == {"a": {0: 23, 1: 17}}


@pytest.mark.parametrize(
    "text", ["soonest", '{"a": [1]}', '{"a": {"0": -3}}', '{"a": {"0": "5"}}', '{"a": {"0": true}}', "[1]"]
)
def test_parse_starting_offsets_rejects_invalid(text: str) -> None:
    with pytest.raises(ValueError, match="startingOffsets"):
        parse_starting_offsets(text)


# ------------------------------------------------------------------ options


def test_parse_options_defaults_and_passthrough() -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "k:9092",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "subscribe": "a, b,",
            "maxOffsetsPerTrigger": "100",
        }
    )
    assert options.topics == ("a", "b")
    assert options.starting_offsets == DEFAULT_STARTING_OFFSETS == "earliest"
    assert options.max_offsets_per_trigger == 100
    assert options.fail_on_data_loss is True
    assert options.kafka_config == {
        "bootstrap.servers": "k:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
    }


def test_spark_options_that_change_nothing_here_are_taken() -> None:
    options = parse_options({**BOOTSTRAP, "includeHeaders": "true", "groupIdPrefix": "spark-kafka-source"})
    assert options.kafka_config == {"bootstrap.servers": BOOTSTRAP["kafka.bootstrap.servers"]}


def test_parse_options_names_are_case_insensitive() -> None:
    options = parse_options({**BOOTSTRAP, "STARTINGOFFSETS": "latest", "failondataloss": "FALSE"})
    assert options.starting_offsets == "latest"
    assert options.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers is required"),
        ({"kafka.bootstrap.servers": "k:1"}, "subscribe is required"),
        ({**BOOTSTRAP, "kafka.isolation.level": "read_uncommitted"}, "kafka.isolation.level cannot be set"),
        ({**BOOTSTRAP, "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit cannot be set"),
        ({**BOOTSTRAP, "assign": '{"a": [0]}'}, "not supported.*assign"),
        ({**BOOTSTRAP, "minPartitions": "8"}, "not supported.*minpartitions"),
        (
            {**BOOTSTRAP, "maxOffsetPerTrigger": "10"},
            r"unknown.*maxoffsetpertrigger \(did you mean maxoffsetspertrigger",
        ),
        ({**BOOTSTRAP, "includeHeaders": "false"}, "includeHeaders=false is not supported"),
        ({**BOOTSTRAP, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({**BOOTSTRAP, "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({**BOOTSTRAP, "fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries must be an integer >= 0"),
        ({**BOOTSTRAP, "fetchOffset.retryIntervalMs": "soon"}, "fetchOffset.retryIntervalMs must be a positive"),
    ],
)
def test_parse_options_rejects_invalid(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(options)
