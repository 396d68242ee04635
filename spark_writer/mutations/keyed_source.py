"""The Kafka source of an upsert or change stream read with `--source python`: each record read with its key's text
(tasks.SHUFFLE_KEY), which the batch's records are shuffled by (tasks.keyed_tasks).

The source already runs Python over each record batch it reads: it tags the records there, with the decoder the
stream was started with (MutationDecoder.key_texts, the very function stage 2 decodes with), so that stage 1 of a
batch is the read and the shuffle, with no Arrow UDF's round trip from the JVM to Python and back only to compute
the key. The source is a subclass of kafka.source.KafkaDataSource registered under a name of its own for each
stream, holding its decoder (cloudpickle ships a class made at run time with its attributes): its rows are the Kafka
source's, the key's text last. The tags are the decoder's: mutation_parser.MutationParser keeps them for a batch only
while its decoding is still that decoder (a schema that evolved gives the batch a new one, and keyed_tasks then tags
the batch in stage 1, as it does a batch of Spark's Kafka source).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import ClassVar

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from spark_writer.kafka.options import SOURCE_NAME, KafkaSourceOptions
from spark_writer.kafka.source import KAFKA_SCHEMA, KafkaDataSource, KafkaStreamReader
from spark_writer.mutations.decoding import MutationDecoder
from spark_writer.mutations.tasks import SHUFFLE_KEY

SHUFFLE_KEY_FIELD = pa.field(SHUFFLE_KEY, pa.string())
KEYED_KAFKA_SCHEMA = StructType([*KAFKA_SCHEMA.fields, StructField(SHUFFLE_KEY, StringType())])


class KeyTaggingReader(KafkaStreamReader):
    """The Kafka stream reader, each batch it reads with its records' key texts as its last column."""

    def __init__(self, options: KafkaSourceOptions, decoder: MutationDecoder) -> None:
        super().__init__(options)
        self._decoder = decoder

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for batch in super().read(partition):
            yield tagged(batch, self._decoder)


def tagged(batch: pa.RecordBatch, decoder: MutationDecoder) -> pa.RecordBatch:
    """A batch of Kafka records with each record's key text (null for one that does not fit)."""
    texts = decoder.key_texts(batch.column("value"), batch.column("key"))
    return batch.append_column(SHUFFLE_KEY_FIELD, texts.cast(pa.string()))


class KeyTaggingSource(KafkaDataSource):
    """The Kafka source whose rows carry their key's text; `key_tagging_source` makes the subclass of a stream,
    holding its decoder and name."""

    decoder: ClassVar[MutationDecoder]
    source_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    def schema(self) -> StructType:
        return KEYED_KAFKA_SCHEMA

    def kafka_reader(self, options: KafkaSourceOptions) -> KafkaStreamReader:
        return KeyTaggingReader(options, self.decoder)


def key_tagging_source(decoder: MutationDecoder) -> type[KeyTaggingSource]:
    """A Kafka source tagging its records with `decoder`'s key texts, under a name of its own (one per call: its
    registration never replaces the source of a stream already started)."""
    token = uuid.uuid4().hex
    name = f"{SOURCE_NAME}_keyed_{token}"
    return type(f"KeyTaggingSource_{token}", (KeyTaggingSource,), {"decoder": decoder, "source_name": name})
