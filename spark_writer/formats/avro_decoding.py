"""Avro payloads decoded with fastavro into Arrow, and Avro schemas mapped to the table's Arrow types.

Each record is read with its own writer schema (by the id in its header) and no
other: never resolved against a newer version, so a record decodes to the same row
whatever versions the subject gains later (a field a newer version drops keeps its
value, a field the record was written without is null, not a later default, and a
timestamp keeps its writer's unit). Its fields then go to the table's columns by
name (``registry_decoding.conformed``): a column the writer lacks is null, a field
the table lacks is not read, and a field's type is widened where no value changes
(int to long, float to double, ...); a type the column cannot take as written makes
the record a misfit, saying which field.

Why fastavro's values are not Python datetimes: timestamps, dates, times and
uuids are read as their underlying int/long/string (the logical types are taken
out of the schemas fastavro parses) and become Arrow timestamps, dates and times
in one cast per writer schema and batch, each in its writer's unit; building a
datetime per value costs more than decoding the record. Decimals keep fastavro's
conversion, at the writer's scale. A batch's records of one writer schema become
one Arrow struct array at once (pyarrow's C++ conversion of the dicts).

Avro -> Arrow (-> Iceberg): boolean, int (int32), long (int64), float, double,
string, bytes and fixed (binary), enum (its symbol as a string), record (struct),
array (list), map (map of string keys), ``["null", T]`` (T, nullable); logical
types date, time-millis and time-micros (time in microseconds), timestamp-millis
and timestamp-micros (timestamptz), local-timestamp-millis and -micros (timestamp),
decimal (decimal(p, s), p <= 38), uuid (string). Refused, with the field's path,
before the query starts: other unions, timestamp-nanos (Iceberg's timestamps are
microseconds), recursive records, a type of null alone.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import fastavro
import pyarrow as pa
from confluent_kafka.schema_registry import Schema

from spark_writer.formats.decoded_batch import UTC
from spark_writer.formats.registry_decoding import (
    ARROW_ERRORS,
    UnreadableSchemaError,
    UnsupportedSchemaError,
    decode_by_writer,
    fitted,
)
from spark_writer.formats.schema_registry import RegistrySettings, schema_by_id, subject_version

MAX_DECIMAL_PRECISION: Final = 38
# Logical types read as their underlying type and converted in Arrow (see the module's docstring).
CONVERTED_IN_ARROW: Final = frozenset(
    {
        "date",
        "time-millis",
        "time-micros",
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
        "uuid",
    }
)
PRIMITIVES: Final = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# (underlying type, logical type) -> (the Arrow type fastavro's raw values are read as, the table's type)
LOGICAL: Final = {
    ("int", "date"): (pa.date32(), pa.date32()),
    ("int", "time-millis"): (pa.time32("ms"), pa.time64("us")),
    ("long", "time-micros"): (pa.time64("us"), pa.time64("us")),
    ("long", "timestamp-millis"): (pa.timestamp("ms", tz=UTC), pa.timestamp("us", tz=UTC)),
    ("long", "timestamp-micros"): (pa.timestamp("us", tz=UTC), pa.timestamp("us", tz=UTC)),
    ("long", "local-timestamp-millis"): (pa.timestamp("ms"), pa.timestamp("us")),
    ("long", "local-timestamp-micros"): (pa.timestamp("us"), pa.timestamp("us")),
    ("string", "uuid"): (pa.string(), pa.string()),
}


@dataclass(frozen=True)
class AvroTypes:
    """An Avro schema's Arrow types: as fastavro's raw values are read, and as the table holds them."""

    raw: pa.DataType
    table: pa.DataType


class _Mapper:
    """Walks a schema as fastavro parsed it (every name in full), mapping it to Arrow types."""

    def __init__(self, named: dict[str, Any]) -> None:
        self._named = named
        self._open: list[str] = []  # the records being mapped, to refuse a recursive one

    def types(self, schema: Any, path: str) -> AvroTypes:
        if isinstance(schema, list):
            return self._union(schema, path)
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return AvroTypes(PRIMITIVES[schema], PRIMITIVES[schema])
            if schema == "null":
                raise UnsupportedSchemaError(f"Avro field {path} is always null: an Iceberg column needs a type")
            return self._reference(schema, path)
        kind, logical = schema["type"], schema.get("logicalType")
        if kind in ("bytes", "fixed") and logical == "decimal":
            return self._decimal(schema, path)
        if (kind, logical) in LOGICAL:
            raw, table = LOGICAL[(kind, logical)]
            return AvroTypes(raw, table)
        if logical in ("timestamp-nanos", "local-timestamp-nanos"):
            raise UnsupportedSchemaError(
                f"Avro field {path} is {logical}: Iceberg timestamps hold microseconds; use timestamp-micros"
            )
        if kind == "record":
            return self._record(schema, path)
        if kind == "enum":
            return AvroTypes(pa.string(), pa.string())
        if kind == "fixed":
            return AvroTypes(pa.binary(), pa.binary())
        if kind == "array":
            items = self.types(schema["items"], f"{path}[]")
            return AvroTypes(pa.list_(items.raw), pa.list_(items.table))
        if kind == "map":
            values = self.types(schema["values"], f"{path}{{}}")
            return AvroTypes(pa.map_(pa.string(), values.raw), pa.map_(pa.string(), values.table))
        return self.types(kind, path)  # {"type": "long"}, and unknown logical types: the underlying type

    def _reference(self, name: str, path: str) -> AvroTypes:
        if name in self._open:
            raise UnsupportedSchemaError(f"Avro field {path} is a recursive record ({name}): a table cannot hold it")
        if name not in self._named:
            raise UnsupportedSchemaError(f"Avro field {path} has the unknown type {name!r}")
        return self.types(self._named[name], path)

    def _record(self, schema: dict[str, Any], path: str) -> AvroTypes:
        self._open.append(schema["name"])
        try:
            fields = [(f["name"], self.types(f["type"], f"{path}.{f['name']}" if path else f["name"]))
                      for f in schema["fields"]]  # fmt: skip
        finally:
            self._open.pop()
        return AvroTypes(
            pa.struct([pa.field(name, types.raw) for name, types in fields]),
            pa.struct([pa.field(name, types.table) for name, types in fields]),
        )

    def _union(self, branches: list[Any], path: str) -> AvroTypes:
        others = [branch for branch in branches if branch != "null"]
        if len(others) != 1:
            shown = json.dumps([b if isinstance(b, str) else b.get("name", b.get("type")) for b in branches])
            raise UnsupportedSchemaError(
                f"Avro field {path or '(the value)'} is the union {shown}: only a union of null and one type maps "
                "to a column"
            )
        return self.types(others[0], path)

    def _decimal(self, schema: dict[str, Any], path: str) -> AvroTypes:
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        if precision > MAX_DECIMAL_PRECISION:
            raise UnsupportedSchemaError(
                f"Avro field {path} is decimal({precision}, {scale}): Iceberg decimals hold at most "
                f"{MAX_DECIMAL_PRECISION} digits"
            )
        return AvroTypes(pa.decimal128(precision, scale), pa.decimal128(precision, scale))


def _without_converted_logical_types(schema: Any) -> Any:
    """The schema with the logical types of CONVERTED_IN_ARROW taken out (their underlying types left)."""
    if isinstance(schema, list):
        return [_without_converted_logical_types(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    converted = schema.get("logicalType") in CONVERTED_IN_ARROW
    stripped = {key: value for key, value in schema.items() if not (converted and key == "logicalType")}
    for key in ("type", "items", "values"):
        if key in stripped:
            stripped[key] = _without_converted_logical_types(stripped[key])
    if "fields" in stripped:
        stripped["fields"] = [{**f, "type": _without_converted_logical_types(f["type"])} for f in stripped["fields"]]
    return stripped


@dataclass(frozen=True)
class ParsedAvro:
    """A registered Avro schema as fastavro reads with it (without CONVERTED_IN_ARROW's logical types), and as
    fastavro parsed it whole (every name in full, every named type in `named`)."""

    schema_id: int
    fastavro_schema: Any
    full: Any
    named: dict[str, Any]

    def types(self) -> AvroTypes:
        """UnsupportedSchemaError for a type no column can hold."""
        return _Mapper(self.named).types(self.full, "")


def _referenced_texts(registry: RegistrySettings, schema: Schema, seen: set[str]) -> list[Any]:
    """The schemas `schema` references (Confluent schema references), those they reference first."""
    texts: list[Any] = []
    for reference in schema.references or []:
        if reference.subject is None or reference.version is None or reference.name in seen:
            continue
        seen.add(str(reference.name))
        target = subject_version(registry, reference.subject, reference.version).schema
        texts += [*_referenced_texts(registry, target, seen), json.loads(str(target.schema_str))]
    return texts


def parse_avro(registry: RegistrySettings, schema_id: int, schema: Schema) -> ParsedAvro:
    """A registered schema, with the schemas it references, parsed; UnreadableSchemaError if it is not Avro."""
    if (schema.schema_type or "AVRO") != "AVRO":
        raise UnreadableSchemaError(f"it is a {schema.schema_type} schema, not Avro")
    try:
        texts = [*_referenced_texts(registry, schema, set()), json.loads(str(schema.schema_str))]
        named: dict[str, Any] = {}
        stripped_named: dict[str, Any] = {}
        for text in texts:
            full = fastavro.parse_schema(text, named_schemas=named)
            stripped = fastavro.parse_schema(_without_converted_logical_types(text), named_schemas=stripped_named)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
        raise UnreadableSchemaError(f"not a valid Avro schema: {error}") from error
    return ParsedAvro(schema_id, stripped, full, named)


def avro_table_type(registry: RegistrySettings, schema_id: int) -> pa.DataType:
    """The table's Arrow type of a registered Avro schema; UnsupportedSchemaError saying which field cannot be one."""
    try:
        parsed = parse_avro(registry, schema_id, schema_by_id(registry, schema_id))
    except UnreadableSchemaError as error:
        raise UnsupportedSchemaError(f"schema id {schema_id}: {error}") from None
    return parsed.types().table


@dataclass(frozen=True)
class AvroPayloads:
    """Decodes Avro payloads, each with its own writer schema (the id in its header), into values of `target`
    (the table's type): the writer's fields by name, as ``registry_decoding.conformed`` maps them."""

    registry: RegistrySettings
    target: pa.DataType
    kind: str = "avro"
    schema_format: str | None = None

    def writer(self, registry: RegistrySettings, schema_id: int, schema: Schema) -> ParsedAvro:
        return parse_avro(registry, schema_id, schema)

    def decode(self, payloads: pa.Array, writers: Sequence[ParsedAvro]) -> tuple[pa.Array, list[str | None]]:
        return decode_by_writer(payloads, writers, self.target, self._decode_written_with)

    def _decode_written_with(self, payloads: pa.Array, writer: ParsedAvro) -> tuple[pa.Array, list[str | None]]:
        """Payloads of one writer schema: read with it alone, converted to its own table types, then to the table's."""
        try:
            types = writer.types()
        except UnsupportedSchemaError as error:
            unreadable = f"schema id {writer.schema_id} cannot be read: {error}"
            return pa.nulls(len(payloads), self.target), [unreadable] * len(payloads)
        records: list[Any] = []
        reasons: list[str | None] = []
        for payload in payloads.to_pylist():
            record, reason = _read(payload, writer)
            records.append(record)
            reasons.append(reason)
        try:
            values = pa.array(records, types.raw).cast(types.table)
        except ARROW_ERRORS:  # a value its own schema's type cannot hold (a decimal too wide): find which
            values = _record_by_record(records, reasons, types)
        fitting, misfits = fitted(values, self.target, writer.schema_id)
        return fitting, [reason or misfit for reason, misfit in zip(reasons, misfits, strict=True)]


def _record_by_record(records: list[Any], reasons: list[str | None], types: AvroTypes) -> pa.Array:
    arrays = []
    for index, record in enumerate(records):
        try:
            arrays.append(pa.array([record], types.raw).cast(types.table))
        except ARROW_ERRORS as error:
            arrays.append(pa.nulls(1, types.table))
            reasons[index] = f"a value does not fit the table's column types: {error}"
    return pa.concat_arrays(arrays) if arrays else pa.array([], types.table)


def _read(payload: bytes, writer: ParsedAvro) -> tuple[Any, str | None]:
    stream = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(stream, writer.fastavro_schema, None)
    except Exception as error:  # fastavro signals a bad payload with many types (EOFError, IndexError, ...)
        return None, f"not Avro written with schema id {writer.schema_id}: {type(error).__name__}: {error}"
    if stream.tell() != len(payload):
        return None, (
            f"not Avro written with schema id {writer.schema_id}: {len(payload) - stream.tell()} byte(s) left "
            "after the record"
        )
    return record, None
