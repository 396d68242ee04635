"""The JSON decoder against an independent reference: Python's json with exact numbers (Decimal), and the documented
rules written again here. Hypothesis draws a schema, records whose values are of the field's type or of any other
(numbers as they may be written, timestamps at DST changes and far dates, NaN, unicode, nesting) and bad records
mixed in. The property: a record that fits decodes to the reference's row whatever its neighbours and its batch,
and one that does not is a misfit, wherever it is."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_writer.formats.json_decoding import JsonDecoder
from tests.unit.test_json_decoding import kafka_batch

MISFIT: Final = object()  # the reference's verdict on a value that does not fit its column
INT64: Final = (-(2**63), 2**63 - 1)
ZONES: Final = ("UTC", "America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Asia/Kolkata")
DATE: Final = r"(\d{4})-(\d\d)-(\d\d)"
TIMESTAMP: Final = re.compile(DATE + r"(?:[T ](\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,6}))?)?(Z|[+-]\d\d(?::?\d\d)?)?)?")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # bigint, double, decimal, string, boolean, timestamp, list, struct
    arrow: pa.DataType
    type_name: str


KINDS: Final = {
    "bigint": (pa.int64(), "bigint"),
    "double": (pa.float64(), "double"),
    "decimal": (pa.decimal128(12, 3), "decimal(12,3)"),
    "string": (pa.string(), "string"),
    "boolean": (pa.bool_(), "boolean"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamp"),
    "list": (pa.list_(pa.int64()), "array<bigint>"),
    "struct": (pa.struct([("a", pa.int64()), ("b", pa.string())]), "struct<a:bigint,b:string>"),
}

# --- JSON text, written as producers may write it -------------------------------------------------------------------

spaces = st.sampled_from(["", " ", "\n  ", "\t"])
integers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-(10**13), 10**13),  # about as many digits as a decimal column holds
    st.sampled_from([0, -1, INT64[0], INT64[1], INT64[1] + 1]),
)
floats = st.floats(allow_nan=False, allow_infinity=False).map(repr)
decimal_texts = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9).map(str),
    st.sampled_from(["12345678901234567890.1234567891", "19.000000000000000001", "1E2", "-0.0", "1e-3", "0.0001"]),
    st.sampled_from(["1234567890.5", "123456789012", "999999999.9995", "-999999999.999"]),  # at the precision
)
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
instants = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
dst_changes = st.sampled_from(
    [
        dt.datetime(2025, 11, 2, 1, 30),  # New York: set back, twice
        dt.datetime(2025, 3, 9, 2, 30),  # New York: set forward, never
        dt.datetime(2025, 3, 30, 2, 15),  # Paris: never
        dt.datetime(2025, 10, 26, 2, 45),  # Paris: twice
        dt.datetime(2025, 4, 6, 1, 45),  # Lord Howe: set back by 30 minutes, twice
        dt.datetime(2025, 10, 5, 2, 15),  # Lord Howe: set forward by 30 minutes, never
    ]
)


@st.composite
def timestamp_texts(draw: st.DrawFn) -> str:
    moment = draw(st.one_of(instants, dst_changes))
    separator = draw(st.sampled_from(["T", " "]))
    fraction = draw(st.sampled_from(["", f".{moment.microsecond:06d}", f".{moment.microsecond // 1000:03d}"]))
    zone = draw(st.sampled_from(["", "", "Z", "+05:30", "-0800", "+01"]))
    if draw(st.booleans()) and not zone:
        return moment.strftime("%Y-%m-%d")
    return f"{moment:%Y-%m-%d}{separator}{moment:%H:%M:%S}{fraction}{zone}"


def json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if len(text) % 2 else json.dumps(text)


def any_json(depth: int = 2) -> st.SearchStrategy[str]:
    leaves = st.one_of(
        integers.map(str), floats, decimal_texts, texts.map(json_string), st.sampled_from(["true", "false", "null"])
    )
    if depth == 0:
        return leaves
    inner = any_json(depth - 1)
    return st.one_of(
        leaves,
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(st.sampled_from("abxy"), inner, max_size=3).map(
            lambda fields: "{" + ",".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
        ),
    )


def values_of(kind: str) -> st.SearchStrategy[str]:
    """JSON texts of a value of the kind, often; of any other, sometimes; null, sometimes."""
    fitting = {
        "bigint": st.one_of(integers.map(str), st.sampled_from(["1.0", "1e2"])),
        "double": st.one_of(floats, integers.map(str), st.sampled_from(["NaN", "-Infinity", "1e-310"])),
        "decimal": st.one_of(decimal_texts, decimal_texts.map(json.dumps), integers.map(str)),
        "string": st.one_of(texts.map(json_string), any_json()),
        "boolean": st.sampled_from(["true", "false"]),
        "timestamp": timestamp_texts().map(json.dumps),
        "list": st.lists(integers.map(str), max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        "struct": st.tuples(integers.map(str), texts.map(json_string)).map(
            lambda ab: f'{{"a": {ab[0]}, "b": {ab[1]}}}'
        ),
    }[kind]
    return st.one_of(fitting, fitting, fitting, any_json(), st.just("null"))


# --- The reference ---------------------------------------------------------------------------------------------------


def compact(text: str) -> str:
    """The value's text without the whitespace between tokens (strings kept as written)."""
    return re.sub(r'("(?:[^"\\]|\\.)*")|\s+', lambda m: m.group(1) or "", text)


