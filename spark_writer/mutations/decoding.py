"""The records of an upsert or change stream as rows with their op and their Kafka position, in the writer's tasks.

``MutationDecoder`` wraps a format's decoding of values (JSON, or a registry format's) and of message keys:

* a record with a value is a row: the value's (``--mode upsert``: an upsert; ``--op-field F``: its op is the row's
  field F, mapped by the op map), or its Debezium envelope's (``debezium.unwrap``: after, or before for a delete);
* a tombstone (a null value) deletes its key, read from the Kafka message key: for JSON, an object holding the key's
  columns (or Kafka Connect's ``{"schema": ..., "payload": {...}}``), for a registry format, the key subject's
  record (its fields by name) or, for a key of one column, a value of its own;
* a record whose op is not in the op map, whose image or key cannot be read, or whose key has a null column does
  not fit (the --on-bad-record policy then applies: fail, or dead-letter).

Every row carries its op (reduction.OP_COLUMN) and its position (the kafka_* columns), which the reduction reads.
``mutation_decoding`` turns a format's decoding into this one: the sink's parser (mutations.mutation_parser) and a
fresh read (spark_writer.fresh) both take it. Pure: no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_writer.formats.decoded_batch import KAFKA_METADATA_FIELDS, DecodedBatch, metadata_columns, split_by_reasons
from spark_writer.formats.json_decoding import JsonDecoder
from spark_writer.formats.record_decoding import RecordDecoding
from spark_writer.formats.registry_decoding import KEY_REASON_PREFIX, RegistryDecoder, RegistryValues, value_fields
from spark_writer.mutations import debezium
from spark_writer.mutations.modes import Mutations, Op, mapped_ops
from spark_writer.mutations.reduction import OP_COLUMN, key_text
from spark_writer.spark_arrow_types import spark_type_names

OP_FIELD = pa.field(OP_COLUMN, pa.int8())


class ColumnDecoding(Protocol):
    """One Kafka column (values or keys) as rows, one per value in their order, and why each does not fit (null
    where it does): json_decoding.JsonDecoder's decode_values, RegistryColumns'."""

    def decode_values(self, values: pa.Array) -> tuple[pa.Table, pa.Array]: ...


@dataclass(frozen=True)
class RegistryColumns:
    """A registry format's Kafka column as rows: a record's fields, or one column (`single`) for any other value."""

    values: RegistryValues
    single: str

    def decode_values(self, values: pa.Array) -> tuple[pa.Table, pa.Array]:
        decoded, reasons = self.values.decode(values)
        if pa.types.is_struct(decoded.type):
            fields = [each.with_nullable(True) for each in value_fields(decoded.type)]
            return pa.Table.from_arrays(decoded.flatten(), schema=pa.schema(fields)), reasons
        return pa.table({self.single: decoded}), reasons


def json_value_schema(row: pa.Schema, mutations: Mutations) -> pa.Schema:
    """What the JSON decoder reads of an upsert or change stream's values whose rows have the fields of `row` (its
    --schema, in Spark's Arrow form): the rows, or their Debezium envelopes; a key column may be null there, so that a
    record without one is refused for that reason."""
    relaxed = pa.schema([pa.field(f.name, f.type, f.nullable or f.name in mutations.key) for f in row])
    return relaxed if mutations.envelope is None else debezium.json_envelope_schema(relaxed)


def json_key_decoding(row: pa.Schema, key: Sequence[str], time_zone: str) -> JsonDecoder:
    """JSON message keys: objects holding the key's columns, at the top or under Kafka Connect's `payload`."""
    fields = [row.field(name).with_nullable(True) for name in key]
    schema = pa.schema([*fields, pa.field(debezium.PAYLOAD, pa.struct(fields))])
    return JsonDecoder(schema, spark_type_names(pa.struct(list(schema))), time_zone=time_zone)


@dataclass(frozen=True)
class MutationDecoder:
    """Kafka record batches into rows of `row_schema` with their op and position (the module's docstring); a
    kafka_records.BatchDecoder. Shipped to the executors with the batch's target."""

    values: ColumnDecoding
    keys: ColumnDecoding
    mutations: Mutations
    row_schema: pa.Schema  # the row's columns, as decoded (nullable)
    keep_positions: bool = False  # the table has the kafka_* columns (--kafka-metadata)
    schema_name: str = "the schema"

    @cached_property
    def output_schema(self) -> pa.Schema:
        """The row's columns, the kafka_* columns (always: the reduction reads them), then the op."""
        return pa.schema([*self.row_schema, *KAFKA_METADATA_FIELDS, OP_FIELD])

    @cached_property
    def table_schema(self) -> pa.Schema:
        """The table's columns: the row's, the key's required, then the kafka_* ones when kept."""
        columns = pa.schema([*self.row_schema, *(KAFKA_METADATA_FIELDS if self.keep_positions else ())])
        return self.mutations.table_schema(columns, declares_nullability=False)

    def __getstate__(self) -> dict[str, object]:
        # Only what defines the decoder travels; the cached schemas are built again where it runs.
        names = ("values", "keys", "mutations", "row_schema", "keep_positions", "schema_name")
        return {name: getattr(self, name) for name in names}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def decode(self, kafka: pa.RecordBatch) -> DecodedBatch:
        return split_by_reasons(kafka, *self.aligned(kafka))

    def aligned(self, kafka: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
        """One row of `output_schema` per record, in their order, and why each does not fit (null where it does)."""
        rows, ops, reasons = self._rows(kafka.column("value"), kafka.column("key"))
        columns = [*rows.columns, *metadata_columns(kafka), ops]
        return pa.Table.from_arrays(columns, schema=self.output_schema), reasons

    def key_texts(self, values: pa.Array, keys: pa.Array) -> pa.Array:
        """The text of each record's key (reduction.key_text; null for a record that does not fit), from its value and
        its message key: what a batch's records are shuffled by."""
        rows, _, reasons = self._rows(values, keys)
        return pc.if_else(pc.is_null(reasons), key_text(rows, self.mutations.key), pa.scalar(None, pa.string()))

    def _rows(self, values: pa.Array, keys: pa.Array) -> tuple[pa.Table, pa.Array, pa.Array]:
        """Each record's row, op and why it does not fit (null where it does), in the records' order."""
        tombstones = np.asarray(pc.is_null(values).to_numpy(zero_copy_only=False), dtype=bool)
        live = pa.array(np.flatnonzero(~tombstones), pa.int64())
        dead = pa.array(np.flatnonzero(tombstones), pa.int64())
        live_rows, live_ops, live_reasons = self._changes(values.take(live))
        dead_rows, dead_reasons = self._deleted_keys(keys.take(dead))
        order = pc.sort_indices(pa.concat_arrays([live, dead]))
        rows = pa.concat_tables([live_rows, dead_rows]).take(order)
        ops = pa.concat_arrays([live_ops, pa.array(np.full(len(dead), Op.DELETE.value, np.int8))]).take(order)
        reasons = pa.concat_arrays([live_reasons, dead_reasons]).take(order)
        return rows, ops, pc.coalesce(reasons, self._null_keys(rows))

    def _changes(self, values: pa.Array) -> tuple[pa.Table, pa.Array, pa.Array]:
        """The rows of records with a value, their ops and why they do not fit."""
        if not len(values):
            return self.row_schema.empty_table(), pa.array([], pa.int8()), pa.array([], pa.string())
        decoded, reasons = self.values.decode_values(values)
        mutations = self.mutations
        if mutations.envelope is not None:
            rows, ops, why = debezium.unwrap(decoded, mutations.op_map)
        elif mutations.op_field is not None:
            rows = decoded
            ops, why = mapped_ops(decoded.column(mutations.op_field).combine_chunks(), mutations.op_map, "op")
        else:
            rows, ops, why = decoded, pa.array(np.full(len(values), Op.UPSERT.value, np.int8)), pa.nulls(len(values))
        return _conformed(rows, self.row_schema), ops, pc.coalesce(reasons, why.cast(pa.string()))

    def _deleted_keys(self, keys: pa.Array) -> tuple[pa.Table, pa.Array]:
        """The rows of tombstones (their key's columns, null elsewhere) and why they do not fit."""
        count = len(keys)
        if not count:
            return self.row_schema.empty_table(), pa.array([], pa.string())
        decoded, reasons = self.keys.decode_values(keys)
        columns = []
        missing = []
        for row_field in self.row_schema:
            if row_field.name not in self.mutations.key:
                columns.append(pa.nulls(count, row_field.type))
                continue
            column = _key_column(decoded, row_field.name)
            if column is None:
                missing.append(row_field.name)
                columns.append(pa.nulls(count, row_field.type))
                continue
            cast, cast_reasons = _cast_each(column, row_field.type, row_field.name)
            columns.append(cast)
            reasons = pc.coalesce(reasons, cast_reasons)
        if missing:
            absent = f"the message key has no {', '.join(missing)}: a tombstone deletes the key its message key holds"
            reasons = pc.coalesce(reasons, pa.array([absent] * count, pa.string()))
        rows = pa.Table.from_arrays(columns, schema=self.row_schema)
        reasons = pc.coalesce(reasons, self._null_keys(rows))
        prefixed = pc.binary_join_element_wise(f"tombstone {KEY_REASON_PREFIX}", reasons.cast(pa.string()), "")
        return rows, prefixed

    def _null_keys(self, rows: pa.Table) -> pa.Array:
        """Why a row whose key has a null column does not fit (null for the others)."""
        reasons = pa.nulls(rows.num_rows, pa.string())
        for name in reversed(self.mutations.key):
            reasons = pc.if_else(
                pc.is_null(rows.column(name).combine_chunks()),
                pa.scalar(f"key column {name} is null: a row of a keyed table has its whole key", pa.string()),
                reasons,
            )
        return reasons


def _key_column(decoded: pa.Table, name: str) -> pa.Array | None:
    """A key column of decoded message keys: at the top, or under Kafka Connect's `payload` (JSON)."""
    column = decoded.column(name).combine_chunks() if name in decoded.column_names else None
    if debezium.PAYLOAD in decoded.column_names:
        payload = decoded.column(debezium.PAYLOAD).combine_chunks()
        nested = pc.struct_field(payload, name)
        column = nested if column is None else pc.coalesce(nested, column)
    return column


def _cast_each(column: pa.Array, target: pa.DataType, name: str) -> tuple[pa.Array, pa.Array]:
    """`column` as `target`, and why a value does not fit it (null where it does)."""
    try:
        return column.cast(target), pa.nulls(len(column), pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    values: list[pa.Array] = []
    reasons: list[str | None] = []
    for index in range(len(column)):
        try:
            values.append(column.slice(index, 1).cast(target))
            reasons.append(None)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            values.append(pa.nulls(1, target))
            reasons.append(f"{name} does not fit the key column's type {target}: {error}")
    return pa.concat_arrays(values), pa.array(reasons, pa.string())


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The decoded rows as `schema`'s columns, by name (the row's fields the table has)."""
    return pa.Table.from_arrays([rows.column(name) for name in schema.names], schema=schema)


def mutation_decoding(
    inner: RecordDecoding,
    mutations: Mutations,
    *,
    keep_positions: bool = False,
    registry_keys: RegistryValues | None = None,
) -> RecordDecoding:
    """`inner`, a format's decoding of values (JSON's, or a registry format's without kafka metadata), as an upsert or
    change stream's: its values (and the message keys of tombstones: JSON objects, or `registry_keys`' records)
    decoded as changes, under the same policy; ValueError when the rows cannot be a keyed table's."""
    decoder = inner.decoder
    if isinstance(decoder, JsonDecoder):
        values: ColumnDecoding = decoder
        decoded = decoder.schema
    elif isinstance(decoder, RegistryDecoder):
        values = RegistryColumns(decoder.value, "value")
        decoded = pa.schema(value_fields(decoder.value.payloads.target))
    else:
        raise TypeError(f"an upsert or change stream cannot decode with {type(decoder).__name__}")
    if mutations.envelope is not None:
        row = pa.schema(list(debezium.envelope_row_type(pa.struct(list(decoded)), decoder.schema_name)))
    else:
        row = decoded
    row = pa.schema([each.with_nullable(True) for each in row])
    if taken := sorted(set(row.names) & {each.name for each in KAFKA_METADATA_FIELDS}):
        raise ValueError(f"the rows have column(s) {taken}, which the kafka_* position columns would repeat")
    if isinstance(decoder, JsonDecoder):
        keys: ColumnDecoding = json_key_decoding(row, mutations.key, decoder.time_zone)
    else:
        assert registry_keys is not None, "a registry format's tombstones need their key subject"
        keys = RegistryColumns(registry_keys, mutations.key[0])
    mutation_decoder = MutationDecoder(values, keys, mutations, row, keep_positions, decoder.schema_name)
    return RecordDecoding(mutation_decoder, inner.policy, inner.dead_letters)
