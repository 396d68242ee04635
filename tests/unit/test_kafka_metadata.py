"""The driver's Kafka look-ups (spark_writer.kafka.metadata): transient errors retried, others not.

A stand-in AdminClient fails as a broker restart or a leader election makes the real one fail.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition, Uuid
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]
from pyspark.sql.streaming.datasource import ReadAllAvailable
from structlog.testing import capture_logs

from spark_writer.kafka import metadata as kafka_metadata
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.source import KafkaStreamReader

BOOTSTRAP = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "a"}


def described(topics: TopicCollection, topic_id: Uuid) -> dict[str, Future[Any]]:
    answers = {}
    for topic in topics.topic_names:
        answer: Future[Any] = Future()
        answer.set_result(SimpleNamespace(topic_id=topic_id))
        answers[topic] = answer
    return answers


def offsets_in(end: dict[str, Any]) -> dict[str, Any]:
    """The topics' offsets of an offsets JSON, without its "$" entries."""
    return {topic: offsets for topic, offsets in end.items() if not topic.startswith("$")}


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

    def describe_topics(self, topics: TopicCollection, **_: Any) -> dict[str, Future[Any]]:
        self._maybe_fail()
        return described(topics, Uuid(0, 0))

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future[Any]]:
        self._maybe_fail()
        answers = {}
        for tp in request:
            answer: Future[Any] = Future()
            answer.set_result(SimpleNamespace(offset=7))
            answers[tp] = answer
        return answers


def test_planning_retries_transient_metadata_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_metadata, "AdminClient", FlakyAdmin)
    FlakyAdmin.failures = [
        KafkaError(KafkaError._TRANSPORT),
        KafkaError(KafkaError.LEADER_NOT_AVAILABLE),
        KafkaError(KafkaError._ALL_BROKERS_DOWN),
    ]
    reader = KafkaStreamReader(parse_options({**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1"}))
    with capture_logs() as logs:
        end = reader.latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    assert offsets_in(end) == {"a": {"0": 7}}
    assert [line["event"] for line in logs].count("kafka_metadata_retry") == 3


def test_planning_gives_up_after_the_retries_and_at_once_on_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_metadata, "AdminClient", FlakyAdmin)
    options = {**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1", "fetchOffset.numRetries": "2"}
    FlakyAdmin.failures = [KafkaError(KafkaError._TRANSPORT)] * 3
    with pytest.raises(KafkaException, match="_TRANSPORT"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    FlakyAdmin.failures = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    with capture_logs() as logs, pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    assert logs == []


class ScriptedAdmin:
    """An AdminClient whose metadata answers are scripted: each list_topics answer gives, per topic, an error or
    its partitions (a topic left out is missing from that answer); the last answer repeats."""

    answers: ClassVar[list[dict[str, KafkaError | None]]] = []
    calls: ClassVar[int] = 0

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config

    def list_topics(self, timeout: float) -> Any:
        ScriptedAdmin.calls += 1
        answer = ScriptedAdmin.answers.pop(0) if len(ScriptedAdmin.answers) > 1 else ScriptedAdmin.answers[0]
        return SimpleNamespace(
            topics={topic: SimpleNamespace(error=error, partitions={0: None}) for topic, error in answer.items()}
        )

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future[Any]]:
        answers = {}
        for tp, spec in request.items():
            answer: Future[Any] = Future()
            answer.set_result(SimpleNamespace(offset=0 if type(spec) is type(EARLIEST) else 7))
            answers[tp] = answer
        return answers

    def describe_topics(self, topics: TopicCollection, **_: Any) -> dict[str, Future[Any]]:
        return described(topics, Uuid(0, 0))  # no topic ids, as an older broker


EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
LEADER_ELECTION = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedAdmin]:
    monkeypatch.setattr(kafka_metadata, "AdminClient", ScriptedAdmin)
    ScriptedAdmin.calls = 0
    return ScriptedAdmin


def lenient_reader(**options: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        parse_options({**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1", "failOnDataLoss": "false", **options})
    )


def test_a_topic_with_an_error_in_one_answer_is_retried_not_deleted(scripted: type[ScriptedAdmin]) -> None:
    scripted.answers = [{"a": LEADER_ELECTION}, {"a": None}]
    with capture_logs() as logs:
        end = lenient_reader().latestOffset({"a": {"0": 5}}, ReadAllAvailable())
    assert offsets_in(end) == {"a": {"0": 7}}
    assert not [line for line in logs if line["event"] == "kafka_data_loss_skipped"]


def test_a_topic_missing_from_one_answer_is_deleted_only_when_the_next_confirms_it(
    scripted: type[ScriptedAdmin],
) -> None:
    scripted.answers = [{}, {"a": None}]
    assert offsets_in(lenient_reader().latestOffset({"a": {"0": 5}}, ReadAllAvailable())) == {"a": {"0": 7}}
    scripted.answers = [{}]
    with capture_logs() as logs:
        assert offsets_in(lenient_reader().latestOffset({"a": {"0": 5}}, ReadAllAvailable())) == {}
    assert [line["event"] for line in logs].count("kafka_data_loss_skipped") == 1


def test_available_now_keeps_a_topic_whose_answer_had_an_error(scripted: type[ScriptedAdmin]) -> None:
    reader = lenient_reader()
    scripted.answers = [{"a": LEADER_ELECTION}, {"a": None}]
    reader.prepareForTriggerAvailableNow()
    assert offsets_in(reader.latestOffset({"a": {"0": 5}}, ReadAllAvailable())) == {"a": {"0": 7}}


def test_a_planned_range_is_read_though_one_answer_had_an_error(scripted: type[ScriptedAdmin]) -> None:
    scripted.answers = [{"a": LEADER_ELECTION}, {"a": None}]
    with capture_logs() as logs:
        planned = lenient_reader().partitions({"a": {"0": 5}}, {"a": {"0": 7}})
    assert [str(partition.offset_range) for partition in planned] == [str(OffsetRange("a", 0, 5, 7))]
    assert not [line for line in logs if line["event"] == "kafka_data_loss_skipped"]


def test_an_error_that_is_not_transient_fails_planning(scripted: type[ScriptedAdmin]) -> None:
    scripted.answers = [{"a": KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)}]
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        lenient_reader().latestOffset({"a": {"0": 5}}, ReadAllAvailable())
