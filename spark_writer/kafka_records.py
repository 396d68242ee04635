"""From Kafka rows to table rows: raw columns, or JSON values parsed with a schema that may grow.

Three ways to get the schema of JSON values:

* given as a DDL string ("order_id BIGINT, amount DOUBLE, ...");
* inferred from a sample of the newest records of the topics when the job starts;
* either of those, then grown batch by batch (``EvolvingJsonParser``): a batch
  whose records have top-level fields the schema lacks gets those fields, with
  types inferred from that batch, and the coordinator adds the columns to the
  table (PreCommit with evolve_schema). Fields already known keep their type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sql
from pyspark.sql.types import StructType

from spark_writer.kafka_source import KafkaMetadata, OffsetRange, parse_options, read_range

# The zone of JSON timestamps that carry none (the same in every session: local, spark-submit, ...).
DEFAULT_JSON_TIME_ZONE: Final = "UTC"
RAW_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp")
# Optional columns telling where each JSON record came from (table column -> Kafka source column).
KAFKA_METADATA_COLUMNS: Final = {
    "kafka_topic": "topic",
    "kafka_partition": "partition",
    "kafka_offset": "offset",
    "kafka_timestamp": "timestamp",
}


def schema_from_ddl(ddl: str) -> StructType:
    """A record schema from a DDL string such as "order_id BIGINT, amount DOUBLE"."""
    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType):
        raise ValueError(f"schema {ddl!r} is not a list of fields: write it as 'name TYPE, name TYPE, ...'")
    return schema


def raw_records(kafka: DataFrame) -> DataFrame:
    """The Kafka columns as they are: key and value as bytes."""
    return kafka.select(*RAW_COLUMNS)


def _json_text() -> Column:
    return sql.col("value").cast("string")


def check_time_zone(name: str) -> str:
    """A time zone name Spark and Python both know ("UTC", "Europe/Paris"); ValueError otherwise."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}: use a name like UTC or Europe/Paris") from None
    return name


def json_records(
    kafka: DataFrame, schema: StructType, *, kafka_metadata: bool = False, time_zone: str = DEFAULT_JSON_TIME_ZONE
) -> DataFrame:
    """The JSON object in each value as columns of `schema` (missing or unparsable fields are null).

    Timestamps written without a zone or offset are read in `time_zone`, whatever the
    session's time zone is (a spark-submit session has the JVM's default zone).
    """
    metadata = list(KAFKA_METADATA_COLUMNS) if kafka_metadata else []
    parsed = kafka.select(
        sql.from_json(_json_text(), schema, {"timeZone": check_time_zone(time_zone)}).alias("record"),
        *[sql.col(KAFKA_METADATA_COLUMNS[name]).alias(name) for name in metadata],
    )
    return parsed.select(*[sql.col("record").getField(name).alias(name) for name in schema.fieldNames()], *metadata)


def infer_json_schema(spark: SparkSession, texts: DataFrame) -> StructType:
    """Spark's JSON schema inference over a one-column DataFrame of JSON strings."""
    return spark.read.json(texts.rdd.map(lambda row: str(row[0]))).schema


def sample_values(kafka_options: Mapping[str, str], sample_size: int) -> list[str]:
    """Up to `sample_size` of the newest values of the topics, spread over their partitions (UTF-8 text)."""
    options = parse_options(kafka_options)
    metadata = KafkaMetadata(options)
    keys = metadata.partitions(options.topics)
    if not keys:
        return []
    earliest, latest = metadata.earliest(keys), metadata.latest(keys)
    per_partition = max(1, sample_size // len(keys))
    values: list[str] = []
    for key in keys:
        start = max(earliest[key], latest[key] - per_partition)
        for batch in read_range(OffsetRange(key.topic, key.partition, start, latest[key]), options):
            column: pa.Array = batch.column("value")
            values.extend(value.decode("utf-8", errors="replace") for value in column.to_pylist() if value)
    return values[:sample_size]


def sampled_json_schema(spark: SparkSession, kafka_options: Mapping[str, str], sample_size: int) -> StructType:
    """The JSON schema of a sample of the newest records; empty when the topics are empty."""
    values = sample_values(kafka_options, sample_size)
    if not values:
        return StructType([])
    return infer_json_schema(spark, spark.createDataFrame([(value,) for value in values], "json string"))


class EvolvingJsonParser:
    """A per-batch transform: parse JSON values with the schema known so far plus the new fields of the batch.

    New top-level fields are detected with a cheap SQL pass over the batch (the
    keys of every object); only when there are some does Spark infer their types,
    from the batch's records. The schema lives in the driver and starts again
    from the initial one when the job restarts; a field re-inferred with another
    type than the table's makes the coordinator refuse the batch, with a message.
    """

    def __init__(
        self, schema: StructType, *, kafka_metadata: bool = False, time_zone: str = DEFAULT_JSON_TIME_ZONE
    ) -> None:
        self.schema = schema
        self._kafka_metadata = kafka_metadata
        self._time_zone = check_time_zone(time_zone)

    def __call__(self, batch: DataFrame) -> DataFrame:
        self._learn_new_fields(batch)
        return json_records(batch, self.schema, kafka_metadata=self._kafka_metadata, time_zone=self._time_zone)

    def _learn_new_fields(self, batch: DataFrame) -> None:
        texts = batch.select(_json_text().alias("json"))
        keys = texts.select(sql.explode(sql.json_object_keys("json")).alias("key")).distinct().collect()
        known = set(self.schema.fieldNames())
        new = sorted({row.key for row in keys} - known)
        if not new:
            return
        inferred = infer_json_schema(batch.sparkSession, texts)
        for name in new:
            self.schema = self.schema.add(inferred[name])
