"""sink-coordinator: a two-phase commit coordinator from Spark micro-batches to Apache Iceberg."""

__version__ = "0.1.0"
