"""A newcomer's session with `sink-writer` (issue 26): a wrong flag, a missing topic, a coordinator that is down,
records that do not fit, a typo in the schema, a table that takes another type, a stop by the supervisor.

Each run is the installed command in a process of its own, as a person or a supervisor starts it. Every failure
ends with one line that names the cause and the fix (the output's last line), and an exit code that says what kind
of failure it was (docs/spark-writer.md, "Exit codes"); those found before Spark starts are answered in under 5 s.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from sink_coordinator_demo.ports import free_port
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import create_topic, delete_topics, produce_records
from tests.fixtures.sink_writer_process import WriterProcess, sink_writer, sink_writer_command
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.kafka]

TopicFactory = Callable[..., str]
ANSWER_SECONDS = 5.0  # the goal of issue 26: a failure found before Spark starts is answered within this
SPARK_RUN_SECONDS = 240.0
SCHEMA = "order_id BIGINT, amount DOUBLE"


def assert_not_registered(coordinator: CoordinatorProcess, sink: str) -> None:
    with coordinator.client() as client, pytest.raises(CoordinatorRpcError) as refused:
        client.sink_state(sink)
    assert refused.value.code is grpc.StatusCode.NOT_FOUND, refused.value


@pytest.fixture
def required(kafka_bootstrap: str, tmp_path: Path) -> list[str]:
    """The flags every run needs, with a coordinator address nothing listens on; the test adds its own after."""
    return [
        "--bootstrap-servers", kafka_bootstrap,
        "--sink", "cli-session",
        "--table", "shop.cli_session",
        "--checkpoint-location", str(tmp_path / "checkpoint"),
        "--schema", SCHEMA,
        "--coordinator", f"127.0.0.1:{free_port()}",
        "--available-now",
        "--master", "local[2]",
        "--spark-log-file", str(tmp_path / "spark.log"),
    ]  # fmt: skip


def test_a_wrong_flag_is_named_with_the_right_one(required: list[str]) -> None:
    finished = sink_writer(*required, "--topik", "orders")
    finished.assert_answer(2, "--topik", "--topic")
    assert finished.seconds < ANSWER_SECONDS


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--table", "Shop.Orders"], ("--table", "Shop.Orders", "lower-case")),
        (["--partition-by", "bucket(4, order_id)"], ("--partition-by", "bucket(4, order_id)", "day")),
        (["--partition-by", "frobnicate(order_id)"], ("--partition-by", "frobnicate(order_id)", "truncate(W, col)")),
        (["--wait-for-topic", "-1"], ("--wait-for-topic", "-1")),
        (["--wait-for-topic", "nan"], ("--wait-for-topic", "nan")),
        (["--wait-for-topic", "soon"], ("--wait-for-topic", "soon")),
    ],
)
def test_a_bad_value_is_refused_in_one_line_before_anything_starts(
    required: list[str], flags: list[str], named: tuple[str, ...]
) -> None:
    finished = sink_writer(*required, "--topic", "orders", *flags)
    finished.assert_answer(2, *named)
    assert finished.seconds < ANSWER_SECONDS


def test_a_coordinator_that_is_down_is_named_before_spark_starts(required: list[str]) -> None:
    address = required[required.index("--coordinator") + 1]
    finished = sink_writer(*required, "--topic", "orders", "--coordinator-retry-seconds", "1")
    finished.assert_answer(5, address, "sink-coordinator serve", "--coordinator")
    assert finished.seconds < ANSWER_SECONDS
    assert not any("Spark" in line for line in finished.lines), finished.lines


def test_the_wait_for_a_coordinator_shows_progress_and_stops_on_sigterm(required: list[str]) -> None:
    """With the default retry time (60 s) the job says at once what it waits for, and a supervisor's SIGTERM ends
    the wait with its own exit code and line."""
    address = required[required.index("--coordinator") + 1]
    running = WriterProcess(sink_writer_command(), [*required, "--topic", "orders"])
    progress = running.wait_for(address, ANSWER_SECONDS)
    assert "retrying" in progress and "sink-coordinator serve" in progress, progress
    running.signal_group(signal.SIGTERM)
    finished = running.finish(ANSWER_SECONDS)
    finished.assert_answer(143, "SIGTERM")


def test_a_missing_topic_is_named_before_the_sink_is_registered(
    required: list[str], coordinator: CoordinatorProcess
) -> None:
    flags = [*required, "--coordinator", coordinator.target, "--topic", "no-such-topic"]
    finished = sink_writer(*flags)
    finished.assert_answer(2, "no-such-topic", "--wait-for-topic")
    assert finished.seconds < ANSWER_SECONDS
    assert_not_registered(coordinator, "cli-session")


def test_the_job_can_wait_for_its_topic_saying_so(
    required: list[str], coordinator: CoordinatorProcess, kafka_bootstrap: str
) -> None:
    """--wait-for-topic: a progress line names the topic it waits for; once the topic is there the job goes on (to
    the schema registry, which is down here: its own failure shows the job went past the wait)."""
    topic = f"cli-late-{uuid.uuid4().hex[:12]}"
    registry = f"127.0.0.1:{free_port()}"
    flags = [flag for flag in required if flag not in ("--schema", SCHEMA)] + [
        "--coordinator", coordinator.target, "--topic", topic, "--wait-for-topic", "60",
        "--format", "avro", "--schema-registry-url", f"http://{registry}", "--schema-registry-option", "max.retries=0",
    ]  # fmt: skip
    running = WriterProcess(sink_writer_command(), flags)
    assert topic in running.wait_for("waiting for topics to be created", ANSWER_SECONDS)
    create_topic(kafka_bootstrap, partitions=1, name=topic)
    try:
        finished = running.finish(60)
    finally:
        delete_topics(kafka_bootstrap, [topic])
    finished.assert_answer(5, registry)


def test_a_wrong_writer_token_is_refused_before_spark_starts(
    required: list[str], coordinator_factory: Callable[..., CoordinatorProcess], kafka_topic: TopicFactory
) -> None:
    coordinator = coordinator_factory(SINK_COORDINATOR_WRITER_TOKEN="a-writer-token-of-32-characters-at-least")
    flags = [*required, "--coordinator", coordinator.target, "--topic", kafka_topic(), "--writer-token", "wrong"]
    finished = sink_writer(*flags)
    finished.assert_answer(4, "coordinator refused", "UNAUTHENTICATED")
    assert finished.seconds < ANSWER_SECONDS


def test_a_coordinator_that_comes_up_while_the_job_waits_is_used(
    required: list[str], database_url: str, tmp_path: Path
) -> None:
    """The wait gets through once the coordinator serves (a new connection each try): the job goes on to the next
    check, the topic, which is missing here."""
    late = CoordinatorProcess(database_url=database_url, data_dir=tmp_path / "late-coordinator")
    running = WriterProcess(
        sink_writer_command(), [*required, "--coordinator", late.target, "--topic", "no-such-topic"]
    )
    running.wait_for("retrying", ANSWER_SECONDS)
    migrate(normalize_url(database_url))
    late.start()
    try:
        finished = running.finish(120)
    finally:
        late.stop()
    finished.assert_answer(2, "no-such-topic")


@pytest.mark.spark
def test_records_that_do_not_fit_end_the_job_with_where_and_how_to_go_on(
    required: list[str],
    coordinator: CoordinatorProcess,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    tmp_path: Path,
) -> None:
    """The cause and the fix on the last line (the output a few lines in all); the task's four failures and their
    tracebacks in Spark's log."""
    topic = kafka_topic(partitions=1)
    good = json.dumps({"order_id": 0, "amount": 1.5}).encode()
    produce_records(kafka_bootstrap, topic, [(0, b"0", good), (0, b"1", b'{"order_id": 1, "amount": "abc"}')])

    # Spark's launcher splits its JVM options at spaces and reads quotes and backslashes: a name with all three.
    spark_log = tmp_path / "spark logs" / 'it\'s "the" log\\.txt'
    spark_log.parent.mkdir()
    flags = [*required, "--coordinator", coordinator.target, "--topic", topic, "--spark-log-file", str(spark_log)]

    finished = sink_writer(*flags, timeout=SPARK_RUN_SECONDS)

    finished.assert_answer(3, f"topic {topic} partition 0 offset 1", "amount (double)", "--on-bad-record null")
    assert len(finished.lines) < 20, finished.lines
    details = spark_log.read_text()
    assert details.count("ERROR Executor: Exception in task") == 4, details[-3000:]  # each attempt of the task
    assert "Traceback (most recent call last)" in details


