"""Fresh reads (spark_writer.fresh) while a stream runs: a real broker, a real coordinator process, the Spark writer.

Rounds of records are produced (each round acknowledged before the next step), and after each, at a random moment
of the writer's 1-second batches, the sink is read fresh, with pyarrow or with Spark. Every read must hold exactly
the records produced so far, each once (append: by their Kafka position; upsert: the model, the last value of each
key, deleted keys absent): staleness 0, and nothing read twice where the table and the tail meet. The coordinator
is killed -9 once and a read made while it is down finishes once its successor serves; a partition added mid-stream
is read from its start before the writer ever commits it. Each test checks that its reads took rows from both the
table and the tail, so that the seam between them was crossed.
"""

from __future__ import annotations

import json
import random
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table.snapshots import ancestors_of
from pyspark.sql import SparkSession

from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
from spark_writer import fresh
from spark_writer.fresh.table_head import SNAPSHOT_ID_METADATA
from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.kafka.offsets import offsets_from_json
from spark_writer.mutations.modes import MutationMode, Mutations
from spark_writer.sink.sink_query import IcebergSinkQuery
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import ProducedRecord, add_partitions
from tests.fixtures.pipeline import ORDER_SCHEMA_DDL, QUERY_TIMEOUT_SECONDS, produce_orders
from tests.fixtures.upsert_streams import COLUMNS, ROW_DDL, Change, Row, changes, model, produce_upserts

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
Factory = Callable[..., CoordinatorProcess]

ROUNDS = 8
KILL_ROUND = 4
SPARK_ROUNDS = frozenset({2, 6})
PARTITIONS = 3
PER_BATCH = 150  # the writer lags behind the rounds: reads meet a pending tail
TRIGGER = "1 second"
READ_RETRY_SECONDS = 120.0


@dataclass
class FreshRun:
    """The sink's stream and coordinator, and what its reads found."""

    spark: SparkSession
    coordinator: CoordinatorProcess
    catalog: Catalog
    table: str
    flags: dict[str, Any]
    random: random.Random
    # Where the coordinator started after the kill goes, to be stopped at the end.
    successors: list[IcebergSinkQuery | CoordinatorProcess]
    table_rows_read: list[int] = field(default_factory=list)
    tail_records_read: list[int] = field(default_factory=list)

    def read(self, round_number: int) -> pa.Table:
        """A fresh read at a random moment of the writer's batch (Spark's reader on SPARK_ROUNDS); at KILL_ROUND
        one made while the coordinator is down, answered by its successor."""
        self.random_pause()
        if round_number == KILL_ROUND:
            return self._read_through_a_kill()
        rows = self._read(round_number in SPARK_ROUNDS)
        self._note_seam(rows)
        return rows

    def random_pause(self) -> None:
        # Where the read falls in the writer's 1-second batches (before, during or after a commit) is the point.
        threading.Event().wait(self.random.uniform(0, 1.2))

    def _read(self, with_spark: bool) -> pa.Table:
        call = {
            "sink": self.flags["sink"],
            "coordinator": self.coordinator.target,
            "catalog": self.catalog,
            "coordinator_retry_seconds": READ_RETRY_SECONDS,
        }
        flags = {name: value for name, value in self.flags.items() if name != "sink"}
        rows = fresh.read_arrow(**call, **flags)
        if with_spark:
            frame = fresh.read(self.spark, **call, **flags)
            assert frame.columns == rows.column_names
            assert sorted_rows(frame.toArrow(), rows.column_names) == sorted_rows(rows, rows.column_names)
        return rows

    def _read_through_a_kill(self) -> pa.Table:
        killed = self.coordinator
        killed.kill()
        assert killed.wait_killed() == -signal.SIGKILL
        answered: list[pa.Table | BaseException] = []

        def read_now() -> None:
            try:
                answered.append(self._read(with_spark=False))
            except BaseException as error:
                answered.append(error)

        reader = threading.Thread(target=read_now)
        reader.start()
        successor = CoordinatorProcess(
            database_url=killed.database_url,
            data_dir=killed.data_dir,
            grpc_port=killed.grpc_port,
            http_port=killed.http_port,
        )
        self.successors.append(successor)
        successor.start()
        self.coordinator = successor
        reader.join(READ_RETRY_SECONDS)
        assert len(answered) == 1, "the read made while the coordinator was down did not finish"
        result = answered[0]
        if isinstance(result, BaseException):
            raise result
        self._note_seam(result)
        return result

    def _note_seam(self, rows: pa.Table) -> None:
        """How many rows the read took from the table (at the snapshot it read), and how many records from the tail
        (its end offsets past those of the newest snapshot of the sink's at or below that one)."""
        metadata = rows.schema.metadata or {}
        read_to = sum(offsets_from_json(json.loads(metadata[SNAPSHOT_END_OFFSETS.encode()])).values())
        snapshot = metadata.get(SNAPSHOT_ID_METADATA.encode())
        in_table, table_to = 0, 0
        if snapshot is not None:
            table = self.catalog.load_table(self.table)
            in_table = table.scan(snapshot_id=int(snapshot)).to_arrow().num_rows
            for each in ancestors_of(table.snapshot_by_id(int(snapshot)), table.metadata):
                if each.summary is not None and SNAPSHOT_END_OFFSETS in each.summary.additional_properties:
                    offsets = json.loads(each.summary.additional_properties[SNAPSHOT_END_OFFSETS])
                    table_to = sum(offsets_from_json(offsets).values())
                    break
        self.table_rows_read.append(in_table)
        self.tail_records_read.append(read_to - table_to)

    def assert_the_seam_was_crossed(self) -> None:
        """Some read found both rows in the table and records in the tail."""
        both = [(rows, tail) for rows, tail in zip(self.table_rows_read, self.tail_records_read, strict=True)]
        assert any(rows and tail for rows, tail in both), f"no read met both (table rows, tail records): {both}"


