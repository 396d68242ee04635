"""JSON Schema payloads: JSON text after the wire format's header, read with the JSON decoder's Arrow path.

The registered JSON Schema gives the table's Arrow schema (``json_schema_table_type``);
the payloads, JSON objects, are then decoded exactly as ``--format json`` decodes
values (``json_decoding.JsonDecoder``, pyarrow's JSON reader a block at a time),
so the rules for what fits are the same. Each record is read by its own writer
schema's properties (the id in its header): a column its writer does not declare
is null, even where the record holds a property of that name that a later version
declares, so a record decodes to the same row whatever versions come after it (an
id the registry does not have, or that is not a JSON Schema, does not fit). The
schema's constraints (``required``, ``minimum``, ``pattern``, ...) are not checked:
the producer's serializer validates.

JSON Schema -> Arrow (-> Iceberg): ``integer`` (int64), ``number`` (double),
``boolean``, ``string`` (with ``"format": "date-time"`` a timestamptz, ``"date"`` a
date, ``"contentEncoding": "base64"`` binary), ``array`` with ``items`` (list),
``object`` with ``properties`` (struct), ``enum``/``const`` of strings (string);
Kafka Connect's ``"connect.type"`` of int8, int16, int32 (int32), float32 (float)
and bytes (binary). ``"type": [T, "null"]`` and ``oneOf``/``anyOf`` of null and one
schema are T, nullable; local ``$ref`` (``#/definitions/...``, ``#/$defs/...``)
are followed. Refused before the query starts: objects without ``properties``
(maps; the JSON decoding reads none), other unions, ``allOf`` of several schemas,
references to other documents or subjects, recursive definitions, a top level that
is not an object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

import pyarrow as pa
from confluent_kafka.schema_registry import Schema

from spark_writer.formats.decoded_batch import UTC
from spark_writer.formats.json_decoding import JsonDecoder
from spark_writer.formats.registry_decoding import UnreadableSchemaError, UnsupportedSchemaError, decode_by_writer
from spark_writer.formats.schema_registry import RegistrySettings, schema_by_id

SIMPLE: Final = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
STRING_FORMATS: Final = {"date-time": pa.timestamp("us", tz=UTC), "date": pa.date32()}
CONNECT_TYPES: Final = {
    "int8": pa.int32(),
    "int16": pa.int32(),
    "int32": pa.int32(),
    "float32": pa.float32(),
    "bytes": pa.binary(),
}
LOCAL_REFERENCE_PREFIXES: Final = ("#/definitions/", "#/$defs/")


class _Mapper:
    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document
        self._open: list[str] = []

    def type_of(self, schema: Any, path: str) -> pa.DataType:
        where = path or "(the value)"
        if schema is True or schema == {}:
            raise UnsupportedSchemaError(f"JSON Schema field {where} may hold anything: a column needs one type")
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(f"JSON Schema field {where} is not a schema: {schema!r}")
        if "$ref" in schema:
            return self._reference(str(schema["$ref"]), path)
        for union in ("oneOf", "anyOf"):
            if union in schema:
                return self._union(schema[union], path, union)
        if "allOf" in schema:
            if len(schema["allOf"]) != 1:
                raise UnsupportedSchemaError(f"JSON Schema field {where} is an allOf of several schemas")
            return self.type_of(schema["allOf"][0], path)
        kind = schema.get("type")
        if isinstance(kind, list):
            others = [k for k in kind if k != "null"]
            if len(others) != 1:
                raise UnsupportedSchemaError(
                    f"JSON Schema field {where} has the types {kind}: only null and one type map to a column"
                )
            kind = others[0]
        if kind is None and ("enum" in schema or "const" in schema):
            values = schema.get("enum", [schema.get("const")])
            if all(isinstance(value, str) for value in values):
                return pa.string()
            raise UnsupportedSchemaError(f"JSON Schema field {where} is an enum of values that are not all strings")
        connect = schema.get("connect.type")
        if connect in CONNECT_TYPES:
            return CONNECT_TYPES[connect]
        if kind in SIMPLE:
            return SIMPLE[kind]
        if kind == "string":
            if schema.get("contentEncoding") == "base64":
                return pa.binary()
            return STRING_FORMATS.get(schema.get("format", ""), pa.string())
        if kind == "array":
            if "items" not in schema or not isinstance(schema["items"], dict):
                raise UnsupportedSchemaError(f"JSON Schema field {where} is an array without one schema for its items")
            return pa.list_(self.type_of(schema["items"], f"{path}[]"))
        if kind == "object" or "properties" in schema:
            return self._object(schema, path)
        if kind == "null":
            raise UnsupportedSchemaError(f"JSON Schema field {where} is always null: an Iceberg column needs a type")
        raise UnsupportedSchemaError(f"JSON Schema field {where} has no type the decoder knows ({kind!r})")

    def _object(self, schema: dict[str, Any], path: str) -> pa.DataType:
        properties = schema.get("properties")
        if not properties:
            raise UnsupportedSchemaError(
                f"JSON Schema field {path or '(the value)'} is an object without properties (a map), which the JSON "
                "decoding does not read: declare its properties"
            )
        return pa.struct(
            [
                pa.field(name, self.type_of(child, f"{path}.{name}" if path else name))
                for name, child in properties.items()
            ]
        )

    def _union(self, branches: list[Any], path: str, union: str) -> pa.DataType:
        others = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
        if len(others) != 1:
            raise UnsupportedSchemaError(
                f"JSON Schema field {path or '(the value)'} is a {union} of {len(others)} non-null schemas: only null "
                "and one schema map to a column"
            )
        return self.type_of(others[0], path)

    def _reference(self, reference: str, path: str) -> pa.DataType:
        prefix = next((p for p in LOCAL_REFERENCE_PREFIXES if reference.startswith(p)), None)
        if prefix is None:
            raise UnsupportedSchemaError(
                f"JSON Schema field {path or '(the value)'} refers to {reference!r}: only references within the "
                "schema (#/definitions/..., #/$defs/...) are followed"
            )
        if reference in self._open:
            raise UnsupportedSchemaError(f"JSON Schema field {path} is recursive ({reference}): a table cannot hold it")
        definitions = self._document.get(prefix.strip("#/").rstrip("/"), {})
        name = reference.removeprefix(prefix)
        if name not in definitions:
            raise UnsupportedSchemaError(
                f"JSON Schema field {path or '(the value)'} refers to {reference!r}, undefined"
            )
        self._open.append(reference)
        try:
            return self.type_of(definitions[name], path)
        finally:
            self._open.pop()


def json_schema_type(schema: Schema) -> pa.DataType:
    """The table's Arrow type (a struct) of a registered JSON Schema; UnsupportedSchemaError saying which field
    cannot be a column."""
    if schema.schema_type != "JSON":
        raise UnsupportedSchemaError(f"it is a {schema.schema_type or 'AVRO'} schema, not a JSON Schema")
    if schema.references:
        raise UnsupportedSchemaError("it has schema references, which the JSON Schema decoding does not follow")
    try:
        document = json.loads(str(schema.schema_str))
    except ValueError as error:
        raise UnsupportedSchemaError(f"it is not JSON: {error}") from None
    target = _Mapper(document).type_of(document, "")
    if not pa.types.is_struct(target):
        raise UnsupportedSchemaError(
            f"its values are {target}, not objects: the table's columns are an object's fields"
        )
    return target


def json_schema_table_type(registry: RegistrySettings, schema_id: int) -> pa.DataType:
    try:
        return json_schema_type(schema_by_id(registry, schema_id))
    except UnsupportedSchemaError as error:
        raise UnsupportedSchemaError(f"schema id {schema_id}: {error}") from None


@dataclass(frozen=True)
class JsonSchemaWriter:
    """A record's writer schema as its decoding needs it: its id, and the top-level properties it declares."""

    schema_id: int
    declared: frozenset[str]


