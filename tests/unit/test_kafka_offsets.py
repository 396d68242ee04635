"""Offset planning of the Kafka source: pure functions, no broker, no JVM."""

from __future__ import annotations

import json
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from structlog.testing import capture_logs

from spark_writer import kafka_source
from spark_writer.kafka_source import (
    KAFKA_ARROW_SCHEMA,
    KAFKA_SCHEMA,
    DataLossError,
    KafkaStreamReader,
    LogBounds,
    OffsetRange,
    PartitionKey,
    apply_data_loss_policy,
    batch_start_offsets,
    cap_to_target,
    consumer_config,
    find_lost_partitions,
    initial_offsets_json,
    lost_records,
    max_rows_of,
    offsets_from_json,
    offsets_to_json,
    parse_options,
    parse_starting_offsets,
    plan_end_offsets,
    plan_ranges,
    planned_end_json,
    resolve_starting_offsets,
    spread_max_rows,
)

A0, A1, A2 = PartitionKey("a", 0), PartitionKey("a", 1), PartitionKey("a", 2)
B0 = PartitionKey("b", 0)
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


EARLIEST = {A0: 5, A1: 0, A2: 7}
LATEST = {A0: 50, A1: 10, A2: 70}


def test_resolve_earliest_and_latest() -> None:
    assert resolve_starting_offsets("earliest", EARLIEST, LATEST) == EARLIEST
    assert resolve_starting_offsets("latest", EARLIEST, LATEST) == LATEST