@pytest.mark.spark
def test_a_typo_in_the_schema_is_named_without_a_traceback(
    required: list[str], coordinator: CoordinatorProcess, kafka_topic: TopicFactory
) -> None:
    flags = [*required, "--coordinator", coordinator.target, "--topic", kafka_topic(), "--schema", "id BIGINTT"]
    finished = sink_writer(*flags, timeout=SPARK_RUN_SECONDS)
    finished.assert_answer(2, "--schema", "BIGINTT")
    assert_not_registered(coordinator, "cli-session")


@pytest.mark.spark
def test_a_column_the_table_holds_with_another_type_is_the_coordinators_refusal(
    required: list[str],
    coordinator: CoordinatorProcess,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    catalog: Catalog,
) -> None:
    topic = kafka_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, [(0, b"0", json.dumps({"order_id": 0, "amount": 1.5}).encode())])
    first = sink_writer(*required, "--coordinator", coordinator.target, "--topic", topic, timeout=SPARK_RUN_SECONDS)
    assert first.exit_code == 0, "\n".join(first.lines[-40:])
    checkpoint = required.index("--checkpoint-location") + 1

    flags = [*required, "--coordinator", coordinator.target, "--topic", topic, "--sink", "cli-session-2"]
    flags[checkpoint] += "-2"
    second = sink_writer(*flags, "--schema", "order_id BIGINT, amount STRING", timeout=SPARK_RUN_SECONDS)

    second.assert_answer(4, "coordinator refused", "amount")
    assert_verified(coordinator.database_url, catalog, "cli-session", kafka_bootstrap, deep=False)


@pytest.mark.spark
def test_a_sigterm_to_the_process_group_stops_between_batches(
    required: list[str],
    coordinator: CoordinatorProcess,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    catalog: Catalog,
) -> None:
    """What `timeout`, systemd and supervisors send: the whole group (the JVM too) gets SIGTERM, as it gets
    SIGINT from Ctrl-C; the query stops between two batches and the job says so."""
    topic = kafka_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, [(0, b"0", json.dumps({"order_id": 0, "amount": 1.5}).encode())])
    running = WriterProcess(
        sink_writer_command(),
        [flag for flag in required if flag != "--available-now"]
        + ["--coordinator", coordinator.target, "--topic", topic],
    )
    running.wait_for("checkpoint reported", SPARK_RUN_SECONDS)
    running.signal_group(signal.SIGTERM)
    finished = running.finish(SPARK_RUN_SECONDS)
    finished.assert_answer(143, "SIGTERM")
    assert any("stop requested: stopping the query between two batches" in line for line in finished.lines)
    assert running.group_gone(within_seconds=30), "the JVM or a Python worker outlived the driver"
    assert_verified(coordinator.database_url, catalog, "cli-session", kafka_bootstrap, deep=False)
