"""Avro, Protobuf and JSON Schema topics into table rows in the writer's tasks: ``RegistryBatchParser``, the
``DecodesInTasks`` transform of ``write_to_iceberg`` for topics written with a schema registry. How the table's schema
follows the registry, and how records are decoded, is spark_writer.formats.registry_subjects' (its rule)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame

from spark_writer.formats.record_decoding import bad_record_properties
from spark_writer.formats.registry_subjects import RegistrySchemas
from spark_writer.kafka.options import KafkaSourceOptions
from spark_writer.sink.kafka_records import BatchInput, SchemaKnownSoFar, task_columns


class RegistryBatchParser(SchemaKnownSoFar):
    """Decodes each batch's values (and keys) with their registered schemas, in the writer's tasks.

    `prepare` reads the subjects' latest versions (with `evolve`) and gives the tasks the batch's Kafka records and a
    `RecordDecoding` for the table's schema; `batch_properties` counts the records that did not fit, as
    ``kafka_records.JsonBatchParser`` does.
    """

    def __init__(
        self,
        schemas: RegistrySchemas,
        *,
        evolve: bool = True,
        read_keys: bool = False,
        ranges: KafkaSourceOptions | None = None,
    ) -> None:
        self._ranges = ranges  # the stream is of offset ranges (kafka.range_source): the tasks read their records
        self._read_keys = read_keys  # the tasks get the Kafka message keys even without a key subject (tombstones)
        self._evolve = evolve
        self._schemas = schemas
        self._decoding = schemas.decoding

    def prepare(self, batch: DataFrame, keep: Sequence[str] = ()) -> BatchInput:
        """The batch's input to the writer's tasks, with the subjects' latest versions (with `evolve`); `keep`:
        columns of the batch the tasks read besides the Kafka ones."""
        if self._evolve:
            # Both subjects are read every batch; the decoding is built again only for a new version.
            self._schemas.refresh()
            self._decoding = self._schemas.decoding
        columns = task_columns(
            key=self._schemas.decodes_keys or self._read_keys, dead_letters=self._decoding.dead_letters is not None
        )
        return self._task_input(batch, columns, keep)

    def batch_properties(self, bad_records: int) -> dict[str, str]:
        return bad_record_properties(bad_records, self._schemas.policy, self._schemas.value_subject.description)
