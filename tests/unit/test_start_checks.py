"""What sink-writer makes sure of before Spark starts (spark_writer.start_checks): the topics exist, by the Kafka
source's rules (a transient error retried, a topic missing only when two answers lack it), or appear within the
wait asked for, saying so; a stop ends the wait.

A stand-in AdminClient answers from a script, as a broker would while topics come and go.
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException
from structlog.testing import capture_logs

from spark_writer import start_checks
from spark_writer.job_failures import ExitCode, JobFailure
from spark_writer.kafka import metadata as kafka_metadata
from spark_writer.kafka.options import KafkaSourceOptions, parse_options
from spark_writer.start_checks import wait_for_topics
from spark_writer.stop_signals import StopRequest, stop_on_signals

Answer = set[str] | KafkaError


class ScriptedAdmin:
    """An AdminClient whose metadata answers are, in turn, the topics of `answers` (the last one repeated) or a
    KafkaError; `on_answer` runs after each."""

    answers: ClassVar[list[Answer]] = []
    asked: ClassVar[int] = 0
    on_answer: ClassVar[Any] = None

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config

    def list_topics(self, timeout: float) -> Any:
        answer = ScriptedAdmin.answers[min(ScriptedAdmin.asked, len(ScriptedAdmin.answers) - 1)]
        ScriptedAdmin.asked += 1
        if ScriptedAdmin.on_answer is not None:
            ScriptedAdmin.on_answer()
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None}) for topic in answer})


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedAdmin]:
    monkeypatch.setattr(kafka_metadata, "AdminClient", ScriptedAdmin)
    monkeypatch.setattr(start_checks, "TOPIC_POLL_SECONDS", 0.01)
    ScriptedAdmin.answers, ScriptedAdmin.asked, ScriptedAdmin.on_answer = [], 0, None
    return ScriptedAdmin


def options(*topics: str, retries: int = 6) -> KafkaSourceOptions:
    return parse_options(
        {
            "kafka.bootstrap.servers": "kafka:9092",
            "subscribe": ",".join(topics),
            "fetchOffset.retryIntervalMs": "1",
            "fetchOffset.numRetries": str(retries),
        }
    )


def test_topics_that_exist_pass_at_the_first_answer(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [{"orders", "refunds", "other"}]
    with capture_logs() as logs:
        wait_for_topics(options("orders", "refunds"), 0, StopRequest())
    assert admin.asked == 1
    assert not logs


def test_a_topic_missing_from_one_answer_is_not_missing(admin: type[ScriptedAdmin]) -> None:
    """One broker's incomplete view: the second answer, a retry interval later, has it."""
    admin.answers = [{"refunds"}, {"orders", "refunds"}]
    wait_for_topics(options("orders", "refunds"), 0, StopRequest())
    assert admin.asked == 2


def test_a_topic_two_answers_lack_is_named_with_the_fix(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [{"refunds"}]
    with pytest.raises(JobFailure) as failed:
        wait_for_topics(options("orders", "refunds", "returns"), 0, StopRequest())
    assert failed.value.exit_code is ExitCode.USAGE
    assert failed.value.cause.startswith("topic 'orders', 'returns' does not exist on Kafka at kafka:9092")
    assert "--wait-for-topic SECONDS" in failed.value.cause
    assert admin.asked == 2


def test_the_wait_for_a_topic_says_what_it_waits_for_and_ends_when_it_is_there(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [set(), set(), set(), set(), {"orders"}]
    with capture_logs() as logs:
        wait_for_topics(options("orders"), 60, StopRequest())
    waiting = [log for log in logs if log["event"] == "waiting for topics to be created"]
    assert len(waiting) == 1, logs  # once in TOPIC_PROGRESS_SECONDS
    assert waiting[0]["topics"] == ["orders"]
    assert waiting[0]["kafka"] == "kafka:9092"
    assert logs[-1]["event"] == "the topics exist"


def test_a_stop_ends_the_wait_at_once(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [set()]
    admin.on_answer = lambda: os.kill(os.getpid(), signal.SIGTERM) if admin.asked == 3 else None
    with stop_on_signals() as stop:
        wait_for_topics(options("orders"), 3600, stop)
    assert stop.signal is signal.SIGTERM
    assert admin.asked == 4  # the answer being read when the signal came, and the second one it needed


def test_a_broker_that_does_not_answer_is_named_once_the_retries_are_spent(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [KafkaError(KafkaError._TRANSPORT)]
    with pytest.raises(JobFailure) as failed:
        wait_for_topics(options("orders", retries=2), 0, StopRequest())
    assert failed.value.exit_code is ExitCode.UNREACHABLE
    assert "Kafka at kafka:9092 did not answer" in failed.value.cause
    assert "check --bootstrap-servers" in failed.value.cause
    assert admin.asked == 3


def test_a_refused_look_up_is_not_taken_for_a_missing_topic(admin: type[ScriptedAdmin]) -> None:
    admin.answers = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    with pytest.raises(JobFailure) as failed:
        wait_for_topics(options("orders"), 0, StopRequest())
    assert failed.value.exit_code is ExitCode.FAILED
    assert "refused to describe the topics ['orders']" in failed.value.cause
    assert admin.asked == 1
