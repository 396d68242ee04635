"""PySpark side of sink-coordinator: the Kafka source and the exactly-once Iceberg sink."""
