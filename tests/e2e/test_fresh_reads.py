"""Fresh reads (spark_writer.fresh) while a stream runs: a real broker, a real coordinator process, the Spark writer.

A producer sends records one by one from a thread, noting where each landed and when the broker acknowledged it,
while the Spark writer commits them at a 1-second trigger. At random moments the sink is read fresh (pyarrow). Each
read must hold exactly the records below the end offsets it reports, each once (append: by their Kafka position and
order id; upsert: the model, the last value of each key, deleted keys absent), and every record acknowledged before
the read began (staleness 0). On two rounds the producer pauses, and Spark's DataFrame must equal the pyarrow read.
The coordinator is killed -9 once and a read made while it is down finishes once its successor serves; a partition
added mid-stream is read from its start before the writer ever commits it. Each test checks that its reads took
rows from both the table and the tail, so that the seam between them was crossed, and ends with the producer paused:
once the writer committed what the last read saw, the table holds exactly that read's rows.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pyiceberg.catalog import Catalog
from pyiceberg.table.snapshots import ancestors_of
from pyspark.sql import SparkSession

from coordinator_service.contract.markers import snapshot_properties
from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
from spark_writer import fresh
from spark_writer.fresh.table_head import SNAPSHOT_ID_METADATA
from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.kafka.offsets import offsets_from_json
from spark_writer.mutations.modes import MutationMode, Mutations
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import add_partitions, client_config
from tests.fixtures.pipeline import ORDER_SCHEMA_DDL, QUERY_TIMEOUT_SECONDS, order
from tests.fixtures.upsert_streams import COLUMNS, ROW_DDL, Row, as_record, changes, key_record, model, partition_of
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROUNDS = 8
KILL_ROUND = 4
SPARK_ROUNDS = frozenset({2, 6})
PARTITIONS = 3
RATE = 250  # records a second
PER_BATCH = 150  # the writer lags behind the producer: reads meet a pending tail
TRIGGER = "1 second"
READ_RETRY_SECONDS = 120.0
ACK_TIMEOUT_SECONDS = 60.0

# The n-th record: its partition, message key and value.
RecordOf = Callable[[int], tuple[int, bytes, bytes | None]]


@dataclass
class SteadyProducer:
    """Produces record after record (RecordOf, up to `limit`) at RATE a second from a thread, noting where each landed
    and when the broker acknowledged it; `pause` waits until every record sent is acknowledged."""

    bootstrap: str
    topic: str
    record_of: RecordOf
    limit: int
    # (partition, offset) -> (the record's number, when it was acknowledged)
    delivered: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _go: threading.Event = field(default_factory=threading.Event)
    _idle: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyProducer:
        self._go.set()
        self._thread = threading.Thread(target=self._produce, daemon=True)
        self._thread.start()
        return self

    def _produce(self) -> None:
        try:
            self._produce_until_stopped()
        except BaseException as error:
            with self._changed:
                self.errors.append(f"the producer failed: {error!r}")
                self._changed.notify_all()
            self._idle.set()
            raise

    def _produce_until_stopped(self) -> None:
        producer = Producer(client_config(self.bootstrap, **{"linger.ms": 5}))
        number = 0
        while not self._stop.is_set():
            if not self._go.is_set() or number == self.limit:
                producer.flush(ACK_TIMEOUT_SECONDS)
                self._idle.set()
                self._go.wait(0.1)
                continue
            partition, key, value = self.record_of(number)
            try:
                producer.produce(
                    self.topic, key=key, value=value, partition=partition, on_delivery=partial(self._delivered, number)
                )
            except KafkaException as error:
                if error.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                    raise
                producer.list_topics(self.topic, timeout=ACK_TIMEOUT_SECONDS)  # a partition added: learn it, again
                continue
            number += 1
            producer.poll(0)
            self._stop.wait(1 / RATE)
        producer.flush(ACK_TIMEOUT_SECONDS)

    def _delivered(self, number: int, error: KafkaError | None, message: Message) -> None:
        with self._changed:
            if error is not None:
                self.errors.append(str(error))
            else:
                self.delivered[(int(message.partition() or 0), int(message.offset() or 0))] = (number, time.monotonic())
            self._changed.notify_all()

    def pause(self) -> None:
        self._idle.clear()
        self._go.clear()
        assert self._idle.wait(ACK_TIMEOUT_SECONDS), "the producer did not stop"

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(ACK_TIMEOUT_SECONDS)

    def acknowledged_before(self, moment: float) -> set[tuple[int, int]]:
        with self._changed:
            return {place for place, (_, acknowledged) in self.delivered.items() if acknowledged < moment}

    def below(self, ends: dict[int, int]) -> dict[tuple[int, int], int]:
        """The records below `ends` (partition -> offset), once every one of them is acknowledged: place -> number."""

        def all_acknowledged() -> bool:
            return all(
                (partition, offset) in self.delivered for partition, end in ends.items() for offset in range(end)
            )

        with self._changed:
            assert self._changed.wait_for(lambda: all_acknowledged() or bool(self.errors), ACK_TIMEOUT_SECONDS), ends
            assert not self.errors, self.errors
            return {place: number for place, (number, _) in self.delivered.items() if place[1] < ends.get(place[0], 0)}


@dataclass
class FreshReads:
    """The sink's reads at random moments, through a coordinator kill, and what they found."""

    spark: SparkSession
    coordinator: CoordinatorProcess
    catalog: Catalog
    sink: str
    table: str
    flags: dict[str, Any]
    producer: SteadyProducer
    random: random.Random
    # Where the coordinator started after the kill goes, to be stopped at the end.
    successors: list[Any]
    table_rows_read: list[int] = field(default_factory=list)
    tail_records_read: list[int] = field(default_factory=list)

    def read(self, round_number: int) -> tuple[pa.Table, set[tuple[int, int]], dict[tuple[int, int], int]]:
        """A fresh read at a random moment of the writer's batches: its rows, the records acknowledged before it began
        and the records below the end offsets it reports (place -> number). Spark's reader too on SPARK_ROUNDS (the
        producer paused, so that both see the same records); on KILL_ROUND a read while the coordinator is down."""
        # Where the read falls in the writer's 1-second batches (before, during or after a commit) is the point.
        threading.Event().wait(self.random.uniform(0, 1.2))
        if round_number in SPARK_ROUNDS:
            self.producer.pause()
        began = time.monotonic()
        rows = self._read_through_a_kill() if round_number == KILL_ROUND else self._read()
        acknowledged = self.producer.acknowledged_before(began)
        if round_number in SPARK_ROUNDS:
            frame = fresh.read(self.spark, **self.arguments())
            assert frame.columns == rows.column_names
            assert sorted_rows(frame.toArrow(), rows.column_names) == sorted_rows(rows, rows.column_names)
            self.producer.resume()
        self._note_seam(rows)
        metadata = rows.schema.metadata or {}
        ends = offsets_from_json(json.loads(metadata[SNAPSHOT_END_OFFSETS.encode()]))
        below = self.producer.below({key.partition: offset for key, offset in ends.items()})
        return rows, acknowledged, below

    def arguments(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "coordinator": self.coordinator.target,
            "catalog": self.catalog,
            "coordinator_retry_seconds": READ_RETRY_SECONDS,
            **self.flags,
        }

    def _read(self) -> pa.Table:
        return fresh.read_arrow(**self.arguments())

    def _read_through_a_kill(self) -> pa.Table:
        killed = self.coordinator
        killed.kill()
        assert killed.wait_killed() == -signal.SIGKILL
        answered: list[pa.Table | BaseException] = []

        def read_now() -> None:
            try:
                answered.append(self._read())
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
                properties = snapshot_properties(each)
                if SNAPSHOT_END_OFFSETS in properties:
                    table_to = sum(offsets_from_json(json.loads(properties[SNAPSHOT_END_OFFSETS])).values())
                    break
        self.table_rows_read.append(in_table)
        self.tail_records_read.append(read_to - table_to)

    def assert_the_seam_was_crossed(self) -> None:
        """Some read found both rows in the table and records in the tail."""
        both = list(zip(self.table_rows_read, self.tail_records_read, strict=True))
        assert any(rows and tail for rows, tail in both), f"no read met both (table rows, tail records): {both}"


