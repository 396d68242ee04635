"""What `sink-writer` makes sure of before it starts Spark (seconds of JVM start, then a sink registered): that the
coordinator answers, and that the topics exist.

Both may wait, visibly: a line says at once what is missing, how long the job goes on waiting and what would fix
it, and again at each retry. A stop (SIGINT, SIGTERM) ends a wait at once; the caller looks at the StopRequest.
The topics are looked up with the Kafka source's own metadata rules (spark_writer.kafka.metadata): a transient
error is retried, and a topic counts as missing only when two answers lack it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

import grpc
import structlog
from confluent_kafka import KafkaException

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from spark_writer.job_failures import UNREACHABLE_CODES, ExitCode, JobFailure, coordinator_failure, one_line
from spark_writer.kafka.metadata import KafkaMetadata, is_transient
from spark_writer.kafka.options import KafkaSourceOptions
from spark_writer.stop_signals import StopRequest

log = structlog.get_logger(__name__)

# A coordinator that does not answer one call in this long counts as not answering (and is asked again).
COORDINATOR_CALL_SECONDS: Final = 5.0
FIRST_RETRY_SECONDS: Final = 0.5
MAX_RETRY_SECONDS: Final = 5.0
# How long one Kafka metadata answer may take at start: a broker that is not there costs this per attempt.
KAFKA_CALL_SECONDS: Final = 10.0
TOPIC_POLL_SECONDS: Final = 1.0
TOPIC_PROGRESS_SECONDS: Final = 10.0
COORDINATOR_HINT: Final = "start it (sink-coordinator serve) or pass --coordinator HOST:PORT"


def wait_for_coordinator(target: str, token: str | None, sink: str, retry_seconds: float, stop: StopRequest) -> None:
    """Return once the coordinator at `target` answers a question about `sink` (a sink it does not know yet is an
    answer: the registration creates it), or once a stop is requested.

    Raises JobFailure when it refuses the question (the writer token, or a scope that does not cover the sink) or
    does not answer for `retry_seconds`.
    """
    deadline = time.monotonic() + retry_seconds
    pause = FIRST_RETRY_SECONDS
    while True:
        call_seconds = max(min(COORDINATOR_CALL_SECONDS, deadline - time.monotonic()), 0.1)
        # A new channel each time: a channel's reconnection backoff would hide a coordinator that just came up.
        with CoordinatorClient(target, token=token, timeout_seconds=call_seconds, retry_seconds=0) as client:
            try:
                client.sink_state(sink)
                return
            except CoordinatorRpcError as error:
                if error.code is grpc.StatusCode.NOT_FOUND:
                    return
                if error.code not in UNREACHABLE_CODES:
                    raise coordinator_failure(error.code, error.message) from None
                unanswered = error
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise JobFailure(
                one_line(
                    f"the coordinator at {target} did not answer for {retry_seconds:g} s ({unanswered}): "
                    f"{COORDINATOR_HINT} (--coordinator-retry-seconds: how long to wait for it)"
                ),
                ExitCode.UNREACHABLE,
            )
        log.warning(
            "the coordinator does not answer; retrying",
            coordinator=target,
            error=one_line(str(unanswered)),
            retrying_for_seconds=round(remaining),
            hint=COORDINATOR_HINT,
        )
        if stop.wait(min(pause, remaining)):
            return
        pause = min(pause * 2, MAX_RETRY_SECONDS)


def wait_for_topics(options: KafkaSourceOptions, wait_seconds: float, stop: StopRequest) -> None:
    """Return once every topic of `options` exists (waiting up to `wait_seconds` for the missing ones to be
    created), or once a stop is requested.

    Raises JobFailure naming the topics still missing, or Kafka when it does not answer or refuses the look-up.
    """
    metadata = KafkaMetadata(options, timeout_seconds=KAFKA_CALL_SECONDS)
    bootstrap = options.kafka_config["bootstrap.servers"]
    deadline = time.monotonic() + wait_seconds
    said = float("-inf")
    while True:
        missing = _missing_topics(metadata, options.topics, bootstrap)
        if not missing:
            if said > float("-inf"):
                log.info("the topics exist", topics=list(options.topics))
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise JobFailure(_missing_cause(missing, bootstrap, wait_seconds), ExitCode.USAGE)
        if time.monotonic() - said >= TOPIC_PROGRESS_SECONDS:
            said = time.monotonic()
            log.warning(
                "waiting for topics to be created",
                topics=missing,
                kafka=bootstrap,
                waiting_for_seconds=round(remaining),
            )
        if stop.wait(min(TOPIC_POLL_SECONDS, remaining)):
            return


def _missing_topics(metadata: KafkaMetadata, topics: Sequence[str], bootstrap: str) -> list[str]:
    try:
        found = {key.topic for key in metadata.partitions(topics, known=topics)}
    except KafkaException as error:
        if is_transient(error):
            raise JobFailure(
                one_line(
                    f"Kafka at {bootstrap} did not answer ({error}): check --bootstrap-servers, and --kafka-option "
                    "for how to reach it (security.protocol, ...)"
                ),
                ExitCode.UNREACHABLE,
            ) from None
        raise JobFailure(
            one_line(f"Kafka at {bootstrap} refused to describe the topics {list(topics)}: {error}"), ExitCode.FAILED
        ) from None
    return [topic for topic in topics if topic not in found]


def _missing_cause(missing: Sequence[str], bootstrap: str, waited_seconds: float) -> str:
    topics = ", ".join(repr(topic) for topic in missing)
    if waited_seconds > 0:
        return (
            f"topic {topics} still does not exist on Kafka at {bootstrap} after {waited_seconds:g} s: create it, "
            "or check --topic and --bootstrap-servers"
        )
    return (
        f"topic {topics} does not exist on Kafka at {bootstrap}: create it, check --topic and --bootstrap-servers, "
        "or pass --wait-for-topic SECONDS to wait for it"
    )