def expected(kind: str, loaded: Any, text: str, zone: str) -> Any:
    """The reference's value of a JSON value (`loaded` by json with Decimal numbers, `text` as written), or MISFIT."""
    if loaded is None:
        return None
    numeric = isinstance(loaded, (int, Decimal)) and not isinstance(loaded, bool)
    if kind == "bigint":
        whole = isinstance(loaded, int) and not isinstance(loaded, bool)
        return loaded if whole and INT64[0] <= loaded <= INT64[1] else MISFIT
    if kind == "double":
        if isinstance(loaded, float):  # NaN, Infinity, -Infinity: json's own constants
            return loaded
        value = float(loaded) if numeric else math.inf
        return value if math.isfinite(value) else MISFIT
    if kind == "decimal":
        number = loaded if numeric else _decimal_text(loaded)
        if number is None:
            return MISFIT
        scaled = Decimal(number).scaleb(3)
        if scaled != scaled.to_integral_value() or abs(scaled) >= 10**12:
            return MISFIT  # digits below the scale, or more than the precision holds
        return Decimal(int(scaled)).scaleb(-3)
    if kind == "string":
        return loaded if isinstance(loaded, str) else compact(text)
    if kind == "boolean":
        return loaded if isinstance(loaded, bool) else MISFIT
    if kind == "timestamp":
        return _instant(loaded, zone) if isinstance(loaded, str) else MISFIT
    if kind == "list":
        if not isinstance(loaded, list):
            return MISFIT
        items = [expected("bigint", item, "", zone) for item in loaded]
        return MISFIT if any(item is MISFIT for item in items) else items
    if not isinstance(loaded, dict):
        return MISFIT
    a, b = expected("bigint", loaded.get("a"), "", zone), loaded.get("b")
    if a is MISFIT or not (b is None or isinstance(b, str)):
        return MISFIT  # only a top-level STRING column takes another value's text: a nested one takes a string
    return {"a": a, "b": b}


def _decimal_text(value: Any) -> Decimal | None:
    if not isinstance(value, str) or not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
        return None
    return Decimal(value)


def _instant(text: str, zone: str) -> Any:
    match = TIMESTAMP.fullmatch(text)
    if match is None:
        return MISFIT
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        moment = dt.datetime(
            int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
            int((fraction or "0").ljust(6, "0")),
        )  # fmt: skip
    except ValueError:
        return MISFIT
    if offset is None:
        local = moment.replace(tzinfo=ZoneInfo(zone))  # fold=0: the earlier of two, shifted forward in a gap
        return local.astimezone(dt.UTC)
    if offset == "Z":
        return moment.replace(tzinfo=dt.UTC)
    sign = -1 if offset[0] == "-" else 1
    digits = offset[1:].replace(":", "")
    delta = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    return (moment - sign * delta).replace(tzinfo=dt.UTC)


BAD_RECORDS: Final = [None, b"not json", b"[1, 2]", b"12", b'"text"', b"\xff\xfe", b'{"a": 1} {"b": 2}']


@st.composite
def records(draw: st.DrawFn, columns: list[Column]) -> bytes | None:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(BAD_RECORDS))
    fields = [(c.name, draw(values_of(c.kind))) for c in columns if draw(st.integers(0, 5))]
    fields += draw(st.lists(st.tuples(st.sampled_from(["extra", "ünknown"]), any_json(1)), max_size=1))
    spread = draw(spaces)
    return ("{" + spread + ("," + spread).join(f"{json.dumps(k)}:{spread}{v}" for k, v in fields) + "}").encode()


def reference_row(record: bytes | None, columns: list[Column], zone: str) -> dict[str, Any] | None:
    """The reference's row of a record, or None when it does not fit."""
    if record is None:
        return None
    try:
        loaded = json.loads(record.decode("utf-8"), parse_float=Decimal)
    except ValueError:
        return None
    if not isinstance(loaded, dict):
        return None
    row = {}
    for column in columns:
        value = expected(column.kind, loaded.get(column.name), _text_of(record, column.name), zone)
        if value is MISFIT:
            return None
        row[column.name] = value
    return row


def _text_of(record: bytes, name: str) -> str:
    """The text of a top-level field's value as the record wrote it (the records here write each key once)."""
    decoder = json.JSONDecoder()
    text = record.decode("utf-8")
    position = text.index("{") + 1
    while True:
        position = len(text) - len(text[position:].lstrip(" \t\n\r,"))
        if text[position] == "}":
            return "null"
        key, position = decoder.raw_decode(text, position)
        position = len(text) - len(text[position:].lstrip(" \t\n\r:"))
        _, end = decoder.raw_decode(text, position)
        if key == name:
            return text[position:end]
        position = end


