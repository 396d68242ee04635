"""Invariant 6 for the Spark side: kill -9 of the driver at each step of a batch, restart, every record once;
and SIGTERM, which stops the driver between two batches wherever it reaches it.

The driver runs `sink-writer` in a process of its own (tests/e2e/driver_process.py),
killed with its JVM (or sent SIGTERM) at a named point; the restarted driver (the test
session's Spark, a JVM of its own) uses the same checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from tests.fixtures.coordinator import CoordinatorProcess, table_files
from tests.fixtures.kafka_broker import ProducedRecord
from tests.fixtures.pipeline import (
    ORDER_SCHEMA_DDL,
    QUERY_TIMEOUT_SECONDS,
    kafka_positions,
    produce_orders,
    produced_positions,
)
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SINK = "orders-crash"
TABLE = "shop.orders_crash"
RECORDS = 800
PARTITIONS = 4
PER_BATCH = 200  # 4 batches
LAST_BATCH = RECORDS // PER_BATCH - 1
KILLED_EPOCH = 1
DRIVER_TIMEOUT_SECONDS = 180
# What a KeyboardInterrupt raised inside a py4j call leaves in the driver's output (py4j logs it, then the calls
# that follow fail). A batch that Spark starts while the query stops fails on purpose (SinkStoppingError) and is
# logged with its traceback: that is not one of these.
BROKEN_GATEWAY = (
    "KeyboardInterrupt",
    "Py4JNetworkError",
    "Error while sending or receiving",
    "Answer from Java side is empty",
)

TopicFactory = Callable[..., str]


@dataclass(frozen=True)
class Pipeline:
    """One job's settings, runnable as a killable driver process or, for the restart, on the session's Spark."""

    kafka: KafkaSettings
    parse: ParseSettings
    sink: SinkSettings
    work: Path

    @property
    def checkpoint(self) -> Path:
        return Path(self.sink.checkpoint_location)

    def flags(self) -> list[str]:
        assert self.parse.schema_ddl is not None and self.kafka.max_offsets_per_trigger is not None
        return [
            "--bootstrap-servers", self.kafka.bootstrap_servers,
            *[flag for topic in self.kafka.topics for flag in ("--topic", topic)],
            "--schema", self.parse.schema_ddl,
            "--no-evolve-schema",
            "--kafka-metadata",
            "--max-offsets-per-trigger", str(self.kafka.max_offsets_per_trigger),
            "--sink", self.sink.sink,
            "--table", self.sink.table,
            "--coordinator", self.sink.coordinator,
            "--checkpoint-location", self.sink.checkpoint_location,
            "--available-now",
            "--master", "local[2]",
            "--spark-log-file", str(self.work / "spark.log"),
        ]  # fmt: skip

    def run_driver(self, point: str, epoch: int) -> tuple[int, str]:
        """Run the driver in its own process group until it ends (or the point stops it): its exit status, output."""
        log_path = self.work / "driver.log"
        with log_path.open("w") as log_file:
            completed = subprocess.run(
                [sys.executable, "-m", "tests.e2e.driver_process", point, str(epoch), "--", *self.flags()],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a kill point takes the driver's whole process group, and only it
                timeout=DRIVER_TIMEOUT_SECONDS,
                check=False,
            )
        return completed.returncode, log_path.read_text()

    def crash(self, kill_point: str, epoch: int) -> None:
        """Run the driver until the kill point kills it."""
        status, output = self.run_driver(kill_point, epoch)
        assert status == -signal.SIGKILL, output[-5000:]

    def restart(self, spark: SparkSession) -> None:
        """A new driver on the same checkpoint, run until the topic is drained."""
        assert start_job(spark, self.kafka, self.parse, self.sink).await_termination(QUERY_TIMEOUT_SECONDS)

    def committed_batches(self) -> set[int]:
        return {int(path.name) for path in (self.checkpoint / "commits").iterdir() if path.name.isdigit()}


@pytest.fixture
def produced(kafka_bootstrap: str, kafka_topic: TopicFactory) -> tuple[str, list[ProducedRecord]]:
    topic = kafka_topic(partitions=PARTITIONS)
    return topic, produce_orders(kafka_bootstrap, topic, range(RECORDS), partitions=PARTITIONS)


@pytest.fixture
def pipeline(
    kafka_bootstrap: str, produced: tuple[str, list[ProducedRecord]], coordinator: CoordinatorProcess, tmp_path: Path
) -> Pipeline:
    return Pipeline(
        KafkaSettings(kafka_bootstrap, (produced[0],), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ORDER_SCHEMA_DDL, evolve_schema=False, kafka_metadata=True),
        SinkSettings(
            sink=SINK,
            table=TABLE,
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            available_now=True,
        ),
        tmp_path,
    )


def data_files_of_batch(catalog: Catalog, batch: int) -> set[Path]:
    location = catalog.load_table(TABLE).location().removeprefix("file://")
    return set((Path(location) / "data").glob(f"{batch:08d}-*.parquet"))


def test_driver_killed_after_precommit_before_spark_checkpoint(
    spark: SparkSession,
    pipeline: Pipeline,
    produced: tuple[str, list[ProducedRecord]],
    coordinator: CoordinatorProcess,
    catalog: Catalog,
) -> None:
    """The epoch is PENDING without a Spark checkpoint: the restart aborts it, Spark re-runs the batch once."""
    pipeline.crash("after-precommit", KILLED_EPOCH)
    assert max(pipeline.committed_batches()) == KILLED_EPOCH - 1
    with coordinator.client() as client:
        state = client.sink_state(SINK)
    assert (KILLED_EPOCH, "PENDING") in {(e.epoch, e.status) for e in state.epochs}
    first_attempt = data_files_of_batch(catalog, KILLED_EPOCH)
    assert first_attempt, "the killed batch wrote no files"

    pipeline.restart(spark)
    registered = coordinator.wait_for_log("writer registered", sink=SINK, writer_term=2)
    assert registered["aborted_epochs"] == [KILLED_EPOCH]
    # The re-run's new attempt releases the first attempt's files (kept for a re-run until then): deleted.
    coordinator.wait_for_log("given-up files deleted", sink=SINK)
    assert kafka_positions(catalog, TABLE) == produced_positions(produced[1])
    in_table = {Path(uri.removeprefix("file://")) for uri in table_files(catalog.load_table(TABLE))}
    assert not first_attempt & in_table, "files of the aborted attempt reached the table"
    assert not any(path.exists() for path in first_attempt), "files of the aborted attempt were left behind"
    assert_verified(coordinator.database_url, catalog, SINK, pipeline.kafka.bootstrap_servers)


def test_driver_killed_after_spark_checkpoint_before_report(
    spark: SparkSession,
    pipeline: Pipeline,
    produced: tuple[str, list[ProducedRecord]],
    coordinator: CoordinatorProcess,
    catalog: Catalog,
) -> None:
    """Spark checkpointed the batch, the coordinator never heard: the restart's RegisterWriter commits it."""
    pipeline.crash("before-checkpoint-report", KILLED_EPOCH)
    checkpointed = max(pipeline.committed_batches())
    assert checkpointed >= KILLED_EPOCH
    with coordinator.client() as client:
        state = client.sink_state(SINK)
    assert state.checkpointed_epoch < KILLED_EPOCH
    assert (KILLED_EPOCH, "PENDING") in {(e.epoch, e.status) for e in state.epochs}

    pipeline.restart(spark)
    registered = coordinator.wait_for_log("writer registered", sink=SINK, writer_term=2)
    assert KILLED_EPOCH in registered["recommitting_epochs"]
    assert registered["checkpointed_epoch"] == checkpointed
    assert kafka_positions(catalog, TABLE) == produced_positions(produced[1])
    assert_verified(coordinator.database_url, catalog, SINK, pipeline.kafka.bootstrap_servers)


