"""An upsert or change stream's batch through a real local Spark (spark_writer.mutations.tasks): its records shuffled
so that one task owns each key, the winners (the last record of each key in Kafka order) written as data files and
every key touched as key files; the same batch again gives the same rows. Then the whole job against a real broker
and a real coordinator: the epoch's data and key files pre-committed, the log holding them in version 2 of the
pre-commit metadata, and the epoch committed: the table holds the winners."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType

from coordinator_service.log.precommit_metadata import KEYED_VERSION
from spark_writer.arrow_schema import arrow_schema_of
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.kafka.source import KAFKA_SCHEMA
from spark_writer.mutations.decoding import MutationDecoder, json_value_schema
from spark_writer.mutations.keyed_source import KEYED_KAFKA_SCHEMA
from spark_writer.mutations.modes import MutationMode, Mutations
from spark_writer.mutations.mutation_parser import MutationParser
from spark_writer.mutations.tasks import SHUFFLE_KEY, keyed_tasks
from spark_writer.routing.routes import Routes
from spark_writer.routing.split import TaskRouting
from spark_writer.sink.kafka_records import JsonBatchParser
from spark_writer.sink.parquet_writer import DataFileTarget
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import client_config
from tests.fixtures.keyed_tables import duckdb_table_rows, pyiceberg_rows
from tests.fixtures.postgres import query

pytestmark = [pytest.mark.spark]

ROW = StructType(
    [StructField("id", LongType(), False), StructField("region", StringType()), StructField("value", StringType())]
)
UPSERT = Mutations(MutationMode.UPSERT, ("id",))
START = dt.datetime(2025, 5, 1, tzinfo=dt.UTC)

# (partition, id, value or None for a tombstone, seconds after START), in the order produced: each partition's
# records in offset order.
Change = tuple[int, int, str | None, int]


def changes() -> list[Change]:
    """Upserts and deletes of overlapping keys over two partitions, with keys whose records span both."""
    produced: list[Change] = []
    for step in range(120):
        key = (step * 7) % 23
        partition = 0 if key < 15 else step % 2  # keys 15..22 span both partitions
        value = None if step % 9 == 4 else f"v{step}"
        produced.append((partition, key, value, step % 13))  # timestamps out of order across the stream
    return produced


def model(produced: list[Change]) -> tuple[dict[int, str], set[int]]:
    """The documented rule: per partition the last record (offset order) of a key; across partitions the latest
    timestamp, then the greater partition."""
    last: dict[int, dict[int, tuple[str | None, int]]] = {}
    for partition, key, value, seconds in produced:
        last.setdefault(key, {})[partition] = (value, seconds)
    rows = {}
    for key, per_partition in last.items():
        partition = max(per_partition, key=lambda p: (per_partition[p][1], p))
        value = per_partition[partition][0]
        if value is not None:
            rows[key] = value
    return rows, set(last)


def value_of(key: int, value: str | None) -> bytes | None:
    return None if value is None else json.dumps({"id": key, "region": "eu", "value": value}).encode()


def kafka_rows(produced: list[Change], topic: str = "changes") -> list[Row]:
    offsets = {0: 0, 1: 0}
    rows = []
    for partition, key, value, seconds in produced:
        timestamp = START + dt.timedelta(seconds=seconds)
        rows.append(
            Row(json.dumps({"id": key}).encode(), value_of(key, value), topic, partition, offsets[partition],
                timestamp, 0, [])
        )  # fmt: skip
        offsets[partition] += 1
    return rows


def read_files(paths: list[str]) -> list[pa.Table]:
    return [pq.read_table(path.removeprefix("file://")) for path in paths]


def written(results: list[Row]) -> tuple[list[str], list[str]]:
    files = [row for row in results if row.path is not None]
    return [row.path for row in files if not row.key_file], [row.path for row in files if row.key_file]


def test_a_batch_writes_its_winners_and_the_keys_it_touched_and_the_same_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    produced = changes()
    # Spread over three Spark partitions in another order than Kafka's: the positions decide, not the arrival.
    frame = spark.createDataFrame(kafka_rows(produced)[::-1], KAFKA_SCHEMA).repartition(3)
    values = from_arrow_schema(json_value_schema(arrow_schema_of(ROW), UPSERT))
    parser = MutationParser(JsonBatchParser(values, evolve=False, read_keys=True), UPSERT)
    expected_rows, expected_keys = model(produced)

    def run(batch_id: int) -> tuple[dict[int, str], set[int], list[str]]:
        prepared = parser.prepare(frame)
        target = DataFileTarget(tmp_path.as_uri(), batch_id, prepared.schema, (), 1 << 20, decoding=prepared.decoding)
        data, keys = written(keyed_tasks(prepared.frame, target).collect())
        data_tables, key_tables = read_files(data), read_files(keys)
        for table in data_tables:
            assert table.schema.names == ["id", "region", "value"]
            assert table.schema.field("id").nullable is False
        assert all(table.schema.names == ["id"] for table in key_tables)
        assert all("-keys-" in path for path in keys) and not any("-keys-" in path for path in data)
        data_ids = [i for table in data_tables for i in table.column("id").to_pylist()]
        key_ids = [[i for i in table.column("id").to_pylist()] for table in key_tables]
        # One task owns each key: no key in two files, and more than one task had keys.
        assert len(data_ids) == len(set(data_ids))
        assert sum(len(ids) for ids in key_ids) == len({i for ids in key_ids for i in ids})
        assert len([ids for ids in key_ids if ids]) > 1
        rows = {row["id"]: row["value"] for table in data_tables for row in table.to_pylist()}
        return rows, {i for ids in key_ids for i in ids}, [*data, *keys]

    first_rows, first_keys, first_files = run(7)
    assert (first_rows, first_keys) == (expected_rows, expected_keys)
    again_rows, again_keys, again_files = run(7)  # Spark runs the batch again (a retry, a restart)
    assert (again_rows, again_keys) == (first_rows, first_keys)
    assert not set(again_files) & set(first_files)  # named per task attempt


def stage_plan(frame: DataFrame) -> str:
    plan: str = frame._jdf.queryExecution().optimizedPlan().toString()
    return plan


def test_a_batch_is_shuffled_by_the_sources_key_texts_while_they_are_its_decodings(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The Python source's records come with their key texts (keyed_source): a batch is shuffled by them, with no
    UDF, while the parser's decoding is the one they were made with; a batch whose schema grew gets a new decoding,
    and its tasks tag it themselves (the source's texts, here made unlike any decoding's, would split its keys)."""
    produced = changes()
    values = from_arrow_schema(json_value_schema(arrow_schema_of(ROW), UPSERT))
    parser = MutationParser(JsonBatchParser(values, evolve=True, read_keys=True), UPSERT)
    parser.key_tagging_source(spark)
    expected_rows, expected_keys = model(produced)

    def batch(rows: list[Row], tags: list[str | None]) -> DataFrame:
        return spark.createDataFrame([(*row, tag) for row, tag in zip(rows, tags, strict=True)], KEYED_KAFKA_SCHEMA)

    def run(frame: DataFrame, batch_id: int) -> tuple[dict[int, str], set[int], str]:
        prepared = parser.prepare(frame)
        target = DataFileTarget(tmp_path.as_uri(), batch_id, prepared.schema, (), 1 << 20, decoding=prepared.decoding)
        tasks = keyed_tasks(prepared.frame, target)
        data, keys = written(tasks.collect())
        data_ids = [i for table in read_files(data) for i in table.column("id").to_pylist()]
        assert len(data_ids) == len(set(data_ids)), "a key was written by two tasks"
        rows = {row["id"]: row["value"] for table in read_files(data) for row in table.to_pylist()}
        return rows, {i for table in read_files(keys) for i in table.column("id").to_pylist()}, stage_plan(tasks)

    records = kafka_rows(produced)
    decoder = parser.decoding.decoder
    assert isinstance(decoder, MutationDecoder)
    texts = decoder.key_texts(
        pa.array([row[1] for row in records], pa.binary()), pa.array([row[0] for row in records], pa.binary())
    ).to_pylist()
    rows, keys, plan = run(batch(records, texts), 1)
    assert (rows, keys) == (expected_rows, expected_keys)
    assert "ArrowEvalPython" not in plan and SHUFFLE_KEY in plan

    grown = [row if row[1] is None else Row(*row[:1], row[1][:-1] + b', "note": "n"}', *row[2:]) for row in records]
    unlike = [f"offset {row[4]} of {row[3]}" for row in records]
    rows, keys, plan = run(batch(grown, unlike), 2)
    assert (rows, keys) == (expected_rows, expected_keys)
    assert "ArrowEvalPython" in plan
    assert parser.decoding.decoder is not decoder


