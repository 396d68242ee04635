"""The ``DecodesInTasks`` transform of an upsert or change stream (``write_to_iceberg``'s): the format's own parser
(its schema, its registry versions) with its decoding turned into the stream's (decoding.mutation_decoding)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame

from spark_writer.formats.record_decoding import RecordDecoding
from spark_writer.formats.registry_decoding import RegistryValues
from spark_writer.mutations.decoding import MutationDecoder, mutation_decoding
from spark_writer.mutations.modes import Mutations
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
        decoder = self.decoding.decoder
        assert isinstance(decoder, MutationDecoder)
        return decoder.table_schema

    def prepare(self, batch: DataFrame) -> BatchInput:
        prepared = self._inner.prepare(batch)
        return BatchInput(prepared.frame, self.table_schema, self.decoding)

    def batch_properties(self, bad_records: int) -> dict[str, str]:
        return self._inner.batch_properties(bad_records)
