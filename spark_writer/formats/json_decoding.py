"""JSON values of Kafka records decoded into table rows with Apache Arrow, in the writer's tasks.

Why in the writer's tasks and in Arrow: a micro-batch's records come out of the
Kafka source's Python worker as Arrow, and its rows go into the Parquet writer's
Python worker as Arrow. Parsed by Spark's ``from_json`` in between, every record
crossed into the JVM as bytes, became a row of typed columns there and crossed
back to Python column by column. Decoded here, the JVM only passes the bytes on,
and pyarrow's JSON reader (C++, whole blocks at a time) does the parsing. Measured
on the demo's order events (a nested list of structs, a timestamp), with the same
source and writer: 250,000-record batches 3.3-4.1 s -> 2.1-2.5 s, 12,500-record
batches 0.7 s -> 0.55-0.6 s (docs/spark-writer.md, "How JSON values are decoded").

What a record becomes (the rules of Spark's ``from_json`` in its permissive mode):

* A JSON object gives its fields by name (case-sensitive): a missing field is
  null, a field the schema lacks is ignored, nested structs likewise.
* A STRING column takes a string as it is and any other top-level value as its
  text in the record without the whitespace between tokens (``{"a":1}``, ``12``,
  ``true``, and ``1E2``, ``19.000000000000000001``, ``"\u00fc"`` as written:
  never a number or a string re-printed).
* TIMESTAMP: ISO 8601 text (``2025-03-01T10:00:00``, a space for the ``T``,
  fractions, ``Z`` or an offset, a date alone for midnight); without a zone or
  offset, in the decoder's time zone, where a wall-clock time the zone's clock
  passes twice (set back) is its earlier instant, and one it skips (set forward)
  is shifted forward by the gap (``02:30`` in a one-hour gap is ``03:30``), as
  java.time, PostgreSQL and Python read them. DATE: ``YYYY-MM-DD``. BINARY: base64 text.
  Numbers (``NaN`` and ``Infinity`` too), booleans, lists and structs as JSON has
  them, decimals from numbers or numeric text.
* A record does not fit the schema when its value is null (a tombstone), is not
  JSON, is JSON but not an object, gives one of the schema's fields twice, or has
  a field whose value cannot be read as the field's type. Its reason says which, naming the top-level fields that do not
  fit and their types (a nested misfit is named by the top-level field holding
  it). Its partial row keeps the fields that fit and has null in the others.

Differences from ``from_json`` that the tests pin down: MAP columns are not
supported (the decoder refuses a schema with one: declare the map as a STRUCT of
its keys, or as a STRING that keeps its JSON text); a nested field that does not
fit makes its whole top-level field null in the partial row (``from_json`` keeps
the nested fields that fit); ``NaN`` and ``Infinity`` fit a DOUBLE bare but not
as strings; a value with several JSON objects is not JSON; a record that gives
one of the schema's fields twice does not fit (``from_json`` keeps one of them).

``decode`` gives a batch's rows and misfits (``decoded_batch.DecodedBatch``);
``decode_values`` one row per value in their order, with a reason per value,
which the JSON Schema format (``json_schema_decoding``) combines with a key.

Blocks of records are parsed at once. A block that pyarrow refuses is split in
two and each half parsed again, down to blocks of ``RECORD_BY_RECORD_BELOW``
records, whose records are checked one by one: a bad record costs a few block
parses, not a batch read record by record. A record checked alone is first parsed
exactly as in a block, and its values are only ever handed on as their own text
(never loaded into Python numbers and printed again), so a record decodes to the
same row whatever its neighbours. The one exception: a decimal written with a scale
pyarrow rescales wrongly (``UNTRUSTED_SCALE``) is read exactly with Python's
Decimal, its block record by record, and handed on as the plain number it is.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_writer.formats.decoded_batch import (
    KAFKA_METADATA_COLUMNS,
    KAFKA_METADATA_FIELDS,
    REASON_COLUMN,
    UTC,
    DecodedBatch,
)
from spark_writer.formats.wall_clock import instants_of_wall_clock
from spark_writer.formats.wire_format import TOMBSTONE
from spark_writer.spark_arrow_types import spark_type_names

# The zone of JSON timestamps that carry none (the same in every session: local, spark-submit, ...).
DEFAULT_JSON_TIME_ZONE: Final = UTC
RECORD_BY_RECORD_BELOW: Final = 16
NOT_JSON: Final = "not valid JSON"
NOT_AN_OBJECT: Final = "a JSON value that is not an object"
MISFIT_PREFIX: Final = "fields whose value does not fit the schema: "
UNTAKEN_PREFIX: Final = "fields the table cannot take: "
# A timestamp's text that ends with its zone after the time: Z, or an offset +hh:mm, +hhmm, +hh (a date alone has
# none: its "-01" is the day).
ZONED_TEXT: Final = r":\d\d(\.\d+)?\s*(Z|z|[+-]\d\d(:?\d\d)?)$"
_PARSE_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)
# pyarrow reads a decimal written with many digits below its point (the fraction's digits less the exponent: its
# written scale) wrongly and silently: rescaling it to the column's scale overflows 128 bits unchecked, so that
# 2e-42 became 0.000 and 2.7777777777777e-58 became 402576489.533 in a decimal(12, 3) (pyarrow 26, its JSON reader
# and its casts alike). A decimal written with a scale of UNTRUSTED_SCALE or more is read exactly here instead: the
# number it is, if the column holds it exactly, else it does not fit.
UNTRUSTED_SCALE: Final = 38
_NUMBER: Final = re.compile(r"-?\d+(?:\.(\d*))?(?:[eE]([-+]?\d+))?")
# Where a text may hold such a number (a negative exponent, or a long fraction): only there are numbers scanned.
_MAYBE_UNTRUSTED: Final = r"[eE]-|\.\d{38}"
JSON_WHITESPACE: Final = " \t\n\r"
# A string (kept whole, escapes as written), or whitespace between tokens (dropped).
_BETWEEN_TOKENS: Final = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\n\r]+')
_VALUE_SCANNER: Final = json.JSONDecoder()


# (index in the batch, reason, the texts of the fields that fit: None when nothing could be read)
_Misfit = tuple[int, str, dict[str, str] | None]


class UnsupportedJsonSchemaError(ValueError):
    """The schema has a type the decoder cannot read from JSON."""


def _unsupported(field_path: str, data_type: pa.DataType) -> None:
    if pa.types.is_map(data_type):
        raise UnsupportedJsonSchemaError(
            f"JSON field {field_path} is a MAP, which the JSON decoding does not support: declare it as a STRUCT "
            "of its keys, or as a STRING, which keeps its JSON text"
        )
    if pa.types.is_struct(data_type):
        for child in data_type:
            _unsupported(f"{field_path}.{child.name}", child.type)
    elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        _unsupported(f"{field_path}[]", data_type.value_type)


def _is_converted(data_type: pa.DataType, time_zone: str) -> bool:
    """Whether pyarrow reads this leaf as text first (the decoder converts it after)."""
    if pa.types.is_timestamp(data_type):
        return data_type.tz is not None and time_zone != UTC
    return bool(pa.types.is_date(data_type) or pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type))


def _parse_type(data_type: pa.DataType, time_zone: str) -> pa.DataType:
    """The type pyarrow's JSON reader is asked for: the target, with the converted leaves as strings."""
    if _is_converted(data_type, time_zone):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([child.with_type(_parse_type(child.type, time_zone)) for child in data_type])
    if pa.types.is_list(data_type):
        return pa.list_(data_type.value_field.with_type(_parse_type(data_type.value_type, time_zone)))
    if pa.types.is_large_list(data_type):
        return pa.large_list(data_type.value_field.with_type(_parse_type(data_type.value_type, time_zone)))
    return data_type