def test_a_routed_batch_writes_each_tables_rows_and_keys_under_that_table(spark: SparkSession, tmp_path: Path) -> None:
    """Fan-out: the route column is one of the key's, so a key's every change (a tombstone too) goes to one table."""
    produced = changes()
    keyed = Mutations(MutationMode.UPSERT, ("region", "id"))

    def region(key: int) -> str:
        return "eu" if key % 3 else "us"

    rows = []
    for message_key, message_value, *rest in kafka_rows(produced):
        key = json.loads(message_key)["id"]
        value = None if message_value is None else json.dumps({**json.loads(message_value), "region": region(key)})
        rows.append((json.dumps({"id": key, "region": region(key)}).encode(), value and value.encode(), *rest))
    frame = spark.createDataFrame(rows, KAFKA_SCHEMA)
    values = from_arrow_schema(json_value_schema(arrow_schema_of(ROW), keyed))
    parser = MutationParser(JsonBatchParser(values, evolve=False, read_keys=True), keyed)
    prepared = parser.prepare(frame)
    locations = {table: (tmp_path / table).as_uri() for table in ("db.own", "db.eu", "db.us")}
    routing = TaskRouting(Routes.static("region", [("eu", "db.eu"), ("us", "db.us")]), "db.own", locations)
    target = DataFileTarget(
        locations["db.own"], 3, prepared.schema, (), 1 << 20, decoding=prepared.decoding, routing=routing
    )
    files = [row for row in keyed_tasks(prepared.frame, target).collect() if row.path is not None]
    expected_rows, expected_keys = model(produced)
    for table, value in (("db.eu", "eu"), ("db.us", "us")):
        mine = [row for row in files if row.table == table]
        assert all(row.path.startswith(f"{locations[table]}/data/") for row in mine)
        data = read_files([row.path for row in mine if not row.key_file])
        keys = read_files([row.path for row in mine if row.key_file])
        assert {(r["region"], r["id"]): r["value"] for t in data for r in t.to_pylist()} == {
            (value, key): v for key, v in expected_rows.items() if region(key) == value
        }
        assert {(r["region"], r["id"]) for t in keys for r in t.to_pylist()} == {
            (value, key) for key in expected_keys if region(key) == value
        }
    assert not [row for row in files if row.table in (None, "db.own")]  # every record had a route