def test_resolve_json_with_special_offsets() -> None:
    spec = {"a": {0: 23, 1: -2, 2: -1}}
    assert resolve_starting_offsets(spec, EARLIEST, LATEST) == {A0: 23, A1: 0, A2: 70}


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"a": {0: 1, 1: 1}}, r"missing partitions: \['a-2'\]"), ({"a": {0: 1, 1: 1, 2: 1, 3: 1}}, "a-3")],
)
def test_resolve_json_must_name_exactly_the_partitions(spec: dict[str, dict[int, int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_starting_offsets(spec, EARLIEST, LATEST)


# ------------------------------------------------------------------ maxOffsetsPerTrigger


def test_spread_proportional_to_backlogs() -> None:
    assert spread_max_rows({A0: 100, A1: 100, A2: 100}, 30) == {A0: 10, A1: 10, A2: 10}
    # Shares 0.79, 39.47 and 19.74: rounded down (58), the two records left go to the largest remainders.
    assert spread_max_rows({A0: 2, A1: 100, A2: 50}, 60) == {A0: 1, A1: 39, A2: 20}


def test_a_batch_under_the_cap_holds_exactly_the_cap() -> None:
    # Spark rounds each share down: 4 x 3,124 = 12,496 of 12,500, and a fifth batch of 4 records follows.
    available = {A0: 24_999, A1: 25_001, A2: 24_998, B0: 25_002}
    assert sum(spread_max_rows(available, 12_500).values()) == 12_500


def test_spread_grants_everything_under_the_cap() -> None:
    available = {A0: 3, A1: 0, A2: 4}
    assert spread_max_rows(available, 100) == available
    assert spread_max_rows(available, 7) == available


def test_spread_gives_every_backlog_a_record_even_under_a_tiny_cap() -> None:
    assert spread_max_rows({A0: 10, A1: 30, A2: 20, B0: 0}, 2) == {A0: 1, A1: 1, A2: 1, B0: 0}


def test_small_cap_starves_no_partition_over_many_triggers() -> None:
    """4 partitions with a backlog, a cap of 2: every record produced is read within the triggers."""
    keys = (A0, A1, A2, B0)
    latest = {A0: 1, A1: 40, A2: 40, B0: 40}
    start = dict.fromkeys(keys, 0)
    for _ in range(50):
        for key in (A1, A2, B0):
            latest[key] += 1  # the big partitions keep growing
        start = plan_end_offsets(start, dict.fromkeys(keys, 0), latest, max_rows=2)
    assert start[A0] == latest[A0], f"partition a-0 starved: read up to {start[A0]} of {latest[A0]}"
    assert all(start[key] >= 50 for key in (A1, A2, B0))


backlogs = st.dictionaries(
    st.builds(PartitionKey, st.sampled_from("abc"), st.integers(0, 7)), st.integers(0, 10_000), max_size=24
)


@given(available=backlogs, max_rows=st.integers(1, 50_000))
def test_spread_properties(available: dict[PartitionKey, int], max_rows: int) -> None:
    granted = spread_max_rows(available, max_rows)
    assert granted.keys() == available.keys()
    assert all(0 <= granted[key] <= available[key] for key in available), "more than a partition has"
    waiting = [key for key, rows in available.items() if rows > 0]
    assert all(granted[key] >= 1 for key in waiting), "a partition with a backlog got nothing"
    total = sum(available.values())
    if total <= max_rows:
        assert granted == available
    else:
        # The cap exactly, or over it by at most the one record each starved share is rounded up to.
        assert max_rows <= sum(granted.values()) <= max_rows + len(waiting)


@given(available=backlogs, max_rows=st.integers(1, 200), triggers=st.integers(1, 5))
def test_every_backlog_drains_in_bounded_triggers(
    available: dict[PartitionKey, int], max_rows: int, triggers: int
) -> None:
    """Each trigger reads at least one record of every partition with a backlog: none waits behind the others."""
    remaining = dict(available)
    for _ in range(triggers):
        granted = spread_max_rows(remaining, max_rows)
        for key, rows in remaining.items():
            assert granted[key] >= min(1, rows)
        remaining = {key: rows - granted[key] for key, rows in remaining.items()}
    for key, rows in available.items():
        assert remaining[key] <= max(0, rows - triggers)


def test_max_rows_of_read_limits() -> None:
    assert max_rows_of(ReadMaxRows(7)) == 7
    assert max_rows_of(ReadAllAvailable()) is None


def test_default_read_limit_follows_max_offsets_per_trigger() -> None:
    capped = KafkaStreamReader(parse_options({**BOOTSTRAP, "maxOffsetsPerTrigger": "25"}))
    assert capped.getDefaultReadLimit() == ReadMaxRows(25)
    assert isinstance(KafkaStreamReader(parse_options(BOOTSTRAP)).getDefaultReadLimit(), ReadAllAvailable)


# ------------------------------------------------------------------ end offsets and ranges


def test_plan_end_reads_everything_without_cap() -> None:
    assert plan_end_offsets({A0: 5, A1: 3}, {A0: 0, A1: 0}, {A0: 9, A1: 3}, None) == {A0: 9, A1: 3}


def test_plan_end_respects_cap() -> None:
    end = plan_end_offsets({A0: 0, A1: 0}, {A0: 0, A1: 0}, {A0: 100, A1: 4}, 10)
    assert end == {A0: 9, A1: 1}


def test_plan_end_new_partition_starts_at_zero() -> None:
    assert plan_end_offsets({A0: 5}, {A0: 0, A1: 0}, {A0: 5, A1: 8}, None) == {A0: 5, A1: 8}
    assert plan_ranges({A0: 5}, {A0: 5, A1: 8}) == [OffsetRange("a", 1, 0, 8)]


def test_plan_end_after_deleted_records_counts_from_earliest() -> None:
    # 10 records below offset 20 were deleted: the cap applies to what still exists.
    end = plan_end_offsets({A0: 10}, {A0: 20}, {A0: 100}, 5)
    assert end == {A0: 25}
    assert plan_ranges({A0: 10}, end) == [OffsetRange("a", 0, 10, 25)]


def test_plan_end_leaves_out_vanished_partitions_and_follows_regressed_ones() -> None:
    # a-0 is gone: left out, so that the topic created again is new (read from 0) in a later batch.
    assert plan_end_offsets({A0: 5, A1: 9}, {A1: 0}, {A1: 2}, None) == {A1: 2}
    assert find_lost_partitions({A0: 5, A1: 9}, {A1: 2}) == [
        "partition a-0 no longer exists (topic deleted?)",
        "partition a-1: latest offset 2 is below the start offset 9 (topic re-created or records truncated)",
    ]
    assert find_lost_partitions({A0: 5}, {A0: 5, A1: 0}) == []


def test_plan_ranges_skips_empty_and_backwards_ranges() -> None:
    ranges = plan_ranges({A0: 5, A1: 9, A2: 0}, {A0: 5, A1: 2, A2: 3, B0: 0})
    assert ranges == [OffsetRange("a", 2, 0, 3)]


def test_cap_to_target_leaves_out_partitions_born_after_it() -> None:
    assert cap_to_target({A0: 50, A1: 7, A2: 3}, {A0: 40, A1: 9}) == {A0: 40, A1: 7}


# ------------------------------------------------------------------ failOnDataLoss


def test_data_loss_policy_passes_intact_ranges() -> None:
    intact = OffsetRange("a", 0, 20, 30)
    assert apply_data_loss_policy(intact, LogBounds(20), fail_on_data_loss=True) is intact
    assert apply_data_loss_policy(intact, LogBounds(0, 25), fail_on_data_loss=True) is intact


def test_data_loss_policy_fails_with_a_clear_message() -> None:
    with pytest.raises(DataLossError) as raised:
        apply_data_loss_policy(OffsetRange("orders", 3, 10, 30), LogBounds(15), fail_on_data_loss=True)
    message = str(raised.value)
    assert "'orders' partition 3" in message
    assert "[10, 30)" in message
    assert "earliest available offset is 15" in message
    assert "5 record(s)" in message
    assert "failOnDataLoss=false" in message


def test_data_loss_policy_skips_to_earliest_when_allowed() -> None:
    with capture_logs() as logs:
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(15), False) == OffsetRange("a", 0, 15, 30)
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(30), False) is None
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(99), False) is None
        assert apply_data_loss_policy(OffsetRange("a", 0, 20, 30), LogBounds(15), False) == OffsetRange("a", 0, 20, 30)
    assert [line["event"] for line in logs] == ["kafka_data_loss_skipped"] * 3, "only what was skipped is logged"


