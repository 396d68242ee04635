"""The records a `sink-writer` job writes: the stream Spark reads, and the per-batch decoding of its values (JSON with
a schema given or sampled, a registry format's, or raw Kafka columns), as an upsert or change stream's when it is
one (spark_writer.mutations: with `--source python`, its records read with their keys' texts). Where the tasks can
read their records themselves, the stream is of offset ranges (task_ranges)."""

from __future__ import annotations

from dataclasses import replace

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from spark_writer.arrow_schema import arrow_schema_of
from spark_writer.formats.json_columns import grow
from spark_writer.job_decoding import dead_letter_target, json_values, registry_schemas, tombstone_keys
from spark_writer.job_settings import SPARK_KAFKA_PROVIDER, KafkaSettings, KafkaSource, ParseSettings, RecordFormat
from spark_writer.kafka.options import KafkaSourceOptions, parse_options
from spark_writer.kafka.range_source import RANGE_SOURCE_NAME
from spark_writer.mutations.mutation_parser import MutationParser
from spark_writer.sink.iceberg_sink import DecodesInTasks
from spark_writer.sink.kafka_records import (
    JsonBatchParser,
    SchemaKnownSoFar,
    raw_records,
    sampled_json_schema,
    schema_from_ddl,
)
from spark_writer.sink.registry_records import RegistryBatchParser

log = structlog.get_logger(__name__)


def check_spark_kafka_source(spark: SparkSession) -> None:
    """ValueError saying what to do when Spark's Kafka connector is not on the classpath."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    if not jvm.org.apache.spark.util.Utils.classIsLoadable(SPARK_KAFKA_PROVIDER):
        raise ValueError(
            f"--source spark needs Spark's Kafka connector ({SPARK_KAFKA_PROVIDER}), which is not on the "
            f"classpath: add spark-sql-kafka-0-10_2.13 of Spark {spark.version} and its dependencies "
            "(spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:" + spark.version + "), "
            "or use --source python, which needs no jar"
        )


def registry_parser(kafka: KafkaSettings, parse: ParseSettings, sink: str) -> RegistryBatchParser | MutationParser:
    """The per-batch decoding of Avro, Protobuf or JSON Schema values, the table's schema read from the registry
    (needs no Spark: the job builds it once before Spark starts, to refuse what cannot work)."""
    keyed = parse.mutations.keyed
    parser = RegistryBatchParser(
        registry_schemas(kafka, parse, sink),
        evolve=parse.evolve_schema,
        read_keys=keyed,
        ranges=None if keyed else task_ranges(kafka, parse),
    )
    if not keyed:
        return parser
    keys = tombstone_keys(kafka, parse)
    return MutationParser(parser, parse.mutations, keep_positions=parse.kafka_metadata, registry_keys=keys)


def task_ranges(kafka: KafkaSettings, parse: ParseSettings) -> KafkaSourceOptions | None:
    """The options the writer's tasks read their records with, where the stream is of offset ranges
    (streams_ranges). None: the stream is of records."""
    return parse_options(kafka.source_options()) if streams_ranges(kafka.source, parse) else None


def streams_ranges(source: KafkaSource, parse: ParseSettings) -> bool:
    """Whether the stream can be of offset ranges (kafka.range_source: the records never pass through the JVM):
    read by this project's source, decoded in the tasks with nothing run in Spark before them (a JSON stream that
    learns new fields runs a pass over its records; an upsert or change stream's records are shuffled by key)."""
    if source is not KafkaSource.PYTHON or parse.record_format is RecordFormat.RAW or parse.mutations.keyed:
        return False
    return parse.record_format.registry_format is not None or not parse.evolve_schema


def table_records(
    spark: SparkSession, kafka: KafkaSettings, parse: ParseSettings, sink: str
) -> tuple[DataFrame, DecodesInTasks | None]:
    """The streaming DataFrame to write and, but for raw records, the per-batch parser that turns it into rows."""
    if kafka.source is KafkaSource.SPARK:
        check_spark_kafka_source(spark)
    parser = None if parse.record_format is RecordFormat.RAW else records_parser(spark, kafka, parse, sink)
    source_format = kafka.source_format
    if isinstance(parser, MutationParser) and kafka.source is KafkaSource.PYTHON:
        source_format = parser.key_tagging_source(spark)
    elif isinstance(parser, SchemaKnownSoFar) and parser.ranges is not None:
        source_format = RANGE_SOURCE_NAME
    stream = spark.readStream.format(source_format).options(**kafka.source_options()).load()
    return (raw_records(stream), None) if parser is None else (stream, parser)


def records_parser(spark: SparkSession, kafka: KafkaSettings, parse: ParseSettings, sink: str) -> DecodesInTasks:
    """The per-batch decoding of the records' values, in a registry format or JSON (its schema given or sampled)."""
    if parse.record_format.registry_format is not None:
        return registry_parser(kafka, parse, sink)
    # The sample is read by this project's own consumer, whichever source the stream has.
    sample_options = replace(kafka, source=KafkaSource.PYTHON).source_options()
    if parse.schema_ddl:
        try:
            schema = schema_from_ddl(parse.schema_ddl)
        except ValueError as error:
            raise ValueError(f"--schema: {error}") from None
    else:
        sampled = sampled_json_schema(spark, sample_options, parse.sample_size)
        # Only the sampled fields a column can hold (json_columns); records giving the others a value are bad records.
        schema = grow(StructType([]), sampled.fieldNames(), lambda: sampled, kafka_metadata=parse.kafka_metadata).schema
    log.info("json schema", schema=schema.simpleString(), source="given" if parse.schema_ddl else "sampled")
    if not parse.evolve_schema and not schema.fields:
        raise ValueError("the topics are empty, so no schema could be inferred: pass --schema or --evolve-schema")
    return json_parser(kafka, parse, sink, schema)


def json_parser(
    kafka: KafkaSettings, parse: ParseSettings, sink: str, schema: StructType
) -> JsonBatchParser | MutationParser:
    """The per-batch decoding of JSON values whose rows have the fields of `schema` (given or sampled), as an upsert
    or change stream's when it is one (needs no Spark session)."""
    mutations = parse.mutations
    if not mutations.keyed:
        return JsonBatchParser(
            schema,
            evolve=parse.evolve_schema,
            kafka_metadata=parse.kafka_metadata,
            time_zone=parse.json_time_zone,
            on_bad_record=parse.on_bad_record,
            dead_letters=dead_letter_target(kafka, parse, sink),
            ranges=task_ranges(kafka, parse),
        )
    inner = JsonBatchParser(
        from_arrow_schema(json_values(parse, arrow_schema_of(schema))),
        evolve=parse.evolve_schema and mutations.envelope is None,  # new fields of a row are under its envelope
        time_zone=parse.json_time_zone,
        on_bad_record=parse.on_bad_record,
        dead_letters=dead_letter_target(kafka, parse, sink),
        read_keys=True,
    )
    return MutationParser(inner, mutations, keep_positions=parse.kafka_metadata)
