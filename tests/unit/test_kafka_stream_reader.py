"""The Spark side of the Kafka source (spark_writer.kafka.source) that needs no broker: read limits."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_writer.kafka.options import parse_options
from spark_writer.kafka.source import KafkaStreamReader, max_rows_of

BOOTSTRAP = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "a"}


def test_max_rows_of_read_limits() -> None:
    assert max_rows_of(ReadMaxRows(7)) == 7
    assert max_rows_of(ReadAllAvailable()) is None


def test_default_read_limit_follows_max_offsets_per_trigger() -> None:
    capped = KafkaStreamReader(parse_options({**BOOTSTRAP, "maxOffsetsPerTrigger": "25"}))
    assert capped.getDefaultReadLimit() == ReadMaxRows(25)
    assert isinstance(KafkaStreamReader(parse_options(BOOTSTRAP)).getDefaultReadLimit(), ReadAllAvailable)
