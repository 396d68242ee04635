"""Spark started beside the demo's other steps: the standalone cluster (with --cluster), the session, and the Python
workers its first micro-batch would start, in a thread of its own while the coordinator and the broker start and the
events are produced; the demo waits for it (`SparkStart.wait`) before it streams.

Each task of a micro-batch runs two Python workers (the source's read and the writer's step after it), and a new
worker imports pyarrow, pandas and the writer's modules: on two cores the first batch's Spark job took 3.5 s against
0.3-0.6 s for the next ones (Spark's event log). Spark keeps a task's workers for the next tasks
(spark.python.worker.reuse), so the warm-up runs a job of as many tasks as the session has cores, each through two
Python steps that import what the writer's tasks import; the first batch then finds its workers started.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa
from pyspark.sql import SparkSession

from sink_coordinator_demo.spark_cluster import SparkCluster, start_spark_cluster
from spark_writer.driver_jvm import SparkLog
from spark_writer.session import local_spark_session

# What the writer's tasks import (their functions' modules: the sources' readers, the decoding and writing steps),
# with pandas, which pyarrow imports at its first conversion of Python objects.
TASK_MODULES: Final = (
    "pandas",
    "spark_writer.kafka.range_source",
    "spark_writer.kafka.source",
    "spark_writer.mutations.keyed_source",
    "spark_writer.mutations.tasks",
    "spark_writer.sink.kafka_records",
    "spark_writer.sink.parquet_writer",
    "spark_writer.sink.registry_records",
)


@dataclass
class SparkStart:
    """Spark starting in a daemon thread (an interrupted demo does not wait for a JVM to finish starting)."""

    master: str
    cluster_dir: Path | None
    spark_log: SparkLog
    records_in_jvm: bool
    spark: SparkSession | None = field(default=None, init=False)
    cluster: SparkCluster | None = field(default=None, init=False)
    _error: BaseException | None = field(default=None, init=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False)

    def begin(self) -> SparkStart:
        threading.Thread(target=self._start, name="spark-start", daemon=True).start()
        return self

    def wait(self) -> SparkSession:
        """The session once started, its workers warm; raises what stopped its start."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self.spark is not None
        return self.spark

    def stop(self) -> None:
        """Stop what the start started, once it has ended."""
        self._done.wait()
        if self.spark is not None:
            self.spark.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def _start(self) -> None:
        try:
            master = self.master
            if self.cluster_dir is not None:
                self.cluster = start_spark_cluster(self.cluster_dir)
                master = self.cluster.master_url
            self.spark = local_spark_session(
                "sink-coordinator-demo", master, self.spark_log, records_in_jvm=self.records_in_jvm
            )
            warm_python_workers(self.spark)
        except BaseException as error:  # handed to wait(), in the demo's thread
            self._error = error
        finally:
            self._done.set()


def warm_python_workers(spark: SparkSession) -> None:
    """Start the Python workers a micro-batch's tasks run, each having imported TASK_MODULES."""
    tasks = spark.sparkContext.defaultParallelism
    numbers = spark.range(tasks, numPartitions=tasks)
    numbers.mapInArrow(_importing, "id long").mapInArrow(_importing, "id long").collect()


def _importing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for name in TASK_MODULES:
        importlib.import_module(name)
    yield from batches
