"""From Kafka rows to table rows: raw columns, or JSON values parsed with a schema that may grow.

Three ways to get the schema of JSON values:

* given as a DDL string ("order_id BIGINT, amount DOUBLE, ...");
* inferred from a sample of the newest records of the topics when the job starts;
* either of those, then grown batch by batch (``JsonBatchParser``): a batch
  whose records have top-level fields the schema lacks gets those fields, with
  types inferred from that batch, and the coordinator adds the columns to the
  table (PreCommit with evolve_schema). Fields already known keep their type.

The values are decoded on the executors, in Arrow (``spark_writer.formats.json_decoding``,
which says why and how): by the writer's own tasks for ``JsonBatchParser``, so that
a batch's records cross from Python to the JVM and back only as bytes, and by a
``mapInArrow`` step for ``json_records``.

What becomes of a record that does not fit (``spark_writer.formats.record_decoding``:
fail, null, dead-letter) is the same for every decoder, JSON or the registry formats'
(``spark_writer.sink.registry_records``), which give the same ``DecodedBatch``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import structlog
from pyspark.errors import ParseException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sql
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from spark_writer.arrow_schema import arrow_schema_of
from spark_writer.formats import decoded_batch
from spark_writer.formats.dead_letters import DeadLetterTarget
from spark_writer.formats.json_columns import grow
from spark_writer.formats.json_decoding import DEFAULT_JSON_TIME_ZONE, check_time_zone, json_decoder
from spark_writer.formats.record_decoding import (
    RAW_COLUMNS,
    BadRecordPolicy,
    RecordDecoding,
    bad_record_properties,
)
from spark_writer.kafka.metadata import KafkaMetadata
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import KafkaSourceOptions, parse_options
from spark_writer.kafka.range_reader import read_range
from spark_writer.spark_errors import spark_message

log = structlog.get_logger(__name__)

# The Spark types of the kafka_* columns, from their Arrow types (spark_writer.formats.decoded_batch).
KAFKA_METADATA_FIELDS: Final = tuple(from_arrow_schema(pa.schema(decoded_batch.KAFKA_METADATA_FIELDS)).fields)


def schema_from_ddl(ddl: str) -> StructType:
    """A record schema from a DDL string such as "order_id BIGINT, amount DOUBLE"; ValueError saying what is wrong."""
    try:
        schema = StructType.fromDDL(ddl)
    except ParseException as error:
        raise ValueError(
            f"schema {ddl!r} is not Spark DDL ('name TYPE, name TYPE, ...'): {spark_message(error)}"
        ) from None
    if not isinstance(schema, StructType):
        raise ValueError(f"schema {ddl!r} is not a list of fields: write it as 'name TYPE, name TYPE, ...'")
    return schema


def raw_records(kafka: DataFrame) -> DataFrame:
    """The Kafka columns as they are: key and value as bytes."""
    return kafka.select(*RAW_COLUMNS)


def _json_text() -> Column:
    return sql.col("value").cast("string")


def table_schema(schema: StructType, *, kafka_metadata: bool = False) -> StructType:
    """The Spark schema of what `json_decoder` gives: the JSON fields, then the kafka_* columns if asked."""
    return StructType([*schema.fields, *(KAFKA_METADATA_FIELDS if kafka_metadata else ())])


@dataclass(frozen=True)
class DecodedRecords:
    """A mapInArrow function: Kafka records in, table rows out (`json_records`)."""

    decoding: RecordDecoding

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = self.decoding.start()
        for batch in batches:
            yield from task.rows(batch).to_batches()
        task.finish()


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
    decoder = json_decoder(arrow_schema_of(schema), kafka_metadata=kafka_metadata, time_zone=time_zone)
    decoding = RecordDecoding(decoder, on_bad_record)
    return kafka.mapInArrow(DecodedRecords(decoding), table_schema(schema, kafka_metadata=kafka_metadata))


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


def task_columns(*, key: bool, dead_letters: bool) -> list[str]:
    """The Kafka columns the writer's tasks need (the timestamps tell how far in time the batch went): every column
    they do not need is converted twice for nothing."""
    needed = ["value", "topic", "partition", "offset", "timestamp"]
    if key or dead_letters:
        needed.append("key")
    return needed + (["headers"] if dead_letters else [])


@dataclass(frozen=True)
class BatchInput:
    """What the writer's tasks read for one batch and how they turn it into table rows."""

    frame: DataFrame  # the batch's Kafka records, or its offset ranges (kafka.range_source) with `ranges`
    schema: pa.Schema  # the table rows' Arrow schema
    decoding: RecordDecoding
    ranges: KafkaSourceOptions | None = None  # the options the tasks read the ranges' records with


