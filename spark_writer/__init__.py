"""PySpark side of sink-coordinator: the Kafka source and the exactly-once Iceberg sink."""

from spark_writer.worker_logging import configure_unless_configured

configure_unless_configured()