def ends_of(rows: pa.Table) -> dict[tuple[str, int], int]:
    """Where a fresh read ends, per topic-partition (its schema's metadata)."""
    metadata = rows.schema.metadata or {}
    return dict(offsets_from_json(json.loads(metadata[SNAPSHOT_END_OFFSETS.encode()])))


def table_once_it_holds(catalog: Catalog, table: str, ends: dict[tuple[str, int], int]) -> pa.Table:
    """The table's rows once its newest snapshot of the sink reaches `ends` (the writer commits what the read saw)."""
    deadline = time.monotonic() + QUERY_TIMEOUT_SECONDS
    while True:
        loaded = catalog.load_table(table)
        current = loaded.current_snapshot()
        reached: dict[tuple[str, int], int] = {}
        for each in [] if current is None else ancestors_of(current, loaded.metadata):
            properties = snapshot_properties(each)
            if SNAPSHOT_END_OFFSETS in properties:
                reached = dict(offsets_from_json(json.loads(properties[SNAPSHOT_END_OFFSETS])))
                break
        if current is not None and all(reached.get(key, 0) >= end for key, end in ends.items()):
            assert reached == ends, "the table went past the read's ends though the producer was paused"
            return loaded.scan(snapshot_id=current.snapshot_id).to_arrow()
        assert time.monotonic() < deadline, f"the table did not reach {ends}: {reached}"
        # The writer's commits come from another process: nothing to await but their result.
        threading.Event().wait(0.2)


