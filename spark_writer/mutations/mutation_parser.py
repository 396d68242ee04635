"""The ``DecodesInTasks`` transform of an upsert or change stream (``write_to_iceberg``'s): the format's own parser
(its schema, its registry versions) with its decoding turned into the stream's (decoding.mutation_decoding), and the
Kafka source that tags the stream's records with their keys under that decoding (keyed_source)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from spark_writer.formats.record_decoding import RecordDecoding
from spark_writer.formats.registry_decoding import RegistryValues
from spark_writer.mutations.decoding import MutationDecoder, mutation_decoding
from spark_writer.mutations.keyed_source import key_tagging_source
from spark_writer.mutations.modes import Mutations
from spark_writer.mutations.tasks import SHUFFLE_KEY
from spark_writer.sink.kafka_records import BatchInput, JsonBatchParser
from spark_writer.sink.registry_records import RegistryBatchParser


class MutationParser:
    """`inner`, the format's parser (built with read_keys, without kafka metadata), with its values (and the message
    keys of tombstones) decoded as changes."""

    def __init__(
        self,
        inner: JsonBatchParser | RegistryBatchParser,
        mutations: Mutations,
        *,
        keep_positions: bool = False,
        registry_keys: RegistryValues | None = None,
    ) -> None:
        self._inner = inner
        self._mutations = mutations
        self._keep_positions = keep_positions
        self._registry_keys = registry_keys
        self._built: tuple[RecordDecoding, RecordDecoding] | None = None
        self._tagged_by: MutationDecoder | None = None  # the decoder of the tagging source's stream
        self.table_schema  # noqa: B018 (the key checked against the schema now: ValueError, before Spark runs a batch)

    @property
    def mutations(self) -> Mutations:
        return self._mutations

    @property
    def decoding(self) -> RecordDecoding:
        """How the tasks decode records with the inner parser's schema as it stands (built again when it changes)."""
        inner = self._inner.decoding
        if self._built is None or self._built[0] is not inner:
            built = mutation_decoding(
                inner, self._mutations, keep_positions=self._keep_positions, registry_keys=self._registry_keys
            )
            self._built = (inner, built)
        return self._built[1]

    @property
    def table_schema(self) -> pa.Schema:
        return self._decoder.table_schema

    def key_tagging_source(self, spark: SparkSession) -> str:
        """Register the Kafka source that reads each record with its key's text under the decoding as it stands
        (keyed_source); the format name to read the stream with."""
        decoder = self._decoder
        source = key_tagging_source(decoder)
        spark.dataSource.register(source)
        self._tagged_by = decoder
        return source.name()

    def prepare(self, batch: DataFrame) -> BatchInput:
        tags = (SHUFFLE_KEY,) if SHUFFLE_KEY in batch.columns else ()
        prepared = self._inner.prepare(batch, tags)
        frame = prepared.frame
        # After the inner parser read the batch's schema: a decoding built again since the stream started may
        # decode a record otherwise than the tags' one did, and the tasks then tag the batch themselves.
        if tags and self._decoder is not self._tagged_by:
            frame = frame.drop(SHUFFLE_KEY)
        return BatchInput(frame, self.table_schema, self.decoding)

    @property
    def _decoder(self) -> MutationDecoder:
        decoder = self.decoding.decoder
        assert isinstance(decoder, MutationDecoder)
        return decoder

    def batch_properties(self, bad_records: int) -> dict[str, str]:
        return self._inner.batch_properties(bad_records)