@dataclass(frozen=True)
class JsonSchemaPayloads:
    """Decodes JSON payloads into values of `target` (a struct) as the JSON decoder does, each record by the
    properties its own writer schema declares: a column the writer does not declare is null, even where the record
    holds a property of its name (a later version's). `type_names` are `target`'s fields' types as Spark writes
    them, for the reasons."""

    target: pa.DataType
    type_names: tuple[str, ...]
    kind: str = "json-schema"
    schema_format: str | None = None

    @cached_property
    def _decoders(self) -> dict[frozenset[str], JsonDecoder]:
        """A decoder per set of declared properties met (this process's)."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("target", "type_names", "kind", "schema_format")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def writer(self, registry: RegistrySettings, schema_id: int, schema: Schema) -> JsonSchemaWriter:
        try:
            declared = json_schema_type(schema)
        except UnsupportedSchemaError as error:
            raise UnreadableSchemaError(str(error)) from None
        return JsonSchemaWriter(schema_id, frozenset(field.name for field in declared))

    def decode(self, payloads: pa.Array, writers: Sequence[JsonSchemaWriter]) -> tuple[pa.Array, list[str | None]]:
        return decode_by_writer(payloads, writers, self.target, self._decode_written_with)

    def _decode_written_with(self, payloads: pa.Array, writer: JsonSchemaWriter) -> tuple[pa.Array, list[str | None]]:
        rows, reasons = self._decoder_of(writer.declared).decode_values(payloads)
        columns = [
            rows.column(field.name).combine_chunks()
            if field.name in writer.declared
            else pa.nulls(len(payloads), field.type)
            for field in self.target
        ]
        return pa.StructArray.from_arrays(columns, fields=list(self.target)), reasons.to_pylist()

    def _decoder_of(self, declared: frozenset[str]) -> JsonDecoder:
        if declared not in self._decoders:
            kept = [
                (field, name)
                for field, name in zip(self.target, self.type_names, strict=True)
                if field.name in declared
            ]
            self._decoders[declared] = JsonDecoder(pa.schema([f for f, _ in kept]), tuple(name for _, name in kept))
        return self._decoders[declared]
