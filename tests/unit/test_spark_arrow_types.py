"""spark_arrow_types names Arrow types and maps them to Spark's Arrow form as pyspark does, without pyspark: each
checked against pyspark's own functions (the reference) over generated types, those Spark has no type for included."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkTypeError
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type

from spark_writer.spark_arrow_types import spark_arrow_schema, spark_arrow_type, spark_type_name, spark_type_names

LEAVES = st.sampled_from(
    [
        pa.bool_(),
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint32(),
        pa.float16(),
        pa.float32(),
        pa.float64(),
        pa.decimal128(10, 2),
        pa.decimal128(38, 9),
        pa.decimal256(40, 3),
        pa.string(),
        pa.large_string(),
        pa.binary(),
        pa.large_binary(),
        pa.binary(16),
        pa.date32(),
        pa.date64(),
        pa.time32("ms"),
        pa.time64("us"),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("ns"),
        pa.timestamp("ms", tz="Europe/Paris"),
        pa.duration("ms"),
        pa.month_day_nano_interval(),
        pa.null(),
        pa.dictionary(pa.int32(), pa.string()),
    ]
)
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
METADATA = st.one_of(st.none(), st.just({b"PARQUET:field_id": b"7"}))


def _fields(children: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.Field]:
    return st.builds(
        lambda name, child, nullable, metadata: pa.field(name, child, nullable or pa.types.is_null(child), metadata),
        NAMES,
        children,
        st.booleans(),
        METADATA,
    )


def _nested(children: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.DataType]:
    return st.one_of(
        st.builds(lambda field: pa.list_(field), _fields(children)),
        st.builds(lambda field: pa.large_list(field), _fields(children)),
        st.builds(lambda field, size: pa.list_(field, size), _fields(children), st.integers(1, 3)),
        st.builds(lambda key, item: pa.map_(key, item), LEAVES.filter(lambda t: not pa.types.is_null(t)), children),
        st.lists(_fields(children), max_size=3, unique_by=lambda field: field.name).map(pa.struct),
    )


TYPES = st.recursive(LEAVES, _nested, max_leaves=6)


def _pyspark(convert: object) -> object:
    """What pyspark gives, or the exception type it raises."""
    try:
        return convert() if callable(convert) else convert
    except (PySparkTypeError, TypeError, ValueError, pa.ArrowException) as error:
        return type(error)


@settings(max_examples=400, deadline=None)
@given(TYPES)
def test_a_types_name_is_pysparks_simple_string(data_type: pa.DataType) -> None:
    expected = _pyspark(lambda: from_arrow_type(data_type).simpleString())
    if isinstance(expected, type):
        with pytest.raises(ValueError, match="Spark has no type for Arrow's"):
            spark_type_name(data_type)
    else:
        assert spark_type_name(data_type) == expected


@settings(max_examples=400, deadline=None)
@given(TYPES)
def test_a_types_spark_arrow_form_is_pysparks_round_trip(data_type: pa.DataType) -> None:
    expected = _pyspark(lambda: to_arrow_type(from_arrow_type(data_type), timezone="UTC"))
    if isinstance(expected, type):
        with pytest.raises(ValueError, match="Spark has no type for Arrow's"):
            spark_arrow_type(data_type)
    else:
        assert isinstance(expected, pa.DataType)
        got = spark_arrow_type(data_type)
        assert got.equals(expected, check_metadata=True), (got, expected)


def test_a_schema_keeps_its_names_and_nullability_and_drops_pyicebergs_field_ids() -> None:
    """What pyiceberg's as_arrow gives a table the sink wrote, mapped to what the sink's decoder holds."""
    table = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
            pa.field("name", pa.large_string(), metadata={b"PARQUET:field_id": b"2"}),
            pa.field("at", pa.timestamp("us", tz="+00:00")),
            pa.field("tags", pa.large_list(pa.field("element", pa.large_string(), nullable=False))),
        ]
    )
    assert spark_arrow_schema(table) == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("at", pa.timestamp("us", tz="UTC")),
            pa.field("tags", pa.list_(pa.field("element", pa.string(), nullable=False))),
        ]
    )
    assert spark_arrow_schema(table).metadata is None
    assert all(field.metadata is None for field in spark_arrow_schema(table))
    assert spark_type_names(table) == ("bigint", "string", "timestamp", "array<string>")
