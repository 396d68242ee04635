"""The driver's Kafka look-ups (spark_writer.kafka_metadata): transient errors retried, others not.

A stand-in AdminClient fails as a broker restart or a leader election makes the real one fail.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable
from structlog.testing import capture_logs

from spark_writer import kafka_metadata
from spark_writer.kafka_options import parse_options
from spark_writer.kafka_source import KafkaStreamReader

BOOTSTRAP = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "a"}


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
    monkeypatch.setattr(kafka_metadata, "AdminClient", FlakyAdmin)
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
    monkeypatch.setattr(kafka_metadata, "AdminClient", FlakyAdmin)
    options = {**BOOTSTRAP, "fetchOffset.retryIntervalMs": "1", "fetchOffset.numRetries": "2"}
    FlakyAdmin.failures = [KafkaError(KafkaError._TRANSPORT)] * 3
    with pytest.raises(KafkaException, match="_TRANSPORT"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    FlakyAdmin.failures = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    with capture_logs() as logs, pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        KafkaStreamReader(parse_options(options)).latestOffset({"a": {"0": 0}}, ReadAllAvailable())
    assert logs == []