@pytest.mark.parametrize(
    ("bounds", "kept", "described"),
    [
        (None, None, "[10, 30) were requested but the partition no longer exists (topic deleted?); 20 record(s)"),
        (LogBounds(0, 10), None, "[10, 30) were requested but the log ends at offset 10; 20 record(s) are gone"),
        (LogBounds(0, 4), None, "the log ends at offset 4"),
        (LogBounds(0, 12), OffsetRange("a", 0, 10, 30), None),  # readable up to 12: read it, look again then
    ],
)
def test_lost_records_of_a_missing_or_truncated_log(
    bounds: LogBounds | None, kept: OffsetRange | None, described: str | None
) -> None:
    remaining, problem = lost_records(OffsetRange("a", 0, 10, 30), bounds)
    assert remaining == kept
    if described is None:
        assert problem is None
    else:
        assert problem is not None and described in problem


# ------------------------------------------------------------------ offsets JSON


def test_offsets_json_round_trip_is_canonical() -> None:
    offsets = {B0: 1, A2: 3, A0: 7, PartitionKey("a", 10): 4}
    as_json = offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"a": {"0": 7, "2": 3, "10": 4}, "b": {"0": 1}}'
    assert offsets_from_json(json.loads(json.dumps(as_json))) == offsets


def test_batch_0_end_carries_its_start_and_later_batches_ignore_it() -> None:
    initial = initial_offsets_json({A0: 3, B0: 0})
    assert initial == {"$initial": {"a": {"0": 3}, "b": {"0": 0}}}
    end_0 = planned_end_json(initial, {A0: 8, B0: 2})
    assert json.dumps(end_0) == '{"$start": {"a": {"0": 3}, "b": {"0": 0}}, "a": {"0": 8}, "b": {"0": 2}}'
    # Planning and running batch 0: its start is the one recorded in its end, whatever initialOffset says now.
    assert batch_start_offsets(initial) == {A0: 3, B0: 0}
    assert batch_start_offsets(initial_offsets_json({A0: 9, B0: 5}), end_0) == {A0: 3, B0: 0}
    # Batch 1 starts at batch 0's end; its own end carries no start.
    assert batch_start_offsets(end_0) == {A0: 8, B0: 2}
    end_1 = planned_end_json(end_0, {A0: 9, B0: 2})
    assert end_1 == {"a": {"0": 9}, "b": {"0": 2}}
    assert batch_start_offsets(end_0, end_1) == {A0: 8, B0: 2}
    assert offsets_from_json(end_0) == {A0: 8, B0: 2}


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
    assert options.starting_offsets == "latest"
    assert options.max_offsets_per_trigger == 100
    assert options.fail_on_data_loss is True
    assert options.kafka_config == {
        "bootstrap.servers": "k:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
    }
    config = consumer_config(options)
    assert config["isolation.level"] == "read_committed"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["enable.auto.commit"] is False