@pytest.mark.parametrize("point", ["sigterm-while-starting", "sigterm-after-precommit"])
def test_sigterm_stops_the_driver_between_batches(
    spark: SparkSession,
    pipeline: Pipeline,
    produced: tuple[str, list[ProducedRecord]],
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    point: str,
) -> None:
    """SIGTERM while the job starts (inside a py4j call) or runs: the query stops between two batches, what it
    checkpointed is committed, the exit status says SIGTERM stopped it; a rerun writes the rest, every record once.

    The job looks at a stop request between two waits of STOP_CHECK_SECONDS on the query: one that drains its last
    batches within that wait ends as done (status 0, every batch checkpointed), which is the truth of it (a fresh
    clone's CI met it: the two batches after SIGTERM took under a second)."""
    status, output = pipeline.run_driver(point, KILLED_EPOCH)
    checkpointed = max(pipeline.committed_batches(), default=-1)
    drained = point == "sigterm-after-precommit" and status == 0 and checkpointed == LAST_BATCH
    assert status == 128 + signal.SIGTERM or drained, output[-5000:]
    for broken in BROKEN_GATEWAY:
        assert broken not in output, output[-5000:]
    if point == "sigterm-after-precommit":
        assert checkpointed >= KILLED_EPOCH, "the batch running when SIGTERM came did not finish"
    with coordinator.client() as client:
        state = client.sink_state(SINK)
    assert state.checkpointed_epoch == checkpointed
    assert state.committed_epoch == checkpointed

    pipeline.restart(spark)
    assert kafka_positions(catalog, TABLE) == produced_positions(produced[1])
    assert_verified(coordinator.database_url, catalog, SINK, pipeline.kafka.bootstrap_servers)
