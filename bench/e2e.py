"""Part 3, end to end: records per second from Kafka to Iceberg, through the coordinator and without it.

Both jobs read the same topic with the project's Kafka source (availableNow, maxOffsetsPerTrigger), and decode
the same JSON and write the same Parquet files with the same executor code (the writer's mapInArrow tasks, which
decode the records themselves: kafka_records.JsonBatchParser). The coordinated
job is spark_writer.write_to_iceberg with the real coordinator process; the plain job is a foreachBatch that
appends each batch's files with one pyiceberg append (add_files) on the same catalog, and nothing else.
Rate = records / (query start to termination, including the last commit). The anchor of both is the raw read
rate of the same topic (bench.source_limit: a consumer and the same JSON parsing, no Spark). Where the coordinated
query's time went comes from Spark's own progress reports (QueryTime): before its first batch, in the sink's function
(Spark's addBatch: the writer's tasks, the files' collection, the pre-commit), in the rest of each trigger (Spark's
offset and commit logs, its planning), and after its last trigger.

Part 3 runs both jobs in a local Spark session on a local warehouse; part 9 runs them where tables really live,
on a Spark standalone cluster (executors in JVMs of their own) with the tables on S3 in an Iceberg REST catalog
(SeaweedFS on 127.0.0.1, reached by the executors through the writer's storage settings and by the coordinator
and the plain job through pyiceberg's FileIO and REST catalog).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bench.infra import Coordinator, Postgres, latency_stats, spread
from bench.source_limit import raw_read_rate
from coordinator_service.contract.markers import snapshot_properties

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

ORDER_DDL = "order_id BIGINT, customer STRING, amount DOUBLE, country STRING"


def start_broker(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    from tests.fixtures.kafka_broker import start_broker as start_noida_broker

    data_dir = root / "noida-db"
    data_dir.mkdir(parents=True, exist_ok=True)
    return start_noida_broker(data_dir)


def stop_broker(process: subprocess.Popen[bytes]) -> None:
    from tests.fixtures.kafka_broker import _stop

    _stop(process)


def produce(bootstrap: str, partitions: int, records: int) -> str:
    from tests.fixtures.kafka_broker import create_topic, produce_records

    topic = create_topic(bootstrap, partitions, prefix="bench")
    countries = ("DE", "FR", "US")
    produce_records(
        bootstrap,
        topic,
        (
            (
                i % partitions,
                str(i).encode(),
                json.dumps(
                    {"order_id": i, "customer": f"c{i % 11}", "amount": i * 1.25, "country": countries[i % 3]}
                ).encode(),
            )
            for i in range(records)
        ),
    )
    return topic


def _stream(spark: Any, bootstrap: str, topic: str, max_offsets: int) -> tuple[Any, Any]:
    """The topic's orders as the sink-writer job reads them with their schema given (`--schema`, no
    `--evolve-schema`): a stream of offset ranges (spark_writer.kafka.range_source), and the JSON decoding of the
    writer's tasks, which read each range's records themselves (both jobs write through it)."""
    from spark_writer.kafka.options import parse_options
    from spark_writer.kafka.range_source import RANGE_SOURCE_NAME
    from spark_writer.sink.kafka_records import JsonBatchParser, schema_from_ddl
    from tests.fixtures.pipeline import order_source_options

    options = order_source_options(bootstrap, topic, max_offsets)
    frame = spark.readStream.format(RANGE_SOURCE_NAME).options(**options).load()
    parser = JsonBatchParser(
        schema_from_ddl(ORDER_DDL), evolve=False, kafka_metadata=True, ranges=parse_options(options)
    )
    return frame, parser


@dataclass(frozen=True)
class Place:
    """Where both jobs run: the Spark master, the catalog, and how executors reach its warehouse."""

    master: str
    catalog: dict[str, str]
    storage: dict[str, str] = field(default_factory=dict)


class QueryTime(NamedTuple):
    """Where a query's wall time went (seconds), from Spark's progress reports of its triggers."""

    wall: float
    before_first_batch: float  # the writer's registration, the query's start, its source's first offsets
    in_batches: float  # Spark's addBatch: the sink's function, with the writer's tasks
    between_batches: float  # the rest of each trigger: Spark's offset and commit logs, its planning
    after_last_batch: float


def query_time(progress: Sequence[StreamingQueryProgress], started: float, wall: float) -> QueryTime:
    """`progress`: the query's every progress report, in order (StreamingQuery.recentProgress); `started`: the wall
    clock (time.time()) when the run began, `wall` its length."""
    assert progress and progress[0].batchId == 0, "the query's progress reports do not start at its first batch"
    starts = [datetime.fromisoformat(report.timestamp).timestamp() for report in progress]
    triggers = [report.durationMs.get("triggerExecution", 0) / 1000 for report in progress]
    in_batches = sum(report.durationMs.get("addBatch", 0) / 1000 for report in progress)
    return QueryTime(
        wall=wall,
        before_first_batch=starts[0] - started,
        in_batches=in_batches,
        between_batches=sum(triggers) - in_batches,
        after_last_batch=started + wall - (starts[-1] + triggers[-1]),
    )


def run_coordinated(
    spark: Any, coordinator: Coordinator, bootstrap: str, topic: str, max_offsets: int, root: Path, place: Place
) -> QueryTime:
    from spark_writer.sink.iceberg_sink import write_to_iceberg

    name = f"e2e_{topic.replace('-', '_')}"
    started, started_wall = time.monotonic(), time.time()
    frame, parser = _stream(spark, bootstrap, topic, max_offsets)
    running = write_to_iceberg(
        frame,
        sink=name,
        table=f"bench.{name}",
        coordinator=coordinator.target,
        checkpoint_location=str(root / f"ckpt-{name}"),
        available_now=True,
        storage=place.storage,
        transform=parser,
    )
    assert running.await_termination(600), "coordinated query did not finish"
    return query_time(running.query.recentProgress, started_wall, time.monotonic() - started)


def run_plain(
    spark: Any, catalog: Any, bootstrap: str, topic: str, max_offsets: int, root: Path, place: Place
) -> float:
    from coordinator_service.tables.iceberg import IcebergGateway
    from spark_writer.sink.parquet_writer import WRITTEN_FILES_STRUCT, DataFileTarget, task_writer
    from spark_writer.sink.storage import Storage

    name = f"plain_{topic.replace('-', '_')}"
    frame, parser = _stream(spark, bootstrap, topic, max_offsets)
    location = IcebergGateway(catalog).ensure_table(f"bench.{name}", parser.table_schema, ())

    def write_batch(batch: Any, batch_id: int) -> None:
        prepared = parser.prepare(batch)
        target = DataFileTarget(
            table_location=location,
            batch_id=batch_id,
            schema=prepared.schema,
            partition_fields=(),
            target_file_size_bytes=128 * 1024 * 1024,
            storage=Storage(place.storage),
            decoding=prepared.decoding,
            ranges=prepared.ranges,
        )
        written = prepared.frame.mapInArrow(task_writer(target), WRITTEN_FILES_STRUCT).collect()
        paths = [row.path for row in written if row.path is not None]
        if paths:
            catalog.load_table(f"bench.{name}").add_files(paths, check_duplicate_files=False)

    started = time.monotonic()
    query = (
        frame.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(root / f"ckpt-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    return time.monotonic() - started


def _paced(records: Iterator[tuple[int, bytes, bytes]], rate: int) -> Iterator[tuple[int, bytes, bytes]]:
    """The records at `rate` per second, as a steady source would send them."""
    started = time.monotonic()
    for index, record in enumerate(records):
        if index % 100 == 0 and (delay := started + index / rate - time.monotonic()) > 0:
            time.sleep(delay)
        yield record


def measure_freshness(
    spark: Any, coordinator: Coordinator, catalog: Any, bootstrap: str, root: Path, *, rate: int, seconds: int
) -> dict[str, Any]:
    """Produce -> visible: a coordinated query with a 1 s trigger while records arrive at a steady rate.

    A record's freshness is the commit time of the snapshot that made its file visible minus its Kafka
    timestamp (set by the producer when it sent the record).
    """
    import pyarrow.parquet as pq

    from spark_writer.sink.iceberg_sink import write_to_iceberg
    from tests.fixtures.kafka_broker import create_topic, produce_records

    topic = create_topic(bootstrap, 4, prefix="fresh")
    name = f"fresh_{topic.replace('-', '_')}"
    frame, parser = _stream(spark, bootstrap, topic, rate * 10)
    running = write_to_iceberg(
        frame,
        sink=name,
        table=f"bench.{name}",
        coordinator=coordinator.target,
        checkpoint_location=str(root / f"ckpt-{name}"),
        processing_time="1 second",
        transform=parser,
    )
    total = rate * seconds
    values = (
        (i % 4, str(i).encode(), json.dumps({"order_id": i, "customer": "c", "amount": 1.0, "country": "DE"}).encode())
        for i in range(total)
    )
    producer = threading.Thread(target=produce_records, args=(bootstrap, topic, _paced(values, rate)))
    producer.start()
    producer.join()
    table = catalog.load_table(f"bench.{name}")
    deadline = time.monotonic() + 120
    # A benchmark, not a test: poll the table until the last records are visible.
    while _row_count(table) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    running.stop()
    table.refresh()
    committed_at = {snapshot.snapshot_id: snapshot.timestamp_ms for snapshot in table.snapshots()}
    entries = table.inspect.entries().to_pylist()
    freshness: list[float] = []
    for entry in entries:
        visible_ms = committed_at[entry["snapshot_id"]]
        path = entry["data_file"]["file_path"].removeprefix("file://")
        produced = pq.read_table(path, columns=["kafka_timestamp"]).column("kafka_timestamp").cast("int64")
        freshness.extend((visible_ms - value // 1000) / 1000 for value in produced.to_pylist())
    return {"rate": rate, "seconds": seconds, "records": len(freshness), **latency_stats(freshness)}


def _row_count(table: Any) -> int:
    table.refresh()
    snapshot = table.current_snapshot()
    return 0 if snapshot is None else int(snapshot_properties(snapshot).get("total-records", "0"))


class Pipeline(NamedTuple):
    """What a Spark bench streams through: a broker, the coordinator process, its catalog and a Spark session."""

    bootstrap: str
    coordinator: Coordinator
    catalog: Any
    spark: Any


def start_pipeline(
    stack: ExitStack,
    root: Path,
    database_url: str,
    place: Place,
    data_dir: Path,
    app: str,
    *,
    records_in_jvm: bool,
) -> Pipeline:
    """The broker, the coordinator process on `place`'s catalog (its data in `data_dir`), that catalog with a `bench`
    namespace and a Spark session at `place`'s master, each stopped when `stack` closes; `records_in_jvm`: whether
    the streams' records pass through its JVM (the session's compiler follows, as the job's does:
    session.local_spark_session)."""
    from pyiceberg.catalog import load_catalog

    from spark_writer.session import local_spark_session

    broker, bootstrap = start_broker(root)
    stack.callback(shutil.rmtree, root / "noida-db", ignore_errors=True)
    stack.callback(stop_broker, broker)
    coordinator = Coordinator(
        database_url,
        data_dir,
        env={f"SINK_COORDINATOR_CATALOG__{key}": value for key, value in place.catalog.items()},
    ).start()
    stack.callback(coordinator.stop)
    catalog = load_catalog("default", **place.catalog)
    catalog.create_namespace_if_not_exists("bench")
    spark = local_spark_session(app, place.master, records_in_jvm=records_in_jvm)
    stack.callback(spark.stop)
    spark.sparkContext.setLogLevel("ERROR")
    return Pipeline(bootstrap, coordinator, catalog, spark)


def local_pipeline(
    stack: ExitStack, root: Path, postgres: Postgres, database: str, *, records_in_jvm: bool
) -> Pipeline:
    """start_pipeline on a new database of `postgres`, with a local warehouse and Spark session."""
    database_url = postgres.new_database(database)
    place = local_place(database_url, root / "coordinator")
    return start_pipeline(
        stack, root, database_url, place, root / "coordinator", "sink-coordinator-bench", records_in_jvm=records_in_jvm
    )


def local_place(database_url: str, coordinator_data: Path) -> Place:
    warehouse = coordinator_data / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    return Place("local[2]", {"type": "sql", "uri": database_url, "warehouse": warehouse.as_uri()})


def run(
    postgres: Postgres,
    root: Path,
    *,
    partitions: tuple[int, ...],
    records: int,
    batches: int,
    repetitions: int,
    cluster_s3: bool = False,
) -> dict[str, Any]:
    """Both jobs on a local session and warehouse (with the freshness run), or on a standalone cluster and S3."""
    from sink_coordinator_demo.object_store import local_object_store
    from sink_coordinator_demo.spark_cluster import start_spark_cluster

    database_url = postgres.new_database("e2e_s3" if cluster_s3 else "e2e")
    with ExitStack() as stack:
        if cluster_s3:
            store = stack.enter_context(local_object_store(root / "object-store", "bench-e2e"))
            cluster = start_spark_cluster(root / "spark-cluster")
            stack.callback(cluster.stop)
            catalog_properties = store.catalog_properties("rest", "")
            place = Place(cluster.master_url, catalog_properties, store.properties)
        else:
            place = local_place(database_url, root / "e2e")
        bootstrap, coordinator, catalog, spark = start_pipeline(
            stack, root, database_url, place, root / "e2e", "sink-coordinator-bench", records_in_jvm=False
        )
        rows: list[dict[str, Any]] = []
        # Warm-up: JVM, Python workers, the source and both sinks once on a small topic.
        warm = produce(bootstrap, 1, 1000)
        run_coordinated(spark, coordinator, bootstrap, warm, 500, root, place)
        run_plain(spark, catalog, bootstrap, warm, 500, root, place)
        for count in partitions:
            times: list[QueryTime] = []
            plain: list[float] = []
            raw: list[float] = []
            for _ in range(repetitions):
                topic = produce(bootstrap, count, records)
                max_offsets = max(1, records // batches)
                raw.append(raw_read_rate(bootstrap, topic, count, records))
                plain.append(records / run_plain(spark, catalog, bootstrap, topic, max_offsets, root, place))
                times.append(run_coordinated(spark, coordinator, bootstrap, topic, max_offsets, root, place))
            coordinated = [records / t.wall for t in times]
            rows.append(
                {
                    "partitions": count,
                    "records": records,
                    "batches": batches,
                    "coordinated_rps": spread(coordinated),
                    "plain_rps": spread(plain),
                    "raw_rps": spread(raw),
                    "ratio": spread([c / p for c, p in zip(coordinated, plain, strict=True)]),
                    "ratio_to_raw": spread([c / r for c, r in zip(coordinated, raw, strict=True)]),
                    "coordinated_time": {key: spread([getattr(t, key) for t in times]) for key in QueryTime._fields},
                    "ratio_to_raw_in_batches": spread(
                        [records / t.in_batches / r for t, r in zip(times, raw, strict=True)]
                    ),
                }
            )
        if cluster_s3:
            storage = "S3 and its REST catalog (SeaweedFS)"
            return {"rows": rows, "master": "standalone cluster (1 worker)", "storage": storage}
        freshness = measure_freshness(spark, coordinator, catalog, bootstrap, root, rate=2_000, seconds=20)
    return {"rows": rows, "freshness": freshness}
