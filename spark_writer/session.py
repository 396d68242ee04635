"""A local SparkSession with the settings this project relies on.

Tests, benchmarks and the single-machine deployment all need the same things:
a Java 17+ found before the JVM starts, Python workers running the very
interpreter of the driver (so they import this package and its dependencies),
small shuffles, no web UI, and the Kafka Python data source registered.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from spark_writer.java import ensure_java
from spark_writer.kafka_source import KafkaDataSource

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
}


def _use_this_interpreter_for_workers() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def local_spark_session(app_name: str, master: str = "local[2]") -> SparkSession:
    """Start (or reuse) a local SparkSession and register the ``sink_coordinator_kafka`` source."""
    ensure_java()
    _use_this_interpreter_for_workers()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in LOCAL_SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(KafkaDataSource)
    return spark