class SchemaKnownSoFar:
    """What the parsers whose tasks decode (JsonBatchParser, registry_records.RegistryBatchParser) share: the
    decoding of the schema known so far, which each replaces as its schema grows, and the table rows' schema it
    gives; and whether the batches they are given hold the records, or the offset ranges the tasks read them from
    (`ranges`: the stream is kafka.range_source's)."""

    _decoding: RecordDecoding
    _ranges: KafkaSourceOptions | None = None

    @property
    def decoding(self) -> RecordDecoding:
        """How the tasks decode records with the schema known so far."""
        return self._decoding

    @property
    def table_schema(self) -> pa.Schema:
        """The Arrow schema of the table rows with the schema known so far."""
        return self._decoding.decoder.output_schema

    @property
    def ranges(self) -> KafkaSourceOptions | None:
        """The options the tasks read their records with when the stream is of offset ranges; None: of records."""
        return self._ranges

    def _task_input(self, batch: DataFrame, columns: Sequence[str], keep: Sequence[str]) -> BatchInput:
        """The batch as the tasks read it: the Kafka `columns` of its records, and `keep`; or its ranges, whose
        records the tasks read whole."""
        if self._ranges is None:
            return BatchInput(batch.select(*columns, *keep), self.table_schema, self._decoding)
        if keep:
            raise ValueError(f"a stream of offset ranges has no columns {list(keep)} to keep")
        return BatchInput(batch, self.table_schema, self._decoding, self._ranges)


class JsonBatchParser(SchemaKnownSoFar):
    """Parses each batch's JSON values with the schema known so far, in the writer's tasks.

    The writer hands every micro-batch to `prepare`, which gives the tasks the
    batch's Kafka records and a `RecordDecoding` for the schema known so far; the
    tasks decode, write and count, and `batch_properties` turns the count into the
    epoch's properties.

    With `evolve`, new top-level fields are detected with a cheap SQL pass over the
    batch (the keys of every object; the batch is cached, so Kafka is read once);
    only when there are some does Spark infer their types, from the batch's records.
    The schema lives in the driver and starts again from the initial one when the job
    restarts; a field re-inferred with another type than the table's makes the
    coordinator refuse the batch, with a message. Without `evolve` nothing runs in
    Spark before the tasks, and the stream may be of offset ranges (`ranges`: the
    options of kafka.range_source's stream), whose records the tasks read themselves.

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
        read_keys: bool = False,
        ranges: KafkaSourceOptions | None = None,
    ) -> None:
        if evolve and ranges is not None:
            raise ValueError(
                "learning a batch's new JSON fields (evolve) reads its records in Spark: its stream cannot be of "
                "offset ranges"
            )
        self._ranges = ranges
        self.schema = schema
        self._read_keys = read_keys  # the tasks get the Kafka message keys too (an upsert stream's tombstones)
        self._evolve = evolve
        self._kafka_metadata = kafka_metadata
        self._time_zone = check_time_zone(time_zone)
        self._policy = on_bad_record
        self._dead_letters = dead_letters
        self._cached: DataFrame | None = None
        self._refused: Mapping[str, str] = {}
        self._decoding = self._decoding_of(schema)

    def prepare(self, batch: DataFrame, keep: Sequence[str] = ()) -> BatchInput:
        """The batch's input to the writer's tasks, after learning its new fields (with `evolve`); `keep`: columns of
        the batch the tasks read besides the Kafka ones."""
        self._release_cache()  # a batch that failed before its properties were asked for
        if self._evolve:
            # Two passes over the batch (the new fields, then the rows): read Kafka once.
            batch = self._cached = batch.persist()
            self._learn_new_fields(batch)
        return self._task_input(batch, self._task_columns, keep)

    def batch_properties(self, bad_records: int) -> dict[str, str]:
        """After the batch's rows were written: the epoch properties (the count of records that did not fit)."""
        self._release_cache()
        return bad_record_properties(bad_records, self._policy, "the JSON schema")

    @property
    def _task_columns(self) -> list[str]:
        return task_columns(key=self._read_keys, dead_letters=self._dead_letters is not None)

    def _decoding_of(self, schema: StructType) -> RecordDecoding:
        decoder = json_decoder(
            arrow_schema_of(schema),
            kafka_metadata=self._kafka_metadata,
            time_zone=self._time_zone,
            refused=self._refused,
        )
        return RecordDecoding(decoder, self._policy, self._dead_letters)

    def _release_cache(self) -> None:
        if self._cached is not None:
            self._cached.unpersist()
            self._cached = None

    def _learn_new_fields(self, batch: DataFrame) -> None:
        """The batch's new top-level fields become columns where the table can take them (json_columns); a record
        giving a value to one it cannot take is a bad record of this batch."""
        texts = batch.select(_json_text().alias("json"))
        keys = texts.select(sql.explode(sql.json_object_keys("json")).alias("key")).distinct().collect()
        growth = grow(
            self.schema,
            (row.key for row in keys),
            lambda: infer_json_schema(batch.sparkSession, texts),
            kafka_metadata=self._kafka_metadata,
        )
        if growth.refused:
            log.warning("json fields the table cannot take", refused=dict(growth.refused))
        if growth.schema != self.schema or growth.refused != self._refused:
            self.schema, self._refused = growth.schema, growth.refused
            self._decoding = self._decoding_of(self.schema)
