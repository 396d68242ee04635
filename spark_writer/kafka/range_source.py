"""Kafka as a stream of offset ranges: the Kafka source's batches without their records, for writers whose own tasks
read each range (spark_writer.sink.parquet_writer, ``DataFileTarget.ranges``).

Why: a batch of the Kafka source (kafka.source) is read by one Python worker per range, handed to the JVM as Arrow,
turned into Spark's rows there, and handed as Arrow again to the writer's Python worker, which decodes the values and
writes the files. When nothing between the two runs in Spark (the writer decodes in its tasks and no pass of Spark
looks at the records first), the JVM only passes every record through: the writer's task reading its range itself
does the same work with one Python worker and no copy (bench/results/latest.md, part 3).

The source is the Kafka source in all but its rows. It takes the same options, plans the same batches from the same
offsets (the same caps, data-loss checks and topic lives), and Spark keeps the same offsets in its checkpoint: a
query's checkpoint written by one of the two is resumed by the other. Each Spark task yields one row, the range
``[start_offset, end_offset)`` of one topic-partition, and the writer's task that receives the row reads the range's
committed records with ``range_reader.read_range``, exactly as the Kafka source's task reads it (read_committed, the
same data-loss policy at read time); a retried task or a re-run batch reads the same records again.

What differs for whoever watches the query: Spark's progress counts the rows it saw, ranges here (``numInputRows``);
the offsets a batch covers (``offsets.offsets_covered``) count its records, and any transaction markers and
aborted records among them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import SOURCE_NAME, KafkaSourceOptions
from spark_writer.kafka.range_reader import read_range
from spark_writer.kafka.source import KafkaDataSource, KafkaInputPartition, KafkaStreamReader

# spark.readStream.format(RANGE_SOURCE_NAME): the same options as SOURCE_NAME.
RANGE_SOURCE_NAME: Final = f"{SOURCE_NAME}_ranges"
RANGE_SCHEMA: Final = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("start_offset", LongType()),
        StructField("end_offset", LongType()),
    ]
)
RANGE_ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("start_offset", pa.int64()),
        pa.field("end_offset", pa.int64()),
    ]
)


class KafkaRangeReader(KafkaStreamReader):
    """The Kafka stream reader whose task yields its range instead of the range's records."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition), f"unexpected partition {partition!r}"
        planned = partition.offset_range
        row = {
            "topic": planned.topic,
            "partition": planned.partition,
            "start_offset": planned.start,
            "end_offset": planned.end,
        }
        yield pa.RecordBatch.from_pylist([row], schema=RANGE_ARROW_SCHEMA)


class KafkaRangeSource(KafkaDataSource):
    """``spark.readStream.format("sink_coordinator_kafka_ranges")``: the Kafka source's batches as offset ranges."""

    @classmethod
    def name(cls) -> str:
        return RANGE_SOURCE_NAME

    def schema(self) -> StructType:
        return RANGE_SCHEMA

    def kafka_reader(self, options: KafkaSourceOptions) -> KafkaStreamReader:
        return KafkaRangeReader(options)


def range_records(ranges: Iterable[pa.RecordBatch], options: KafkaSourceOptions) -> Iterator[pa.RecordBatch]:
    """The committed records of every range in these batches (RANGE_ARROW_SCHEMA's rows), as the Kafka source's task
    reads them (kafka.arrow's batches), one range after the other."""
    for batch in ranges:
        for row in batch.to_pylist():
            planned = OffsetRange(row["topic"], row["partition"], row["start_offset"], row["end_offset"])
            yield from read_range(planned, options)


def register_kafka_sources(spark: SparkSession) -> None:
    """Make both Kafka sources (records, ranges) readable by name in this session."""
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(KafkaRangeSource)
