"""The rows of the Kafka source (spark_writer.kafka.arrow): the Arrow batches Spark checks against its schema."""

from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema

from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA
from spark_writer.kafka.source import KAFKA_SCHEMA


def test_arrow_schema_is_what_spark_expects() -> None:
    assert KAFKA_ARROW_SCHEMA.equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))
