"""Row mutations end to end: an upsert stream and a Debezium change stream (random inserts, updates and deletes of
overlapping keys across many micro-batches) through the real job, a real broker and the real coordinator process;
the table, read by pyiceberg and by DuckDB's Iceberg extension, holds the last value of each key and no deleted key.
Also through a driver killed mid-stream and re-run, a coordinator killed mid-commit, tasks that fail after writing
and maintenance between the commits; fanned out, with a column added, partitioned by a column keys move across; as
an --op-field stream and as Debezium's Avro through a schema registry."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from spark_writer import job_run
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, RecordFormat, SinkSettings
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations, parse_op_map
from spark_writer.mutations.tasks import keyed_tasks
from spark_writer.routing.routes import Routes, Unrouted
from spark_writer.sink.parquet_writer import DataFileTarget
from tests.fixtures.coordinator import CoordinatorProcess, failpoints_env
from tests.fixtures.duckdb_reader import duckdb_rows
from tests.fixtures.kafka_broker import produce_records
from tests.fixtures.pipeline import QUERY_TIMEOUT_SECONDS
from tests.fixtures.reachable_files import reachable_files
from tests.fixtures.sink_writer_process import killable_driver_command
from tests.fixtures.upsert_streams import (
    ROW_DDL,
    Row,
    as_record,
    assert_table_is_model,
    changes,
    debezium_envelopes,
    model,
    partition_of,
    produce_debezium,
    produce_upserts,
)
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
Factory = Callable[..., CoordinatorProcess]

RECORDS = 2400
KEYS = 300
PARTITIONS = 3
PER_BATCH = 400  # 6 batches
UPSERT = Mutations(MutationMode.UPSERT, ("id",))
KILLED_EPOCH = 3


def keyed_settings(
    bootstrap: str, topic: str, coordinator: str, checkpoint: Path, sink: str, mutations: Mutations = UPSERT
) -> tuple[KafkaSettings, ParseSettings, SinkSettings]:
    return (
        KafkaSettings(bootstrap, (topic,), max_offsets_per_trigger=PER_BATCH),
        ParseSettings(schema_ddl=ROW_DDL, evolve_schema=False, mutations=mutations),
        SinkSettings(
            sink=sink,
            table=f"crm.{sink}",
            coordinator=coordinator,
            checkpoint_location=str(checkpoint),
            available_now=True,
        ),
    )


def test_an_upsert_stream_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=29)
    produce_upserts(kafka_bootstrap, topic, produced, PARTITIONS)
    settings = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "customers")
    assert start_job(spark, *settings).await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.customers", produced)
    with coordinator.client() as client:
        state = client.sink_state("customers")
    assert state.committed_epoch == state.checkpointed_epoch == RECORDS // PER_BATCH - 1
    # Ranges, no key twice, and each epoch at most a row per record its writer read.
    assert_verified(coordinator.database_url, catalog, "customers")

    # A re-run on the drained topic changes nothing: no snapshot of the sink's (maintenance may add its own).
    written = sink_snapshot_ids(catalog.load_table("crm.customers"))
    assert start_job(spark, *settings).await_termination(QUERY_TIMEOUT_SECONDS)
    assert_table_is_model(catalog, "crm.customers", produced)
    assert sink_snapshot_ids(catalog.load_table("crm.customers")) == written


def sink_snapshot_ids(table: Table) -> list[tuple[int, str, str]]:
    """The table's snapshots that carry a sink's marker (its commits), oldest first: id, epoch and operation (what
    a failure needs to tell a replayed epoch from a new one)."""
    return [
        (snapshot.snapshot_id, properties[MARKER_EPOCH], str(snapshot.summary.operation) if snapshot.summary else "")
        for snapshot in table.snapshots()
        if MARKER_SINK in (properties := snapshot_properties(snapshot))
    ]


def writer_flags(kafka: KafkaSettings, parse: ParseSettings, sink: SinkSettings, work: Path) -> list[str]:
    """The `sink-writer` command line of these settings (an upsert stream keyed by `id`)."""
    assert kafka.max_offsets_per_trigger is not None and parse.schema_ddl is not None
    return [
        "--bootstrap-servers", kafka.bootstrap_servers,
        *[flag for topic in kafka.topics for flag in ("--topic", topic)],
        "--schema", parse.schema_ddl,
        "--no-evolve-schema",
        "--mode", "upsert",
        "--key", ",".join(parse.mutations.key),
        "--max-offsets-per-trigger", str(kafka.max_offsets_per_trigger),
        "--sink", sink.sink,
        "--table", sink.table,
        "--coordinator", sink.coordinator,
        "--checkpoint-location", sink.checkpoint_location,
        "--available-now",
        "--master", "local[2]",
        "--spark-log-file", str(work / "spark.log"),
    ]  # fmt: skip


@pytest.mark.parametrize("point", ["after-precommit", "before-checkpoint-report"])
def test_an_upsert_stream_through_a_driver_killed_mid_stream_and_rerun(
    point: str,
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """kill -9 of the driver's process group after a batch's pre-commit (the epoch is re-run: its rows once) or
    after its Spark checkpoint (the restart commits it): the re-run leaves the model."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=31)
    produce_upserts(kafka_bootstrap, topic, produced, PARTITIONS)
    settings = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "customers_crash")
    log_path = tmp_path / "driver.log"
    with log_path.open("w") as log_file:
        completed = subprocess.run(
            [*killable_driver_command(point, KILLED_EPOCH), *writer_flags(*settings, tmp_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the kill point takes the driver's whole process group, and only it
            timeout=QUERY_TIMEOUT_SECONDS,
            check=False,
        )
    assert completed.returncode == -signal.SIGKILL, log_path.read_text()[-5000:]
    with coordinator.client() as client:
        assert (KILLED_EPOCH, "PENDING") in {(e.epoch, e.status) for e in client.sink_state("customers_crash").epochs}

    assert start_job(spark, *settings).await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.customers_crash", produced)
    with coordinator.client() as client:
        state = client.sink_state("customers_crash")
    assert state.committed_epoch == state.checkpointed_epoch == RECORDS // PER_BATCH - 1
    assert_verified(coordinator.database_url, catalog, "customers_crash")


@pytest.fixture
def successor() -> Iterator[list[CoordinatorProcess]]:
    """Coordinators started by the test itself (on the ports of a killed one); stopped at the end."""
    started: list[CoordinatorProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest.mark.parametrize(
    "failpoint", ["precommit.after_persist=kill@3", "commit.before_append=kill@3", "commit.after_append=kill@3"]
)
def test_an_upsert_stream_through_a_coordinator_killed_mid_commit(
    failpoint: str,
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator_factory: Factory,
    successor: list[CoordinatorProcess],
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """kill -9 of the coordinator at its third commit, before or after the row delta is in the table (its epochs
    not yet marked COMMITTED); a new coordinator on the same database and ports resolves again or finds the
    snapshot: every key's old row deleted once, its new row once."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=37)
    produce_upserts(kafka_bootstrap, topic, produced, PARTITIONS)
    first = coordinator_factory(**failpoints_env(failpoint))
    running = start_job(
        spark, *keyed_settings(kafka_bootstrap, topic, first.target, tmp_path / "checkpoint", "customers_commit")
    )
    outcome: list[object] = []

    def await_query() -> None:  # in a thread: the query can only end once the successor answers
        try:
            outcome.append(running.await_termination(QUERY_TIMEOUT_SECONDS))
        except Exception as error:
            outcome.append(error)

    waiter = threading.Thread(target=await_query)
    waiter.start()
    assert first.wait_killed(timeout=QUERY_TIMEOUT_SECONDS) == -signal.SIGKILL
    second = CoordinatorProcess(
        database_url=database_url, data_dir=first.data_dir, grpc_port=first.grpc_port, http_port=first.http_port
    )
    successor.append(second)
    second.start()
    waiter.join(QUERY_TIMEOUT_SECONDS)

    assert outcome == [True], "the query did not finish after the coordinator came back"
    assert_table_is_model(catalog, "crm.customers_commit", produced)
    with second.client() as client:
        state = client.sink_state("customers_commit")
    assert state.committed_epoch == state.checkpointed_epoch == RECORDS // PER_BATCH - 1
    assert_verified(database_url, catalog, "customers_commit")


def test_a_debezium_change_stream_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """Debezium's JSON envelopes (snapshot reads, creates, updates, deletes each followed by its tombstone)."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=41)
    produce_debezium(kafka_bootstrap, topic, produced, PARTITIONS)
    cdc = Mutations(MutationMode.CDC, ("id",), envelope=Envelope.DEBEZIUM)
    running = start_job(
        spark,
        *keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "customers_cdc", cdc),
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.customers_cdc", produced)
    assert_verified(coordinator.database_url, catalog, "customers_cdc")


REGIONS = ("eu", "us")


def region_of(key: int) -> str:
    return REGIONS[key % len(REGIONS)]


def test_an_upsert_stream_fanned_out_by_a_key_column_leaves_each_table_its_keys(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """Keyed by (region, id) and routed by region into two tables: each table holds the model of its region's keys."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=43)
    produce_upserts(
        kafka_bootstrap,
        topic,
        produced,
        PARTITIONS,
        record_of=lambda row: {"region": region_of(row[0]), **as_record(row)},
        key_of=lambda key: {"region": region_of(key), "id": key},
    )
    tables = {region: f"crm.customers_{region}" for region in REGIONS}
    kafka, _, sink = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "fan")
    running = start_job(
        spark,
        kafka,
        ParseSettings(
            schema_ddl=f"region STRING NOT NULL, {ROW_DDL}",
            evolve_schema=False,
            mutations=Mutations(MutationMode.UPSERT, ("region", "id")),
        ),
        replace(sink, routes=Routes.static("region", tables.items(), Unrouted.FAIL)),
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    for region, table in tables.items():
        assert_table_is_model(catalog, table, produced, keys=lambda key, region=region: region_of(key) == region)
    with coordinator.client() as client:
        state = client.sink_state("fan")
    assert {table.table: table.committed_epoch for table in state.tables if table.table in tables.values()} == (
        dict.fromkeys(tables.values(), RECORDS // PER_BATCH - 1)
    )
    assert_verified(coordinator.database_url, catalog, "fan")


def test_a_column_added_mid_stream_to_an_upsert_table_holds_each_keys_last_value(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """A field the records start to carry halfway becomes a column; a key last written before it holds null there."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=47)
    half = RECORDS // 2

    def with_tier(row: Row) -> dict[str, object]:
        return {**as_record(row), "tier": f"t{row[2] % 3}"}

    produce_upserts(kafka_bootstrap, topic, produced[:half], PARTITIONS)
    kafka, parse, sink = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "grow")
    running = start_job(spark, kafka, replace(parse, evolve_schema=True), replace(sink, available_now=False))
    running.query.processAllAvailable()
    assert "tier" not in catalog.load_table("crm.grow").schema().column_names

    produce_upserts(kafka_bootstrap, topic, produced[half:], PARTITIONS, record_of=with_tier)
    running.query.processAllAvailable()
    running.stop()

    assert_table_is_model(catalog, "crm.grow", produced)
    tiers = {row[0]: with_tier(row)["tier"] if row[2] >= half else None for row in model(produced)}
    read = catalog.load_table("crm.grow").scan(selected_fields=("id", "tier")).to_arrow().to_pylist()
    assert {row["id"]: row["tier"] for row in read} == tiers
    duckdb = duckdb_rows(catalog.load_table("crm.grow").metadata_location, "id", "id, tier")
    assert dict(duckdb) == tiers
    assert_verified(coordinator.database_url, catalog, "grow")


def test_an_upsert_stream_whose_keys_move_between_partitions_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """The table is partitioned by a column that is not the key, and a key's region changes from record to record:
    its old row is deleted in the partition it was in."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=53)
    produce_upserts(
        kafka_bootstrap,
        topic,
        produced,
        PARTITIONS,
        record_of=lambda row: {**as_record(row), "region": REGIONS[row[2] % len(REGIONS)]},
    )
    kafka, parse, sink = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "moving")
    running = start_job(
        spark,
        kafka,
        replace(parse, schema_ddl=f"{ROW_DDL}, region STRING"),
        replace(sink, partition_by=("region",)),
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert [field.name for field in catalog.load_table("crm.moving").spec().fields] == ["region"]
    assert_table_is_model(catalog, "crm.moving", produced)
    read = catalog.load_table("crm.moving").scan(selected_fields=("id", "seq", "region")).to_arrow().to_pylist()
    assert all(row["region"] == REGIONS[row["seq"] % len(REGIONS)] for row in read)
    assert_verified(coordinator.database_url, catalog, "moving")


def test_an_upsert_stream_while_maintenance_expires_its_snapshots(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator_factory: Factory,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """A snapshot per epoch, and maintenance every half second keeping two snapshots (its compaction, from two files,
    leaves alone the partitions that hold delete files, as every partition here soon does): the commits resolve keys
    on a table whose history changes between them, and the table still is the model."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=59)
    produce_upserts(kafka_bootstrap, topic, produced, PARTITIONS)
    coordinator = coordinator_factory(
        SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS="0",
        SINK_COORDINATOR_MAINTENANCE_INTERVAL_SECONDS="0.5",
        SINK_COORDINATOR_SNAPSHOT_MAX_COUNT="2",
        SINK_COORDINATOR_SNAPSHOT_MAX_AGE_SECONDS="1",
        SINK_COORDINATOR_COMPACTION_MIN_FILES="2",
    )
    running = start_job(
        spark, *keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "maintained")
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.maintained", produced)
    # The second maintenance run from now began after the last commit (the first may have read the table before it).
    coordinator.drain_logs()
    for _ in range(2):
        coordinator.logs.clear()
        coordinator.wait_for_log("table maintained", sink="maintained")
    assert len(catalog.load_table("crm.maintained").snapshots()) <= 2
    assert_table_is_model(catalog, "crm.maintained", produced)
    assert_verified(coordinator.database_url, catalog, "maintained")


def test_an_op_field_change_stream_with_kafka_metadata_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """`--mode cdc --op-field op --op-map I=upsert,U=upsert,D=delete` and `--kafka-metadata`: a delete is a record
    (no tombstone) whose op says so, its row only its key; each row keeps the Kafka position of its key's last
    record."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=61)
    records = produce_upserts(
        kafka_bootstrap,
        topic,
        produced,
        PARTITIONS,
        record_of=lambda row: {**as_record(row), "op": "IU"[row[2] % 2]},
        deleted_of=lambda key: {"id": key, "op": "D"},
    )
    kafka, parse, sink = keyed_settings(
        kafka_bootstrap,
        topic,
        coordinator.target,
        tmp_path / "checkpoint",
        "ops",
        Mutations(MutationMode.CDC, ("id",), op_field="op", op_map=parse_op_map("I=upsert,U=upsert,D=delete")),
    )
    running = start_job(spark, kafka, replace(parse, schema_ddl=f"{ROW_DDL}, op STRING", kafka_metadata=True), sink)
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.ops", produced)
    # Each row's position is its key's last record in Kafka (produced in order, one partition per key).
    last = {int(json.loads(record.key)["id"]): (record.partition, record.offset) for record in records}
    read = catalog.load_table("crm.ops").scan(selected_fields=("id", "kafka_partition", "kafka_offset"))
    positions = {row["id"]: (row["kafka_partition"], row["kafka_offset"]) for row in read.to_arrow().to_pylist()}
    assert positions == {row[0]: last[row[0]] for row in model(produced)}
    assert_verified(coordinator.database_url, catalog, "ops", kafka_bootstrap)


AVRO_ROW: dict[str, object] = {
    "type": "record",
    "name": "Value",
    "namespace": "dbserver.crm.customers",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "seq", "type": ["null", "long"], "default": None},
    ],
}
AVRO_ENVELOPE: dict[str, object] = {
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver.crm.customers",
    "fields": [
        {"name": "before", "type": ["null", AVRO_ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "fields": [{"name": "db", "type": "string"}, {"name": "lsn", "type": "long"}],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
AVRO_KEY: dict[str, object] = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}


def test_a_debezium_avro_change_stream_through_a_schema_registry_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    registry_url: str,
    tmp_path: Path,
) -> None:
    """Debezium's envelope in Avro (the subject's schema its Envelope record, the keys' subject `<topic>-key`), each
    delete followed by its tombstone, whose key is decoded with the key subject's schema."""
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=67)
    client = registry_client(RegistrySettings.of(registry_url))
    write_value = AvroSerializer(client, json.dumps(AVRO_ENVELOPE))
    write_key = AvroSerializer(client, json.dumps(AVRO_KEY))
    keys, values = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)

    def records() -> Iterator[tuple[int, bytes, bytes | None]]:
        for index, (change, envelope) in enumerate(debezium_envelopes(produced)):
            key = write_key({"id": change.key}, keys)
            envelope = {**envelope, "source": {"db": "crm", "lsn": index}}
            yield partition_of(change.key, PARTITIONS), key, write_value(envelope, values)
            if change.row is None:
                yield partition_of(change.key, PARTITIONS), key, None

    produce_records(kafka_bootstrap, topic, records())
    kafka, _, sink = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "avro_cdc")
    parse = ParseSettings(
        RecordFormat.AVRO,
        schema_registry_url=registry_url,
        evolve_schema=False,
        mutations=Mutations(MutationMode.CDC, ("id",), envelope=Envelope.DEBEZIUM),
    )
    assert start_job(spark, kafka, parse, sink).await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.avro_cdc", produced)
    assert_verified(coordinator.database_url, catalog, "avro_cdc")


def test_an_upsert_stream_whose_tasks_fail_once_after_writing_leaves_the_last_value_of_each_key(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every batch's first task fails once after it wrote its data and key files (as an executor lost after its
    work): Spark runs it again, and only the files of the attempt that succeeded reach the commit."""

    def failing_once(frame: DataFrame, target: DataFileTarget) -> DataFrame:
        def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            # Defined here, so that it is shipped to the Python workers by value.
            written = list(batches)
            context = TaskContext.get()
            assert context is not None
            if context.partitionId() == 0 and context.attemptNumber() == 0:
                raise RuntimeError("injected failure of a task after it wrote its files")
            yield from written

        written = keyed_tasks(frame, target)
        return written.mapInArrow(fail_first_attempt, written.schema)

    monkeypatch.setattr(job_run, "keyed_tasks", failing_once)
    topic = kafka_topic(partitions=PARTITIONS)
    produced = changes(RECORDS, KEYS, seed=71)
    produce_upserts(kafka_bootstrap, topic, produced, PARTITIONS)
    settings = keyed_settings(kafka_bootstrap, topic, coordinator.target, tmp_path / "checkpoint", "retried")
    assert start_job(spark, *settings).await_termination(QUERY_TIMEOUT_SECONDS)

    assert_table_is_model(catalog, "crm.retried", produced)
    table = catalog.load_table("crm.retried")
    # Files some snapshot reaches: the live ones, and those a compaction replaced while a snapshot still holds them.
    reached = {Path(path.removeprefix("file://")).name for path in reachable_files(table)}
    data = Path(table.location().removeprefix("file://")) / "data"
    # <batch>-<task's partition>-<attempt id>-...: the first attempts of task 0, which failed, left their files.
    # (A compaction that lost to a commit leaves files of pyiceberg's naming for the sweep: not the writer's.)
    given_up = {
        path.name
        for path in data.rglob("*.parquet")
        if "-keys-" not in path.name and re.fullmatch(r"\d{8}-\d{5}-\d+-.*", path.name)
    } - reached
    assert given_up, "no task failed after writing its files"
    assert {name.split("-")[1] for name in given_up} == {"00000"}, given_up
    assert_verified(coordinator.database_url, catalog, "retried")