@pytest.mark.kafka
def test_a_keyed_stream_pre_commits_its_data_and_key_files(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    coordinator: CoordinatorProcess,
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_writer import job_run
    from spark_writer.job import start_job

    plans: list[str] = []
    executed: list[str] = []

    def keyed_tasks_seen(frame: DataFrame, target: DataFileTarget) -> DataFrame:
        tasks = keyed_tasks(frame, target)
        plans.append(stage_plan(tasks))
        executed.append(tasks._jdf.queryExecution().executedPlan().toString())
        return tasks

    monkeypatch.setattr(job_run, "keyed_tasks", keyed_tasks_seen)
    topic = kafka_topic(partitions=2)
    produced = changes()
    producer = Producer(client_config(kafka_bootstrap))
    now = dt.datetime.now(dt.UTC)  # records older than the topic's retention would be gone at once
    for partition, key, value, seconds in produced:
        timestamp = int((now + dt.timedelta(seconds=seconds)).timestamp() * 1000)
        producer.produce(
            topic, key=json.dumps({"id": key}).encode(), value=value_of(key, value), partition=partition,
            timestamp=timestamp,
        )  # fmt: skip
    assert producer.flush(30) == 0
    running = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), starting_offsets="earliest"),
        ParseSettings(schema_ddl="id BIGINT NOT NULL, region STRING, value STRING", mutations=UPSERT),
        SinkSettings(sink="changes", table="shop.changes", coordinator=coordinator.target,
                     checkpoint_location=str(tmp_path / "checkpoint")),
    )  # fmt: skip
    try:
        running.query.processAllAvailable()
    finally:
        running.query.stop()
        running.finish()
    records = query(database_url, "SELECT status, metadata FROM pending_sink_state ORDER BY epoch")
    documents = [(status, json.loads(bytes(metadata))) for status, metadata in records]  # type: ignore[arg-type]
    keyed = [(status, document) for status, document in documents if document["version"] == KEYED_VERSION]
    # Every record was there at the start: one batch held them all, committed once the job finished.
    [(status, document)] = keyed
    assert status == "COMMITTED"
    # The Python source read the records with their key texts: the batch was shuffled by them, with no UDF.
    assert plans and not [plan for plan in plans if "ArrowEvalPython" in plan]
    # Without adaptive execution: one Spark job per batch, not the shuffle's map stage first and a second plan.
    assert executed and not [plan for plan in executed if "AdaptiveSparkPlan" in plan]
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # the query's own session, not the job's
    assert all(not document["tables"][0]["data_files"] for _, document in documents if document["version"] != 2)
    [table] = document["tables"]
    data = [entry["path"] for entry in table["data_files"]]
    keys = [entry["path"] for entry in table["key_files"]]
    rows = {row["id"]: row["value"] for each in read_files(data) for row in each.to_pylist()}
    touched = {i for each in read_files(keys) for i in each.column("id").to_pylist()}
    assert (rows, touched) == model(produced)
    assert sum(entry["key_count"] for entry in table["key_files"]) == len(touched)
    claimed = {path for (path,) in query(database_url, "SELECT path FROM epoch_files")}
    assert set(data) | set(keys) <= claimed
    [(key_columns,)] = query(database_url, "SELECT key_columns FROM sinks")
    assert key_columns == ["id"]
    table = catalog.load_table("shop.changes")
    winners = sorted((key, "eu", value) for key, value in rows.items())
    assert pyiceberg_rows(table) == duckdb_table_rows(table) == winners
