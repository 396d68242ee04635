"""From Kafka rows to table rows: raw columns, or JSON values parsed with a schema that may grow.

Three ways to get the schema of JSON values:

* given as a DDL string ("order_id BIGINT, amount DOUBLE, ...");
* inferred from a sample of the newest records of the topics when the job starts;
* either of those, then grown batch by batch (``JsonBatchParser``): a batch
  whose records have top-level fields the schema lacks gets those fields, with
  types inferred from that batch, and the coordinator adds the columns to the
  table (PreCommit with evolve_schema). Fields already known keep their type.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import structlog
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as sql
from pyspark.sql.types import StringType, StructField, StructType

from spark_writer.dead_letters import DEAD_LETTER_COLUMNS, SENT_DDL, DeadLetterSender, DeadLetterTarget
from spark_writer.kafka_source import KafkaMetadata, OffsetRange, parse_options, read_range

log = structlog.get_logger(__name__)


class BadRecordPolicy(StrEnum):
    """What happens to a record that does not fit the JSON schema."""

    FAIL = "fail"  # the batch fails, naming topic, partition, offset and why
    NULL = "null"  # written with null columns, counted
    DEAD_LETTER = "dead-letter"  # sent to a dead-letter topic instead of the table, counted


# The epoch property (PreCommit) with the number of records of the batch that did not fit the schema.
BAD_RECORDS_PROPERTY: Final = "sink-coordinator.bad-records"
BAD_RECORDS_METRIC: Final = "bad_records"
ON_BAD_RECORD_HINT: Final = (
    "Fix the record or the schema, or run with --on-bad-record null (written as nulls, counted) "
    "or --on-bad-record dead-letter --dead-letter-topic T"
)
# Columns of the parse that are not the table's: from_json's corrupt record, the reason, the source's columns.
CORRUPT_COLUMN: Final = "_corrupt_record"
REASON_COLUMN: Final = "_bad_record_reason"
SOURCE_PREFIX: Final = "_kafka_"

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


def bad_record_reason(text: Column, record: Column, schema: StructType) -> Column:
    """Why a Kafka value does not fit `schema` (null when it does): the record is then not what the table gets.

    `record` is from_json's result with the corrupt-record column, which Spark fills
    whenever any value cannot be converted (wrong type, bad timestamp, not JSON, not an object).
    """
    misfits = [
        sql.when(
            record.getField(name).isNull() & sql.get_json_object(text, _json_path(name)).isNotNull(),
            sql.lit(f"{name} ({schema[name].dataType.simpleString()})"),
        )
        for name in schema.fieldNames()
    ]
    return (
        sql.when(text.isNull(), sql.lit("tombstone: the record has no value"))
        .when(record.getField(CORRUPT_COLUMN).isNull(), sql.lit(None).cast("string"))
        .when(sql.get_json_object(text, "$").isNull(), sql.lit("not valid JSON"))
        .when(~sql.ltrim(text).startswith("{"), sql.lit("a JSON value that is not an object"))
        .otherwise(
            sql.concat(
                sql.lit("fields whose value does not fit the schema: "),
                sql.coalesce(sql.nullif(sql.concat_ws(", ", *misfits), sql.lit("")), sql.lit("a nested field")),
            )
        )
    )


def _json_path(name: str) -> str:
    return "$['" + name.replace("\\", "\\\\").replace("'", "\\'") + "']"


@dataclass(frozen=True)
class JsonColumns:
    """The expressions that parse JSON values with one schema: built once, applied to every micro-batch.

    Each expression costs calls to the JVM to build (for the demo's eight fields about 0.4 s a batch when
    they were built per batch); they name columns rather than hold a DataFrame, so the same ones serve
    every batch of a stream until the schema grows.
    """

    record: Column  # from_json's struct, with the corrupt-record column
    parsed: tuple[Column, ...]  # what `parsed` selects from the Kafka columns and `record`
    table: tuple[str, ...]  # what the table gets: the schema's fields and the kafka_* columns asked for
    fits: Column  # true for a record that fits the schema
    fits_or_fails: Column  # true for a record that fits; raises for one that does not, naming it

    @classmethod
    def of(cls, schema: StructType, *, kafka_metadata: bool = False, time_zone: str = DEFAULT_JSON_TIME_ZONE) -> Self:
        if CORRUPT_COLUMN in schema.fieldNames():
            raise ValueError(f"the JSON schema may not have a field named {CORRUPT_COLUMN}")
        options = {"timeZone": check_time_zone(time_zone), "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        with_corrupt = StructType([*schema.fields, StructField(CORRUPT_COLUMN, StringType())])
        metadata = [name for name in KAFKA_METADATA_COLUMNS if kafka_metadata]
        reason = sql.col(REASON_COLUMN)
        failure = sql.concat(
            sql.lit("a Kafka record does not fit the JSON schema: topic "),
            sql.col(f"{SOURCE_PREFIX}topic"),
            sql.lit(" partition "),
            sql.col(f"{SOURCE_PREFIX}partition").cast("string"),
            sql.lit(" offset "),
            sql.col(f"{SOURCE_PREFIX}offset").cast("string"),
            sql.lit(": "),
            reason,
            sql.lit(f". {ON_BAD_RECORD_HINT}"),
        )
        return cls(
            record=sql.from_json(_json_text(), with_corrupt, options).alias("record"),
            parsed=(
                *[sql.col("record").getField(name).alias(name) for name in schema.fieldNames()],
                *[sql.col(KAFKA_METADATA_COLUMNS[name]).alias(name) for name in metadata],
                *[sql.col(name).alias(f"{SOURCE_PREFIX}{name}") for name in DEAD_LETTER_COLUMNS],
                bad_record_reason(_json_text(), sql.col("record"), schema).alias(REASON_COLUMN),
            ),
            table=(*schema.fieldNames(), *metadata),
            fits=reason.isNull(),
            fits_or_fails=sql.when(reason.isNull(), sql.lit(True)).otherwise(sql.raise_error(failure)),
        )

    def parse(self, kafka: DataFrame) -> DataFrame:
        """The columns of the schema, the kafka_* columns if asked, the Kafka columns a dead letter needs, and the
        reason (REASON_COLUMN) a record does not fit, null when it does."""
        return kafka.select(sql.col("*"), self.record).select(*self.parsed)

    def table_columns(self, parsed: DataFrame) -> DataFrame:
        """What the table gets of `parse`'s columns: without the Kafka columns and the reason."""
        return parsed.select(*self.table)

    def fail_on_bad_records(self, parsed: DataFrame) -> DataFrame:
        """`parse`'s rows, whose first bad record fails the task, naming where it is and why."""
        return parsed.where(self.fits_or_fails)