def sorted_rows(rows: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(row[name] for name in columns) for row in rows.to_pylist()), key=repr)


@pytest.fixture
def stopped_at_end() -> Iterator[list[IcebergSinkQuery | CoordinatorProcess]]:
    """The query, then the coordinators it started after a kill: stopped in that order."""
    running: list[IcebergSinkQuery | CoordinatorProcess] = []
    yield running
    for each in running:
        each.stop()


def test_fresh_reads_of_an_append_stream_hold_every_record_produced_once(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
    stopped_at_end: list[IcebergSinkQuery | CoordinatorProcess],
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    query = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ORDER_SCHEMA_DDL, evolve_schema=False, kafka_metadata=True),
        SinkSettings(
            "orders", "shop.orders", coordinator.target, str(tmp_path / "checkpoint"), processing_time=TRIGGER
        ),
    )
    stopped_at_end.append(query)
    flags = {"sink": "orders", "bootstrap_servers": kafka_bootstrap, "topic": topic, "kafka_metadata": True}
    run = FreshRun(spark, coordinator, catalog, "shop.orders", flags, random.Random(31), stopped_at_end)
    produced: list[ProducedRecord] = []
    next_id, partitions = 0, PARTITIONS
    for round_number in range(ROUNDS):
        if round_number == 3:
            partitions += 1  # after snapshots that know 3 partitions: the tail reads the 4th from its start
            add_partitions(kafka_bootstrap, topic, partitions)
        count = run.random.randrange(50, 400)
        produced += produce_orders(kafka_bootstrap, topic, range(next_id, next_id + count), partitions)
        next_id += count
        rows = run.read(round_number)

        positions = Counter(zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))
        assert positions == Counter((record.partition, record.offset) for record in produced), (
            f"round {round_number}: the read is not every record produced, once"
        )
        assert sorted(rows["order_id"].to_pylist()) == list(range(next_id))
        if round_number == 0:  # the later reads (the kill's among them) meet a table that holds epochs
            coordinator.wait_for_log("epochs committed", timeout=QUERY_TIMEOUT_SECONDS)
    run.assert_the_seam_was_crossed()
    assert query.query.isActive, "the writer ran through every read and the coordinator's kill"


def test_fresh_reads_of_an_upsert_stream_are_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
    stopped_at_end: list[IcebergSinkQuery | CoordinatorProcess],
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    query = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ROW_DDL, evolve_schema=False, mutations=Mutations(MutationMode.UPSERT, ("id",))),
        SinkSettings(
            "customers", "crm.customers", coordinator.target, str(tmp_path / "checkpoint"), processing_time=TRIGGER
        ),
    )
    stopped_at_end.append(query)
    flags = {"sink": "customers", "bootstrap_servers": kafka_bootstrap, "topic": topic, "mode": "upsert", "key": "id"}
    run = FreshRun(spark, coordinator, catalog, "crm.customers", flags, random.Random(29), stopped_at_end)
    stream = changes(ROUNDS * 400, 120, seed=29)
    produced: list[Change] = []
    for round_number in range(ROUNDS):
        count = run.random.randrange(50, 400)
        produce_upserts(kafka_bootstrap, topic, stream[len(produced) : len(produced) + count], PARTITIONS)
        produced = stream[: len(produced) + count]
        rows = run.read(round_number)

        read: list[Row] = sorted((int(row["id"]), str(row["name"]), int(row["seq"])) for row in rows.to_pylist())
        assert rows.column_names[: len(COLUMNS)] == list(COLUMNS)
        assert read == model(produced), f"round {round_number}: the read is not the model of the records produced"
        if round_number == 0:  # the later reads (the kill's among them) meet a table that holds epochs
            coordinator.wait_for_log("keyed epochs committed as a row delta", timeout=QUERY_TIMEOUT_SECONDS)
    run.assert_the_seam_was_crossed()
    assert query.query.isActive, "the writer ran through every read and the coordinator's kill"
