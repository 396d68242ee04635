"""Kafka values (and keys) written with a schema registry, decoded into table rows in the writer's tasks.

A record's value is in Confluent's wire format (``wire_format``): the schema id it
was written with, then the payload. ``RegistryValues`` reads the headers of a whole
batch at once, fetches each distinct writer schema once per process
(``schema_registry.parsed_schema``), and hands the payloads to the format's
``PayloadDecoder`` (``avro_decoding``, ``protobuf_decoding``,
``json_schema_decoding``), which turns them into one Arrow array of the table's
type. ``RegistryDecoder`` makes the table's columns of it (a record's fields, or
one ``value`` column), adds the ``key`` column when keys are decoded too, and the
kafka_* columns when asked, and gives the same ``DecodedBatch`` as the JSON
decoder, so that the policies for records that do not fit apply unchanged.

A record does not fit when its value is a tombstone, is not framed, names a schema
id the registry does not have (or a schema the format cannot read), or its payload
cannot be read with that schema or does not fit the table's column types. A key
that is absent is null, not a misfit. Reasons say which, and for a key begin with
``key:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka.schema_registry import Schema

from spark_writer.decoded_batch import KAFKA_METADATA_FIELDS, DecodedBatch, metadata_columns, split_by_reasons
from spark_writer.schema_registry import RegistrySettings, SchemaNotFoundError, parsed_schema
from spark_writer.wire_format import TOMBSTONE, split_frames

VALUE_COLUMN: Final = "value"
KEY_COLUMN: Final = "key"
KEY_REASON_PREFIX: Final = "key: "


class UnsupportedSchemaError(ValueError):
    """A registered schema has a type the table cannot hold: refused before the query starts, saying where."""


class UnreadableSchemaError(ValueError):
    """A record's writer schema cannot be read by the decoder (its records do not fit, with this reason)."""


class PayloadDecoder(Protocol):
    """One format's decoding of payloads into values of the table's type (`target`).

    A frozen dataclass, shipped to the executors with the task; what it caches is built again there.
    """

    @property
    def kind(self) -> str:
        """The name of its parsed form of writer schemas, in the process's cache."""
        ...

    @property
    def schema_format(self) -> str | None:
        """The registry's format to ask schemas in (``serialized`` for Protobuf), or None."""
        ...

    @property
    def target(self) -> pa.DataType: ...

    def writer(self, registry: RegistrySettings, schema_id: int, schema: Schema) -> Any:
        """The decoder's form of a writer schema (UnreadableSchemaError when it cannot use it)."""
        ...

    def decode(self, payloads: pa.Array, writers: Sequence[Any]) -> tuple[pa.Array, list[str | None]]:
        """One value of `target` per payload (null where it does not fit) and the reasons (None where it does)."""
        ...


@dataclass(frozen=True)
class RegistryValues:
    """One Kafka column (value or key) in the wire format, decoded by `payloads` with schemas from `registry`."""

    registry: RegistrySettings
    payloads: PayloadDecoder
    absent_is_null: bool = False  # a key may be absent; a value may not (a tombstone)

    def decode(self, values: pa.Array) -> tuple[pa.Array, pa.Array]:
        """One value of the target type per record (null where it did not decode), and the reasons (null: fits)."""
        count = len(values)
        frames = split_frames(values)
        reasons: list[str | None] = [None] * count
        for index, reason in frames.unframed.items():
            if not (self.absent_is_null and reason == TOMBSTONE):
                reasons[index] = reason
        ids, which = np.unique(frames.schema_ids, return_inverse=True)
        writers: list[Any] = []
        unusable: dict[int, str] = {}  # position in `ids` -> reason
        for position, schema_id in enumerate(ids.tolist()):
            try:
                writers.append(self._writer(schema_id))
            except SchemaNotFoundError:
                writers.append(None)
                unusable[position] = f"unknown schema id {schema_id}: the registry at {self.registry.safe_url} has none"
            except UnreadableSchemaError as error:
                writers.append(None)
                unusable[position] = f"schema id {schema_id} cannot be read: {error}"
        readable = np.array([position not in unusable for position in range(len(ids))], bool)[which]
        for index, position in zip(
            frames.indices.filter(pa.array(~readable)).to_pylist(), which[~readable].tolist(), strict=True
        ):
            reasons[index] = unusable[position]
        decoded, decode_reasons = self.payloads.decode(
            frames.payloads.filter(pa.array(readable)), [writers[position] for position in which[readable].tolist()]
        )
        indices = np.asarray(frames.indices.to_numpy(zero_copy_only=False))[readable]
        for index, decode_reason in zip(indices.tolist(), decode_reasons, strict=True):
            if decode_reason is not None:
                reasons[index] = decode_reason
        # Where each record's value is: its place among the decoded ones, or the null appended after them.
        places = np.full(count, len(decoded), np.int64)
        places[indices] = np.arange(len(decoded))
        with_null = pa.concat_arrays([decoded, pa.nulls(1, decoded.type)])
        return with_null.take(pa.array(places)), pa.array(reasons, pa.string())

    def _writer(self, schema_id: int) -> Any:
        decoder = self.payloads
        return parsed_schema(
            decoder.kind,
            self.registry,
            schema_id,
            lambda schema: decoder.writer(self.registry, schema_id, schema),
            decoder.schema_format,
        )


def value_fields(target: pa.DataType) -> list[pa.Field]:
    """The table columns of a value of this type: a record's fields, or one ``value`` column."""
    return list(target) if pa.types.is_struct(target) else [pa.field(VALUE_COLUMN, target)]


@dataclass(frozen=True)
class RegistryDecoder:
    """Decodes the values (and keys) of Kafka record batches into table rows (``kafka_records.RecordDecoding``)."""

    value: RegistryValues
    key: RegistryValues | None = None
    kafka_metadata: bool = False
    schema_name: str = "its registered schema"  # for messages: "the Avro schema of subject orders-value"

    def __post_init__(self) -> None:
        names = [f.name for f in self.output_schema]
        if repeated := sorted({name for name in names if names.count(name) > 1}):
            raise UnsupportedSchemaError(
                f"the table would have the column(s) {repeated} twice: the value's fields include the key or "
                "kafka_* columns; leave out --decode-key or --kafka-metadata, or rename the field"
            )

    @cached_property
    def output_schema(self) -> pa.Schema:
        """The value's columns, then ``key`` when keys are decoded, then the kafka_* columns when asked for."""
        key = [] if self.key is None else [pa.field(KEY_COLUMN, self.key.payloads.target)]
        return pa.schema(
            [*value_fields(self.value.payloads.target), *key, *(KAFKA_METADATA_FIELDS if self.kafka_metadata else ())]
        )

    def decode(self, kafka: pa.RecordBatch) -> DecodedBatch:
        values, reasons = self.value.decode(kafka.column("value"))
        columns = values.flatten() if pa.types.is_struct(values.type) else [values]
        if self.key is not None:
            keys, key_reasons = self.key.decode(kafka.column("key"))
            columns.append(keys)
            prefixed = pc.binary_join_element_wise(KEY_REASON_PREFIX, key_reasons, "")
            reasons = pc.coalesce(reasons, prefixed)
        if self.kafka_metadata:
            columns.extend(metadata_columns(kafka))
        return split_by_reasons(kafka, pa.Table.from_arrays(columns, schema=self.output_schema), reasons)