def sorted_rows(rows: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(row[name] for name in columns) for row in rows.to_pylist()), key=repr)


@pytest.fixture
def stopped_at_end() -> Iterator[list[Any]]:
    """The producer, the query, then the coordinators started after a kill: stopped in that order."""
    running: list[Any] = []
    yield running
    for each in running:
        each.stop()


def test_fresh_reads_of_an_append_stream_hold_every_record_produced_once(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
    stopped_at_end: list[Any],
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    partitions = [PARTITIONS]

    def record_of(number: int) -> tuple[int, bytes, bytes | None]:
        return number % partitions[0], str(number).encode(), json.dumps(order(number)).encode()

    producer = SteadyProducer(kafka_bootstrap, topic, record_of, limit=1_000_000).start()
    stopped_at_end.append(producer)
    query = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ORDER_SCHEMA_DDL, evolve_schema=False, kafka_metadata=True),
        SinkSettings("orders", "shop.orders", coordinator.target, str(tmp_path / "cp"), processing_time=TRIGGER),
    )
    stopped_at_end.append(query)
    # The reads (the kill's among them) meet a table that holds epochs.
    coordinator.wait_for_log("epochs committed", timeout=QUERY_TIMEOUT_SECONDS)
    flags = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "kafka_metadata": True}
    reads = FreshReads(
        spark, coordinator, catalog, "orders", "shop.orders", flags, producer, random.Random(31), stopped_at_end
    )
    for round_number in range(ROUNDS):
        if round_number == 3:
            # After snapshots that know 3 partitions: the tail reads the 4th from its start.
            add_partitions(kafka_bootstrap, topic, PARTITIONS + 1)
            partitions[0] = PARTITIONS + 1
        rows, acknowledged, below = reads.read(round_number)

        positions = Counter(zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))
        assert positions == Counter(below.keys()), f"round {round_number}: not every record below its end offsets, once"
        assert acknowledged <= set(positions), f"round {round_number}: records acknowledged before it are missing"
        assert sorted(rows["order_id"].to_pylist()) == sorted(below.values())
    reads.assert_the_seam_was_crossed()
    # What the table holds once the writer committed what the last read saw is that read.
    producer.pause()
    last = fresh.read_arrow(**reads.arguments())
    held = table_once_it_holds(catalog, "shop.orders", ends_of(last))
    assert sorted_rows(held, last.column_names) == sorted_rows(last, last.column_names)
    assert_verified(coordinator.database_url, catalog, "orders", kafka_bootstrap)  # beside the running writer
    assert query.query.isActive, "the writer ran through every read and the coordinator's kill"


def test_fresh_reads_of_an_upsert_stream_are_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
    stopped_at_end: list[Any],
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    stream = changes(20_000, 120, seed=29)

    def record_of(number: int) -> tuple[int, bytes, bytes | None]:
        change = stream[number]
        value = None if change.row is None else json.dumps(as_record(change.row)).encode()
        return partition_of(change.key, PARTITIONS), json.dumps(key_record(change.key)).encode(), value

    producer = SteadyProducer(kafka_bootstrap, topic, record_of, limit=len(stream)).start()
    stopped_at_end.append(producer)
    query = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ROW_DDL, evolve_schema=False, mutations=Mutations(MutationMode.UPSERT, ("id",))),
        SinkSettings("customers", "crm.customers", coordinator.target, str(tmp_path / "cp"), processing_time=TRIGGER),
    )
    stopped_at_end.append(query)
    coordinator.wait_for_log("keyed epochs committed as a row delta", timeout=QUERY_TIMEOUT_SECONDS)
    flags = {"bootstrap_servers": kafka_bootstrap, "topic": topic, "mode": "upsert", "key": "id"}
    reads = FreshReads(
        spark, coordinator, catalog, "customers", "crm.customers", flags, producer, random.Random(29), stopped_at_end
    )
    for round_number in range(ROUNDS):
        rows, acknowledged, below = reads.read(round_number)

        # A key's records are in one partition, in the order produced: the model of the records below the ends.
        expected = model([stream[number] for number in sorted(below.values())])
        read: list[Row] = sorted((int(row["id"]), str(row["name"]), int(row["seq"])) for row in rows.to_pylist())
        assert rows.column_names[: len(COLUMNS)] == list(COLUMNS)
        assert read == expected, f"round {round_number}: not the model of the records below its end offsets"
        assert acknowledged <= set(below), f"round {round_number}: records acknowledged before it are missing"
    reads.assert_the_seam_was_crossed()
    # What the table holds once the writer committed what the last read saw is that read.
    producer.pause()
    last = fresh.read_arrow(**reads.arguments())
    held = table_once_it_holds(catalog, "crm.customers", ends_of(last))
    assert sorted_rows(held, last.column_names) == sorted_rows(last, last.column_names)
    assert_verified(coordinator.database_url, catalog, "customers")  # beside the running writer
    assert query.query.isActive, "the writer ran through every read and the coordinator's kill"
