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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka.schema_registry import Schema

from spark_writer.formats.decoded_batch import KAFKA_METADATA_FIELDS, DecodedBatch, metadata_columns, split_by_reasons
from spark_writer.formats.schema_registry import RegistrySettings, SchemaNotFoundError, parsed_schema
from spark_writer.formats.wire_format import TOMBSTONE, split_frames

VALUE_COLUMN: Final = "value"
KEY_COLUMN: Final = "key"
KEY_REASON_PREFIX: Final = "key: "
# pyarrow's (and Python's) errors for a value that does not fit an Arrow type.
ARROW_ERRORS: Final = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    OverflowError,
    TypeError,
    ValueError,
)


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


class ColumnTypeError(TypeError):
    """A writer schema gives a field a type that the table's column cannot take without changing its values."""


def conformed(values: pa.Array, target: pa.DataType, path: str = "") -> pa.Array:
    """`values`, of a writer schema's table type, as the table's `target` type: a struct's fields by name (one the
    writer lacks is null, one the table lacks is left out), lists and maps by their elements, and a leaf as it is
    or widened where no value changes (a wider integer, a float of an integer, a double of a float, a decimal of
    more digits, text and bytes either way). ColumnTypeError for another type; pyarrow's error for a value that does
    not fit (a decimal whose digits would be lost, bytes that are not UTF-8)."""
    source = values.type
    if pa.types.is_struct(target) and pa.types.is_struct(source):
        children = values.flatten()
        conformed_children = []
        for field in target:
            index = source.get_field_index(field.name)
            child = children[index] if index >= 0 else pa.nulls(len(values), field.type)
            conformed_children.append(conformed(child, field.type, f"{path}.{field.name}" if path else field.name))
        return pa.StructArray.from_arrays(conformed_children, fields=list(target), mask=values.is_null())
    if pa.types.is_list(target) and pa.types.is_list(source):
        elements = conformed(values.values, target.value_type, f"{path}[]")
        return pa.ListArray.from_arrays(values.offsets, elements, type=target, mask=values.is_null())
    if pa.types.is_map(target) and pa.types.is_map(source):
        keys = conformed(values.keys, target.key_type, f"{path}{{}}")
        items = conformed(values.items, target.item_type, f"{path}{{}}")
        return pa.MapArray.from_arrays(values.offsets, keys, items, type=target, mask=values.is_null())
    if source == target:
        return values
    if not _widens(source, target):
        raise ColumnTypeError(
            f"field {path or '(the value)'} is written as {source}, which the table's column, {target}, cannot take "
            "as written"
        )
    return values.cast(target)


def _widens(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every value of `source` is one of `target` (Avro's promotions, and a decimal's wider form)."""
    types = pa.types
    if types.is_integer(source):
        return bool(types.is_integer(target) or types.is_floating(target))
    if types.is_float32(source):
        return bool(types.is_float64(target))
    if types.is_decimal(source):
        return bool(types.is_decimal(target))
    text_or_bytes = (types.is_string, types.is_large_string, types.is_binary, types.is_large_binary)
    return any(is_(source) for is_ in text_or_bytes) and any(is_(target) for is_ in text_or_bytes)


def fitted(values: pa.Array, target: pa.DataType, schema_id: int) -> tuple[pa.Array, list[str | None]]:
    """`values` (one writer schema's) as `target` (``conformed``), and per value why it did not fit (null there)."""
    try:
        return conformed(values, target), [None] * len(values)
    except ColumnTypeError as error:
        return pa.nulls(len(values), target), [f"schema id {schema_id} cannot be read into the table: {error}"] * len(
            values
        )
    except ARROW_ERRORS:  # some value does not fit (a decimal's lost digits, ...): find which
        pass
    arrays: list[pa.Array] = []
    reasons: list[str | None] = []
    for index in range(len(values)):
        try:
            arrays.append(conformed(values.slice(index, 1), target))
            reasons.append(None)
        except ARROW_ERRORS as error:
            arrays.append(pa.nulls(1, target))
            reasons.append(f"a value does not fit the table's column types: {error}")
    return (pa.concat_arrays(arrays) if arrays else pa.array([], target)), reasons


def decode_by_writer(
    payloads: pa.Array,
    writers: Sequence[Any],
    target: pa.DataType,
    decode: Callable[[pa.Array, Any], tuple[pa.Array, list[str | None]]],
) -> tuple[pa.Array, list[str | None]]:
    """The payloads of each writer schema (``writer.schema_id``) decoded together by `decode`, each with its own
    schema (values of `target` and reasons), and put back in the payloads' order."""
    groups: dict[int, list[int]] = {}
    for position, writer in enumerate(writers):
        groups.setdefault(writer.schema_id, []).append(position)
    if len(groups) <= 1:
        return decode(payloads, writers[0]) if writers else (pa.array([], target), [])
    arrays = []
    reasons: list[str | None] = [None] * len(writers)
    order: list[int] = []
    for positions in groups.values():
        values, group_reasons = decode(payloads.take(pa.array(positions, pa.int64())), writers[positions[0]])
        arrays.append(values)
        order.extend(positions)
        for position, reason in zip(positions, group_reasons, strict=True):
            reasons[position] = reason
    places = np.empty(len(order), np.int64)
    places[np.array(order, np.int64)] = np.arange(len(order))
    return pa.concat_arrays(arrays).take(pa.array(places)), reasons


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
