"""The pipeline where tables really live: a Spark standalone cluster, an S3 server, an Iceberg REST catalog.

`sink-writer --master spark://…` runs as a process of its own; its tasks (reading Kafka, writing Parquet to
the object store) run in the executor's JVM and its Python workers, not in the driver; the coordinator commits
through the REST catalog, which places the table on the same object store (SeaweedFS, or SINK_TEST_S3_* and
SINK_TEST_REST_* for a real endpoint). Mid-stream the executor's JVM is killed (kill -9, with its Python
workers): the worker launches a new one, Spark runs the lost tasks again, and every record is in the table once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from pyiceberg.catalog import load_catalog

from sink_coordinator_demo.object_store import ObjectStore
from sink_coordinator_demo.spark_cluster import SparkCluster
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.pipeline import ORDER_SCHEMA_DDL, kafka_positions, produce_orders, produced_positions
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SINK = "orders-cluster"
TABLE = "shop.orders_cluster"
RECORDS = 1200
PARTITIONS = 4
PER_BATCH = 300  # 4 batches or so (Spark's split rounds each partition's share up)
DRIVER_TIMEOUT_SECONDS = 300
LAUNCH = "Asked to launch executor"  # the worker's log line for each executor it starts

TopicFactory = Callable[..., str]


def executor_jvms(cluster: SparkCluster) -> list[psutil.Process]:
    """The executor JVMs the cluster's worker launched (CoarseGrainedExecutorBackend)."""
    found = []
    for child in psutil.Process(cluster.worker.process.pid).children(recursive=True):
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_exactly_once_on_a_cluster_with_s3_and_a_rest_catalog_with_an_executor_killed_mid_stream(
    spark_cluster: SparkCluster,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator_factory: Callable[..., CoordinatorProcess],
    object_store: ObjectStore,
    tmp_path: Path,
) -> None:
    if not object_store.rest_uri:
        pytest.skip("no REST catalog beside the S3 endpoint: set SINK_TEST_REST_URI and SINK_TEST_REST_WAREHOUSE")
    properties = object_store.catalog_properties("rest", "")
    coordinator = coordinator_factory(
        SINK_COORDINATOR_CATALOG_NAME="rest",
        **{f"SINK_COORDINATOR_CATALOG__{key}": value for key, value in properties.items()},
    )
    catalog = load_catalog("rest", **properties)
    storage = [flag for key, value in object_store.properties.items() for flag in ("--storage", f"{key}={value}")]
    topic = kafka_topic(partitions=PARTITIONS)
    produced = produce_orders(kafka_bootstrap, topic, range(RECORDS), partitions=PARTITIONS)
    flags = [
        "--bootstrap-servers", kafka_bootstrap,
        "--topic", topic,
        "--schema", ORDER_SCHEMA_DDL,
        "--no-evolve-schema",
        "--kafka-metadata",
        "--max-offsets-per-trigger", str(PER_BATCH),
        "--sink", SINK,
        "--table", TABLE,
        "--coordinator", coordinator.target,
        "--checkpoint-location", str(tmp_path / "checkpoint"),
        "--available-now",
        "--master", spark_cluster.master_url,
        *storage,
    ]  # fmt: skip
    log_path = tmp_path / "driver.log"
    with log_path.open("w") as log_file:
        driver = subprocess.Popen(
            [sys.executable, "-m", "spark_writer.job", *flags], stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            coordinator.wait_for_log("checkpoint recorded", timeout=DRIVER_TIMEOUT_SECONDS, sink=SINK, epoch=0)
            launched = re.search(r"Asked to launch executor (app-\S+)/(\d+)", spark_cluster.worker.wait_for(LAUNCH))
            assert launched is not None
            victims = executor_jvms(spark_cluster)
            assert len(victims) == 1, f"expected the job's one executor, found {victims}"
            victims[0].kill()  # the next batches' tasks run on an executor the worker launches again
            spark_cluster.worker.wait_for(f"{LAUNCH} {launched.group(1)}/{int(launched.group(2)) + 1} ")
            assert driver.wait(timeout=DRIVER_TIMEOUT_SECONDS) == 0, log_path.read_text()[-5000:]
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()

    assert kafka_positions(catalog, TABLE) == produced_positions(produced)
    data_files = catalog.load_table(TABLE).inspect.data_files().column("file_path").to_pylist()
    location = catalog.load_table(TABLE).location()
    assert (
        location.startswith("s3://") and data_files and all(path.startswith(f"{location}/data/") for path in data_files)
    )
    with coordinator.client() as client:
        state = client.sink_state(SINK)
    assert state.committed_epoch == state.checkpointed_epoch >= RECORDS // PER_BATCH - 1
    assert_verified(coordinator.database_url, catalog, SINK, kafka_bootstrap)
