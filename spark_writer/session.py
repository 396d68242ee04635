"""A local SparkSession with the settings this project relies on.

Tests, benchmarks and the single-machine deployment all need the same things:
a Java 17+ found before the JVM starts, Python workers running the very
interpreter of the driver (so they import this package and its dependencies),
small shuffles, no web UI, failed tasks retried (local mode retries none unless
its master says so), a JVM that leaves SIGTERM to the Python driver
(spark_writer.driver_jvm), and the Kafka Python data source registered.
"""

from __future__ import annotations

import os
import re
from typing import Final

from pyspark.sql import SparkSession

from spark_writer.driver_jvm import SparkLog, jvm_ignoring_sigterm
from spark_writer.java import ensure_java
from spark_writer.kafka.range_source import register_kafka_sources
from spark_writer.python_launcher import launcher_path

LOCAL_SPARK_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    "spark.python.worker.reuse": "true",
    # Reused workers that do not collect all of PySpark's objects after each task (spark_writer.worker_daemon).
    "spark.python.daemon.module": "spark_writer.worker_daemon",
}


# HotSpot's quick compiler (C1) alone: no optimizing compilation (C2) in the background.
QUICK_JIT: Final = "-XX:TieredStopAtLevel=1"

# Attempts of a task before its job fails: Spark's default spark.task.maxFailures, which local mode ignores.
TASK_MAX_FAILURES: Final = 4
_LOCAL_MASTER = re.compile(r"^local(?:\[(?P<threads>\*|\d+)\])?$")


def with_task_retries(master: str) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` as ``local[N, 4]``: local mode allows one attempt per task otherwise.

    Other masters (``local[N, F]``, clusters) are returned as they are: on a cluster
    ``spark.task.maxFailures`` (4 by default) applies.
    """
    match = _LOCAL_MASTER.match(master.strip())
    if match is None:
        return master
    return f"local[{match.group('threads') or 1}, {TASK_MAX_FAILURES}]"


def retries_tasks(master: str) -> bool:
    """False for a local master that lets a task fail only once (the job warns about it)."""
    return _LOCAL_MASTER.match(master.strip()) is None


def _use_this_interpreter_for_workers() -> None:
    # Spark's Python processes run this interpreter, through the launcher that keeps them off Spark's zips
    # (the driver's: those of the driver's own planners, such as the lookup of data sources at start).
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = launcher_path()


def local_spark_session(
    app_name: str, master: str = "local[2]", spark_log: SparkLog | None = None, *, records_in_jvm: bool = True
) -> SparkSession:
    """Start (or reuse) a local SparkSession and register the Kafka sources (records, offset ranges).

    `spark_log`: where the driver JVM logs (by default Spark's console log, on stderr). `records_in_jvm`: whether
    the stream's records pass through the JVM (False: a stream of offset ranges, whose records the writer's tasks
    read). Where they do not, the JVM only plans and schedules, and it runs on HotSpot's quick compiler alone
    (QUICK_JIT): the optimizing one spent 3.3-4.4 s of CPU compiling Spark's code during a minute-old job's
    10-second stream of 1,000,000 records, on the cores the Python workers read and write with (a JVM's own
    code then runs slower; where the records pass through it, that code is theirs).
    """
    ensure_java()
    _use_this_interpreter_for_workers()
    builder = SparkSession.builder.master(with_task_retries(master)).appName(app_name)
    java_options = ([] if spark_log is None else [spark_log.java_options()]) + ([] if records_in_jvm else [QUICK_JIT])
    conf = LOCAL_SPARK_CONF | ({"spark.driver.extraJavaOptions": " ".join(java_options)} if java_options else {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    with jvm_ignoring_sigterm():
        spark = builder.getOrCreate()
    register_kafka_sources(spark)
    return spark