def _timestamps_from_text(text: pa.Array, target: pa.TimestampType, time_zone: str) -> pa.Array:
    zoned = pc.match_substring_regex(text, ZONED_TEXT)
    with_zone = pc.if_else(zoned, text, None).cast(target)
    local = pc.if_else(zoned, None, text).cast(pa.timestamp(target.unit))
    return pc.if_else(zoned, with_zone, instants_of_wall_clock(local, time_zone).cast(target))


def _binary_from_base64(text: pa.Array, target: pa.DataType) -> pa.Array:
    decoded = [None if value is None else base64.b64decode(value, validate=True) for value in text.to_pylist()]
    return pa.array(decoded, target)


def _converted(array: pa.Array, target: pa.DataType, time_zone: str) -> pa.Array:
    """`array` as pyarrow read it (`_parse_type`), turned into `target`; raises ArrowInvalid if a value cannot be."""
    if pa.types.is_decimal(target):
        # pyarrow's JSON reader checks a decimal's digits as written, not once scaled: 1234567890.5 is a
        # decimal(12, 3) of 13 digits. A full validation finds each value over the precision.
        array.validate(full=True)
        return array
    if array.type == target and not _holds_decimals(target):
        return array
    if pa.types.is_timestamp(target):
        return _timestamps_from_text(array, target, time_zone)
    if pa.types.is_date(target):
        return array.cast(target)
    if pa.types.is_binary(target) or pa.types.is_large_binary(target):
        try:
            return _binary_from_base64(array, target)
        except (binascii.Error, ValueError) as error:
            raise pa.ArrowInvalid(f"not base64: {error}") from error
    if pa.types.is_struct(target):
        children = [_converted(array.field(i), child.type, time_zone) for i, child in enumerate(target)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        values = _converted(array.values, target.value_type, time_zone)
        list_type = pa.ListArray if pa.types.is_list(target) else pa.LargeListArray
        return list_type.from_arrays(array.offsets, values, type=target, mask=array.is_null())
    return array.cast(target)


def _written_scale(text: str) -> int:
    """The largest written scale of the numbers in a text (0 when it holds none)."""
    return max(
        (len(fraction or "") - int(exponent or 0) for fraction, exponent in _NUMBER.findall(text)),
        default=0,
    )


def _exact_decimal_text(text: str, target: pa.Decimal128Type | pa.Decimal256Type) -> str | None:
    """A decimal field's text (a number, or a string of one) written with an untrusted scale, as the plain number
    it is when the column holds it exactly; None when it does not (digits below the column's scale, more than its
    precision) or is no number."""
    try:
        loaded = json.loads(text, parse_float=Decimal, parse_int=Decimal)
        value = Decimal(loaded) if isinstance(loaded, str) else loaded
    except (ValueError, TypeError, ArithmeticError):
        return None
    if not isinstance(value, Decimal) or not value.is_finite():
        return None
    scaled = value.scaleb(target.scale)
    if scaled != scaled.to_integral_value() or abs(scaled) >= 10**target.precision:
        return None
    return format(Decimal(int(scaled)).scaleb(-target.scale), "f")


def object_fields(text: str) -> list[tuple[str, str]]:
    """Each top-level field of a valid JSON object, in order (a repeated name repeated): its name and its value's
    text in the record, without the whitespace between tokens (``1E2``, ``{"a":[1.50,2]}``: numbers and strings
    as written)."""

    def past_whitespace(position: int) -> int:
        while text[position] in JSON_WHITESPACE:
            position += 1
        return position

    fields: list[tuple[str, str]] = []
    position = past_whitespace(0) + 1  # past the "{"
    while True:
        position = past_whitespace(position)
        if text[position] == "}":
            return fields
        if text[position] == ",":
            position = past_whitespace(position + 1)
        name, position = _VALUE_SCANNER.raw_decode(text, position)
        position = past_whitespace(past_whitespace(position) + 1)  # past the ":"
        end = _VALUE_SCANNER.raw_decode(text, position)[1]
        fields.append((name, _BETWEEN_TOKENS.sub(lambda match: match.group(1) or "", text[position:end])))
        position = end


def _holds_decimals(data_type: pa.DataType) -> bool:
    if pa.types.is_decimal(data_type):
        return True
    if pa.types.is_struct(data_type):
        return any(_holds_decimals(child.type) for child in data_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _holds_decimals(data_type.value_type)
    return False


def _lines(values: pa.Array) -> pa.Buffer:
    """The values (none null), each ended by a newline, as one buffer: joined in Arrow, no Python object per value."""
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", values.type), pa.scalar(b"\n", values.type))
    width = 8 if pa.types.is_large_binary(joined.type) else 4
    offsets = joined.buffers()[1]

    def offset(index: int) -> int:
        position = (joined.offset + index) * width
        return int.from_bytes(offsets[position : position + width].to_pybytes(), "little", signed=True)

    start, end = offset(0), offset(len(joined))
    return joined.buffers()[2].slice(start, end - start)


def check_time_zone(name: str) -> str:
    """A time zone name Spark and Python both know ("UTC", "Europe/Paris"); ValueError otherwise."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}: use a name like UTC or Europe/Paris") from None
    return name


def json_decoder(
    schema: pa.Schema,
    *,
    kafka_metadata: bool = False,
    time_zone: str = DEFAULT_JSON_TIME_ZONE,
    refused: Mapping[str, str] | None = None,
) -> JsonDecoder:
    """The decoder of JSON values into the columns of `schema` (Spark's Arrow form of the JSON fields:
    spark_writer.arrow_schema, spark_arrow_types), and the kafka_* columns if asked; a record giving a value to a
    `refused` field (json_columns) does not fit."""
    if kafka_metadata and (taken := sorted(set(KAFKA_METADATA_COLUMNS) & set(schema.names))):
        raise ValueError(f"the JSON schema has field(s) {taken}, which the kafka_* columns would repeat")
    return JsonDecoder(
        schema,
        spark_type_names(schema),
        kafka_metadata=kafka_metadata,
        time_zone=check_time_zone(time_zone),
        refused=tuple(sorted((refused or {}).items())),
    )


@dataclass(frozen=True)
class JsonDecoder:
    """Decodes the JSON values of Kafka record batches (the source's columns) into rows of `schema`.

    A module-level frozen dataclass: Spark ships it to the executors with the writer's task.
    """

    schema: pa.Schema  # the JSON fields, as the table gets them (spark_writer.arrow_schema)
    type_names: tuple[str, ...]  # each field's type as Spark writes it ("double", "array<string>"), for reasons
    kafka_metadata: bool = False
    time_zone: str = UTC
    # Fields the table cannot take (json_columns), each with why: a record giving one a value does not fit.
    refused: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.type_names) != len(self.schema):
            raise ValueError("one type name per field of the schema")
        for schema_field in self.schema:
            _unsupported(schema_field.name, schema_field.type)

    @property
    def schema_name(self) -> str:
        return "the JSON schema"

    @cached_property
    def output_schema(self) -> pa.Schema:
        """The JSON fields, then the kafka_* columns when asked for."""
        return pa.schema([*self.schema, *(KAFKA_METADATA_FIELDS if self.kafka_metadata else [])])

    @cached_property
    def _parse_options(self) -> pj.ParseOptions:
        # A refused field is parsed as null, which any other value fails: its records are then checked one by one.
        refused = [pa.field(name, pa.null()) for name, _ in self.refused]
        parse_schema = pa.schema([*(f.with_type(_parse_type(f.type, self.time_zone)) for f in self.schema), *refused])
        return pj.ParseOptions(explicit_schema=parse_schema, unexpected_field_behavior="ignore")

    @cached_property
    def _field_decoders(self) -> dict[str, JsonDecoder]:
        """One decoder per field, to tell which fields of a record that does not fit are the ones."""
        return {
            f.name: JsonDecoder(pa.schema([f]), (name,), time_zone=self.time_zone)
            for f, name in zip(self.schema, self.type_names, strict=True)
        }

    @cached_property
    def _any_decimal_field(self) -> bool:
        return any(_holds_decimals(f.type) for f in self.schema)

    @cached_property
    def _decimal_fields(self) -> dict[str, pa.Decimal128Type | pa.Decimal256Type]:
        return {f.name: f.type for f in self.schema if pa.types.is_decimal(f.type)}

    @cached_property
    def _nested_decimal_fields(self) -> frozenset[str]:
        return frozenset(f.name for f in self.schema if _holds_decimals(f.type) and not pa.types.is_decimal(f.type))

    @cached_property
    def _text_fields(self) -> frozenset[str]:
        return frozenset(f.name for f in self.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type))

    def __getstate__(self) -> dict[str, Any]:
        # Only what defines the decoder travels; the cached parts are built again where it runs.
        return {
            name: getattr(self, name) for name in ("schema", "type_names", "kafka_metadata", "time_zone", "refused")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def decode(self, kafka: pa.RecordBatch) -> DecodedBatch:
        """The records of `kafka` (columns of the Kafka source) as table rows, and those that do not fit."""
        fitting, misfits = self._decode_parts(kafka.column("value"))
        partial_rows = [(self._partial_row(fits), pa.array([index], pa.int64())) for index, _, fits in misfits]
        sources = pa.Table.from_batches([kafka]).take(pa.array([index for index, _, _ in misfits], pa.int64()))
        reasons = pa.array([reason for _, reason, _ in misfits], pa.string())
        return DecodedBatch(
            rows=self._with_metadata(fitting, kafka),
            misfit_rows=self._with_metadata(partial_rows, kafka),
            misfits=sources.append_column(REASON_COLUMN, reasons),
        )

    def decode_values(self, values: pa.Array) -> tuple[pa.Table, pa.Array]:
        """One row of `schema` per value, in their order (what fits of a misfit, null elsewhere), and one reason per
        value (null where it fits): the form ``registry_decoding`` combines with a key's columns."""
        fitting, misfits = self._decode_parts(values)
        parts = [*fitting, *((self._partial_row(fits), pa.array([index], pa.int64())) for index, _, fits in misfits)]
        rows = pa.concat_tables([table for table, _ in parts]) if parts else self.schema.empty_table()
        if len(parts) > 1:  # the misfits come after the fitting blocks
            order = pa.concat_arrays([indices for _, indices in parts])
            rows = rows.take(pc.sort_indices(order))
        reasons: list[str | None] = [None] * len(values)
        for index, reason, _ in misfits:
            reasons[index] = reason
        return rows, pa.array(reasons, pa.string())

    def _decode_parts(self, values: pa.Array) -> tuple[list[tuple[pa.Table, pa.Array]], list[_Misfit]]:
        fitting: list[tuple[pa.Table, pa.Array]] = []  # (rows, their indices in the batch), in the batch's order
        misfits: list[_Misfit] = []
        for start, stop in self._ranges_that_parse(values, 0, len(values), fitting):
            for index in range(start, stop):
                self._check_record(values.slice(index, 1), index, fitting, misfits)
        return fitting, misfits

    def fits(self, text: str) -> bool:
        """Whether a JSON value, as its text, fits this decoder's only field."""
        (name,) = self.schema.names
        return self._parse_fields({name: text}) is not None

    def _ranges_that_parse(
        self, values: pa.Array, start: int, stop: int, fitting: list[tuple[pa.Table, pa.Array]]
    ) -> Iterator[tuple[int, int]]:
        """Parse [start, stop) in blocks, halving a block pyarrow refuses; yield the small ranges left to check."""
        if start == stop:
            return
        block = values.slice(start, stop - start)
        parsed = self._parse_block(block)
        if parsed is not None:
            fitting.append((parsed, pa.array(range(start, stop), pa.int64())))
        elif stop - start < RECORD_BY_RECORD_BELOW:
            yield start, stop
        else:
            middle = (start + stop) // 2
            yield from self._ranges_that_parse(values, start, middle, fitting)
            yield from self._ranges_that_parse(values, middle, stop, fitting)

    def _parse_block(self, values: pa.Array) -> pa.Table | None:
        """Every value of the block as one row, or None when the block cannot be vouched for as a whole."""
        if values.null_count:
            return None
        # Each value must hold exactly one object: starting with '{' and ending with '}', it holds at least one, and
        # as many rows as values then means one each.
        if not pc.all(pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))).as_py():
            return None
        if self._any_decimal_field and self._untrusted_decimals(values):
            return None  # read record by record: each decimal written so is read exactly (_check_record)
        data = _lines(values)
        parsed = self._parsed(data, len(values))
        if parsed is None and pc.any(pc.match_substring(values, "\n")).as_py():
            # A value printed over several lines (looked for only now: the scan costs as much as the join).
            parsed = self._parsed(data, len(values), multiline=True)
        return parsed

    @staticmethod
    def _untrusted_decimals(values: pa.Array) -> bool:
        """Whether a value may hold a number of untrusted written scale (any number: which field holds it is told
        record by record)."""
        maybe = pc.match_substring_regex(values, _MAYBE_UNTRUSTED)
        if not pc.any(maybe).as_py():
            return False
        texts = values.filter(maybe).to_pylist()  # the Kafka values' bytes, or text
        return any(
            _written_scale(text.decode("utf-8", "replace") if isinstance(text, bytes) else text) >= UNTRUSTED_SCALE
            for text in texts
        )

    def _parsed(self, data: bytes | pa.Buffer, expected_rows: int, *, multiline: bool = False) -> pa.Table | None:
        options = self._parse_options
        if multiline:
            options = pj.ParseOptions(
                explicit_schema=options.explicit_schema, unexpected_field_behavior="ignore", newlines_in_values=True
            )
        try:
            table = pj.read_json(pa.BufferReader(data), parse_options=options)
            if table.num_rows != expected_rows:
                return None
            columns = [_converted(table.column(f.name).combine_chunks(), f.type, self.time_zone) for f in self.schema]
        except _PARSE_ERRORS:
            return None
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _parse_fields(self, fields: Mapping[str, str]) -> pa.Table | None:
        """One row of the object whose fields have these texts (compact: one line), or None when it does not fit."""
        text = "{" + ",".join(f"{json.dumps(name)}:{value}" for name, value in fields.items()) + "}"
        return self._parsed(text.encode(), 1)

    def _check_record(
        self, value: pa.Array, index: int, fitting: list[tuple[pa.Table, pa.Array]], misfits: list[_Misfit]
    ) -> None:
        """One record of a block that did not parse: a row as its block would have given it, else why not."""
        parsed = self._parse_block(value)  # alone, exactly as in a block: a record's row never depends on others
        if parsed is not None:
            fitting.append((parsed, pa.array([index], pa.int64())))
            return
        raw = value[0].as_py()
        if raw is None:
            misfits.append((index, TOMBSTONE, None))
            return
        try:
            text = raw.decode("utf-8")
            loaded = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError):
            misfits.append((index, NOT_JSON, None))
            return
        if not isinstance(loaded, dict):
            misfits.append((index, NOT_AN_OBJECT, None))
            return
        record: dict[str, str] = {}
        repeated: list[str] = []
        for name, value_text in object_fields(text):
            if name in record and name in self.schema.names:
                repeated.append(name)
            record[name] = self._as_text_where_text(name, value_text)
        refused = dict(self.refused)
        untaken = [name for name, text in record.items() if name in refused and text != "null"]
        unread = self._read_untrusted_decimals(record)
        if not repeated and not untaken and not unread:
            parsed = self._parse_fields(record)
            if parsed is not None:
                fitting.append((parsed, pa.array([index], pa.int64())))
                return
        decoders = self._field_decoders
        wrong = [
            name
            for name, text in record.items()
            if name in decoders and (name in unread or not decoders[name].fits(text))
        ]
        named = [f"{name} ({decoders[name].type_names[0]})" for name in wrong if name not in repeated]
        named += [f"{name} (given twice)" for name in dict.fromkeys(repeated)]
        parts = [MISFIT_PREFIX + ", ".join(named)] if named else []
        if untaken:
            parts.append(UNTAKEN_PREFIX + ", ".join(f"{name or repr(name)} ({refused[name]})" for name in untaken))
        reason = "; ".join(parts) or MISFIT_PREFIX + "a nested field"
        left_out = {*wrong, *repeated, *refused}
        misfits.append((index, reason, {k: v for k, v in record.items() if k not in left_out}))

    def _read_untrusted_decimals(self, record: dict[str, str]) -> set[str]:
        """The record's decimal fields written with an untrusted scale, read exactly: each one's text becomes the
        plain number it is, and the names of those that do not fit (or that hold nested decimals so written) are
        returned."""
        unread: set[str] = set()
        for name, text in record.items():
            if name in self._decimal_fields and _written_scale(text) >= UNTRUSTED_SCALE:
                exact = _exact_decimal_text(text, self._decimal_fields[name])
                if exact is None:
                    unread.add(name)
                else:
                    record[name] = exact
            elif name in self._nested_decimal_fields and _written_scale(text) >= UNTRUSTED_SCALE:
                unread.add(name)
        return unread

    def _as_text_where_text(self, name: str, value_text: str) -> str:
        """A STRING field's non-string value as a string of its text in the record (as from_json gives it)."""
        if name in self._text_fields and value_text[0] != '"' and value_text != "null":
            return json.dumps(value_text, ensure_ascii=False)
        return value_text

    def _partial_row(self, fits: Mapping[str, str] | None) -> pa.Table:
        """The fields that fit, null elsewhere (null everywhere when nothing could be read)."""
        parsed = None if fits is None else self._parse_fields(fits)
        if parsed is None:
            return pa.Table.from_arrays([pa.nulls(1, f.type) for f in self.schema], schema=self.schema)
        return parsed

    def _with_metadata(self, parts: list[tuple[pa.Table, pa.Array]], kafka: pa.RecordBatch) -> pa.Table:
        rows = pa.concat_tables([table for table, _ in parts]) if parts else self.schema.empty_table()
        if not self.kafka_metadata:
            return rows
        indices = pa.concat_arrays([idx for _, idx in parts]) if parts else pa.array([], pa.int64())
        for name, source in KAFKA_METADATA_COLUMNS.items():
            column = kafka.column(source).take(indices)
            rows = rows.append_column(self.output_schema.field(name), column.cast(self.output_schema.field(name).type))
        return rows