def json_records(
    kafka: DataFrame,
    schema: StructType,
    *,
    kafka_metadata: bool = False,
    time_zone: str = DEFAULT_JSON_TIME_ZONE,
    on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL,
) -> DataFrame:
    """The JSON object in each value as columns of `schema` (missing fields are null); works on streams too.

    Timestamps written without a zone or offset are read in `time_zone`, whatever the
    session's time zone is (a spark-submit session has the JVM's default zone). A
    record that does not fit the schema fails the task (FAIL) or becomes nulls (NULL,
    not counted here: ``JsonBatchParser`` counts); dead letters need ``JsonBatchParser``.
    """
    if on_bad_record is BadRecordPolicy.DEAD_LETTER:
        raise ValueError("dead letters are sent per batch: use JsonBatchParser as the transform of write_to_iceberg")
    columns = JsonColumns.of(schema, kafka_metadata=kafka_metadata, time_zone=time_zone)
    parsed = columns.parse(kafka)
    rows = columns.fail_on_bad_records(parsed) if on_bad_record is BadRecordPolicy.FAIL else parsed
    return columns.table_columns(rows)


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


class JsonBatchParser:
    """A per-batch transform: parse JSON values with the schema known so far, deal with the records that do not fit.

    With `evolve`, new top-level fields are detected with a cheap SQL pass over the
    batch (the keys of every object); only when there are some does Spark infer their
    types, from the batch's records. The schema lives in the driver and starts again
    from the initial one when the job restarts; a field re-inferred with another type
    than the table's makes the coordinator refuse the batch, with a message.

    Records that do not fit the schema (a value of another type, a bad timestamp,
    text that is not JSON, a JSON value that is not an object, a tombstone) fail the
    batch (FAIL), are written with null columns (NULL) or go to a dead-letter topic
    instead of the table (DEAD_LETTER). Their count is logged and given to the
    writer as the epoch property ``sink-coordinator.bad-records``.
    """

    def __init__(
        self,
        schema: StructType,
        *,
        evolve: bool = True,
        kafka_metadata: bool = False,
        time_zone: str = DEFAULT_JSON_TIME_ZONE,
        on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL,
        dead_letters: DeadLetterTarget | None = None,
    ) -> None:
        if (on_bad_record is BadRecordPolicy.DEAD_LETTER) != (dead_letters is not None):
            raise ValueError("a dead-letter topic is needed with on_bad_record=dead-letter, and only then")
        self.schema = schema
        self._evolve = evolve
        self._kafka_metadata = kafka_metadata
        self._time_zone = check_time_zone(time_zone)
        self._policy = on_bad_record
        self._dead_letters = dead_letters
        self._observation: Observation | None = None
        self._dead_lettered = 0
        self._cached: DataFrame | None = None
        self._columns_of: tuple[StructType, JsonColumns] | None = None

    @property
    def _columns(self) -> JsonColumns:
        """The parse expressions of the current schema, built again only when the schema grew."""
        if self._columns_of is None or self._columns_of[0] != self.schema:
            columns = JsonColumns.of(self.schema, kafka_metadata=self._kafka_metadata, time_zone=self._time_zone)
            self._columns_of = (self.schema, columns)
        return self._columns_of[1]

    def __call__(self, batch: DataFrame) -> DataFrame:
        self._release_cache()  # a batch that failed before its properties were asked for
        if self._evolve or self._dead_letters is not None:
            # Two passes over the batch (the new fields or the dead letters, then the rows): read Kafka once.
            batch = self._cached = batch.persist()
        if self._evolve:
            self._learn_new_fields(batch)
        columns = self._columns
        parsed = columns.parse(batch)
        self._observation = None
        if self._dead_letters is not None:
            self._dead_lettered = self._send_dead_letters(parsed, self._dead_letters)
            return columns.table_columns(parsed.where(columns.fits))
        self._observation = Observation(f"bad_records_{uuid.uuid4().hex}")
        observed = parsed.observe(self._observation, sql.count(sql.col(REASON_COLUMN)).alias(BAD_RECORDS_METRIC))
        rows = columns.fail_on_bad_records(observed) if self._policy is BadRecordPolicy.FAIL else observed
        return columns.table_columns(rows)

    def batch_properties(self) -> dict[str, str]:
        """After the batch's rows were written: the epoch properties (the count of records that did not fit)."""
        self._release_cache()
        if self._observation is not None:
            bad = int(self._observation.get.get(BAD_RECORDS_METRIC, 0))
        else:
            bad = self._dead_lettered
        if bad:
            log.warning("records that do not fit the JSON schema", bad_records=bad, on_bad_record=self._policy.value)
        return {BAD_RECORDS_PROPERTY: str(bad)}

    def _release_cache(self) -> None:
        if self._cached is not None:
            self._cached.unpersist()
            self._cached = None

    def _send_dead_letters(self, parsed: DataFrame, target: DeadLetterTarget) -> int:
        bad = parsed.where(~self._columns.fits).select(
            *[sql.col(f"{SOURCE_PREFIX}{name}").alias(name) for name in DEAD_LETTER_COLUMNS], REASON_COLUMN
        )
        sent = bad.mapInArrow(DeadLetterSender(target, REASON_COLUMN), SENT_DDL).collect()
        return sum(int(row.sent) for row in sent)

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