def comparable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


schemas = st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=4).map(
    lambda kinds: [Column(f"{kind}_{i}", kind, *KINDS[kind]) for i, kind in enumerate(kinds)]
)


EDGES: Final = [
    b'{"decimal_0": 1234567890.5, "string_1": 19.000000000000000001}',  # 13 digits once at scale 3: too many
    '{"decimal_0": "999999999.999", "string_1": {"x": [1E2, "\\u00fc", "ü"]}}'.encode(),
    b'{"timestamp_2": "2025-11-02T01:30:00", "string_1": "2025-03-09 02:30"}',
    b'{"timestamp_2": "2025-03-09 02:30:00.000001", "decimal_0": 12345678901}',
    b'{"timestamp_2": "0001-01-02", "decimal_0": -0.0}',
    # Written with a scale pyarrow rescales wrongly without a word (2e-42 read as 0.000, 2.7777777777777e-58 as
    # 402576489.533): below the column's scale, they do not fit; held exactly, they fit as the number they are.
    b'{"decimal_0": 2.2250738585e-313}',
    b'{"decimal_0": 2.7777777777777e-58, "string_1": 2e-42}',
    b'{"decimal_0": "2e-42"}',
    b'{"decimal_0": 1.5000000000000000000000000000000000000000, "string_1": "x"}',
    b'{"decimal_0": 0e-50}',
    b'{"decimal_0": -1230000000000000000000000000000000000000000e-40}',
    b'{"decimal_0": 12345678901234567890000000000000000000000000e-40}',
    # Past 2037, the last year tzdata's files list transitions for: the zones' rules go on (daylight saving time in
    # April 2038 and July 2100, the gap and the doubled hour of 2040 in New York).
    b'{"timestamp_2": "2038-04-01T00:00:00"}',
    b'{"timestamp_2": "2100-07-01 12:00"}',
    b'{"timestamp_2": "2040-03-11T02:30:00"}',
    b'{"timestamp_2": "2040-11-04T01:30:00"}',
    b"not json",
]
EDGE_COLUMNS: Final = [
    Column(f"{kind}_{i}", kind, *KINDS[kind]) for i, kind in enumerate(("decimal", "string", "timestamp"))
]


@settings(max_examples=200, deadline=None)
@given(st.data(), schemas, st.sampled_from(ZONES))
def test_a_record_decodes_to_the_references_row_whatever_its_neighbours(
    data: st.DataObject, columns: list[Column], zone: str
) -> None:
    check_against_the_reference(data.draw(st.lists(records(columns), min_size=1, max_size=40)), columns, zone)


@pytest.mark.parametrize("zone", ZONES)
def test_records_at_the_edges_decode_to_the_references_rows(zone: str) -> None:
    check_against_the_reference(EDGES, EDGE_COLUMNS, zone)


def check_against_the_reference(batch: list[bytes | None], columns: list[Column], zone: str) -> None:
    decoder = JsonDecoder(
        pa.schema([(c.name, c.arrow) for c in columns]),
        tuple(c.type_name for c in columns),
        kafka_metadata=True,
        time_zone=zone,
    )
    reference = [reference_row(record, columns, zone) for record in batch]

    decoded = decoder.decode(kafka_batch(batch))

    rows = {row.pop("kafka_offset"): row for row in decoded.rows.to_pylist()}
    for row in rows.values():
        for name in ("kafka_topic", "kafka_partition", "kafka_timestamp"):
            del row[name]
    misfits = set(decoded.misfits.column("offset").to_pylist())
    for index, (record, expected_row) in enumerate(zip(batch, reference, strict=True)):
        offset = 100 + index
        if expected_row is None:
            assert offset in misfits, (record, rows.get(offset))
        else:
            assert offset in rows, (record, decoded.misfits.to_pylist())
            assert comparable(rows[offset]) == comparable(expected_row), record
        alone = decoder.decode(kafka_batch([record]))
        assert alone.misfits.num_rows == (expected_row is None), record
        if expected_row is not None:
            (row,) = alone.rows.select([c.name for c in columns]).to_pylist()
            assert comparable(row) == comparable(expected_row), record


def test_the_reference_reads_what_the_docs_say() -> None:
    """The reference itself, on cases the docs name."""
    assert expected("string", Decimal("1E2"), "1E2", "UTC") == "1E2"
    assert expected("decimal", Decimal("12.3456"), "12.3456", "UTC") is MISFIT
    assert expected("timestamp", "2025-03-09T02:30:00", "", "America/New_York") == dt.datetime(
        2025, 3, 9, 7, 30, tzinfo=dt.UTC
    )
    assert expected("timestamp", "2025-11-02 01:30:00", "", "America/New_York") == dt.datetime(
        2025, 11, 2, 5, 30, tzinfo=dt.UTC
    )