def test_parse_options_names_are_case_insensitive() -> None:
    options = parse_options({**BOOTSTRAP, "STARTINGOFFSETS": "earliest", "failondataloss": "FALSE"})
    assert options.starting_offsets == "earliest"
    assert options.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers is required"),
        ({"kafka.bootstrap.servers": "k:1"}, "subscribe is required"),
        ({**BOOTSTRAP, "kafka.isolation.level": "read_uncommitted"}, "kafka.isolation.level cannot be set"),
        ({**BOOTSTRAP, "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit cannot be set"),
        ({**BOOTSTRAP, "assign": '{"a": [0]}'}, "not supported.*assign"),
        ({**BOOTSTRAP, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({**BOOTSTRAP, "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({**BOOTSTRAP, "fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries must be an integer >= 0"),
        ({**BOOTSTRAP, "fetchOffset.retryIntervalMs": "soon"}, "fetchOffset.retryIntervalMs must be a positive"),
    ],
)
def test_parse_options_rejects_invalid(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(options)


# ------------------------------------------------------------------ rows


def test_arrow_schema_is_what_spark_expects() -> None:
    assert KAFKA_ARROW_SCHEMA.equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))


# ------------------------------------------------------------------ transient metadata errors


class FlakyAdmin:
    """An AdminClient whose first calls fail as during a broker restart or a leader election."""

    failures: ClassVar[list[KafkaError]] = []

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config

    def _maybe_fail(self) -> None:
        if FlakyAdmin.failures:
            raise KafkaException(FlakyAdmin.failures.pop(0))

    def list_topics(self, timeout: float) -> Any:
        self._maybe_fail()
        return SimpleNamespace(topics={"a": SimpleNamespace(error=None, partitions={0: None})})

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future[Any]]:
        self._maybe_fail()
        answers = {}
        for tp in request:
            answer: Future[Any] = Future()
            answer.set_result(SimpleNamespace(offset=7))
            answers[tp] = answer
        return answers


def test_planning_retries_transient_metadata_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_source, "AdminClient", FlakyAdmin)
    FlakyAdmin.failures = [
        KafkaError(KafkaError._TRANSPORT),
        KafkaError(KafkaError.LEADER_NOT_AVAILABLE),
        KafkaError(KafkaError._ALL_BROKERS_DOWN),
    ]
    reader = KafkaStreamReader(parse_options({**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1"}))
    with capture_logs() as logs:
        end = reader.latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    assert end == {"a": {"0": 7}}
    assert [line["event"] for line in logs].count("kafka_metadata_retry") == 3


def test_planning_gives_up_after_the_retries_and_at_once_on_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_source, "AdminClient", FlakyAdmin)
    options = {**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1", "fetchOffset.numRetries": "2"}
    FlakyAdmin.failures = [KafkaError(KafkaError._TRANSPORT)] * 3
    with pytest.raises(KafkaException, match="_TRANSPORT"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    FlakyAdmin.failures = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    with capture_logs() as logs, pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    assert logs == []
