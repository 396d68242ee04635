"""Spark's view of Arrow types, without Spark: the name Spark gives an Arrow type, and the Arrow type Spark gives back.

A fresh read (spark_writer.fresh) decodes the tail with the table's columns, which pyiceberg gives as Arrow types
(large_string, fixed_size_binary, timestamps of any unit, field ids as metadata); the sink decodes with its Spark
schema in Spark's Arrow form (spark_writer.arrow_schema). ``spark_arrow_schema`` maps the first onto the second as
pyspark's own round trip does (``to_arrow_schema(from_arrow_schema(...), timezone="UTC")``), and ``spark_type_names``
names each type as Spark's ``simpleString`` does, for the decoders' reasons. Both agree with pyspark for every type
they accept (tests/unit/test_spark_arrow_types.py) and refuse, with a ValueError, the types Spark has none for.
Pure: pyarrow only, so that a fresh read imports no pyspark.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

# Iceberg's timestamptz is an instant: Spark's TIMESTAMP is written as microseconds in UTC, whatever the session's zone.
ICEBERG_TIME_ZONE: Final = "UTC"
# Arrow's YEAR_MONTH interval, which pyarrow has no factory or predicate for (pyspark matches its id too).
INTERVAL_MONTHS_ID: Final = 21
# Spark's TIME type and its default precision (microseconds), as simpleString writes it.
TIME_NAME: Final = "time(6)"

# Spark writes decimals as Arrow's decimal128, whose precision ends here.
MAX_DECIMAL_PRECISION: Final = 38
_INTEGER_NAMES: Final = {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}


def _no_spark_type(data_type: pa.DataType) -> ValueError:
    return ValueError(f"Spark has no type for Arrow's {data_type}")


def _is_signed_integer(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_signed_integer(data_type))


def _is_any_list(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)
    )


def spark_type_name(data_type: pa.DataType) -> str:
    """The type Spark maps `data_type` to, as Spark writes it ("bigint", "array<string>", "struct<a:int>")."""
    if pa.types.is_dictionary(data_type):
        return spark_type_name(data_type.value_type)
    if pa.types.is_boolean(data_type):
        return "boolean"
    if _is_signed_integer(data_type):
        return _INTEGER_NAMES[data_type.bit_width]
    if pa.types.is_float32(data_type):
        return "float"
    if pa.types.is_float64(data_type):
        return "double"
    if pa.types.is_decimal(data_type):
        return f"decimal({data_type.precision},{data_type.scale})"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type):
        return "binary"
    if pa.types.is_date32(data_type):
        return "date"
    if pa.types.is_time64(data_type):
        return TIME_NAME
    if pa.types.is_timestamp(data_type):
        return "timestamp_ntz" if data_type.tz is None else "timestamp"
    if pa.types.is_duration(data_type):
        return "interval day to second"
    if data_type.id == INTERVAL_MONTHS_ID:
        return "interval year to month"
    if _is_any_list(data_type):
        return f"array<{spark_type_name(data_type.value_type)}>"
    if pa.types.is_map(data_type):
        return f"map<{spark_type_name(data_type.key_type)},{spark_type_name(data_type.item_type)}>"
    if pa.types.is_struct(data_type):
        return "struct<" + ",".join(f"{field.name}:{spark_type_name(field.type)}" for field in data_type) + ">"
    if pa.types.is_null(data_type):
        return "void"
    raise _no_spark_type(data_type)


def spark_type_names(target: pa.DataType | pa.Schema) -> tuple[str, ...]:
    """Each field's type as Spark writes it, for the decoders' reasons."""
    return tuple(spark_type_name(field.type) for field in target)


def spark_arrow_type(data_type: pa.DataType) -> pa.DataType:
    """The Arrow type Spark gives back for `data_type` (its type's Arrow form, timestamps in UTC): strings and
    binaries small, timestamps in microseconds, lists' elements named `element`, no field metadata."""
    if pa.types.is_dictionary(data_type):
        return spark_arrow_type(data_type.value_type)
    if pa.types.is_decimal(data_type):
        if data_type.precision > MAX_DECIMAL_PRECISION:
            raise _no_spark_type(data_type)  # Spark names it, but has no Arrow form of it
        return pa.decimal128(data_type.precision, data_type.scale)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type):
        return pa.binary()
    if pa.types.is_time64(data_type):
        return pa.time64("ns")
    if pa.types.is_timestamp(data_type):
        return pa.timestamp("us", tz=None if data_type.tz is None else ICEBERG_TIME_ZONE)
    if pa.types.is_duration(data_type):
        return pa.duration("us")
    if data_type.id == INTERVAL_MONTHS_ID:
        raise _no_spark_type(data_type)  # Spark names it, but has no Arrow form of it
    if _is_any_list(data_type):
        value = data_type.value_field
        return pa.list_(pa.field("element", spark_arrow_type(value.type), nullable=value.nullable))
    if pa.types.is_map(data_type):
        key = pa.field("key", spark_arrow_type(data_type.key_type), nullable=False)
        return pa.map_(key, pa.field("value", spark_arrow_type(data_type.item_type), data_type.item_field.nullable))
    if pa.types.is_struct(data_type):
        return pa.struct([_spark_arrow_field(field) for field in data_type])
    spark_type_name(data_type)  # ValueError for a type Spark has none for
    return data_type


def _spark_arrow_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, spark_arrow_type(field.type), nullable=field.nullable)


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` as Spark gives it back (spark_arrow_type, field by field); ValueError for a type Spark has none for."""
    return pa.schema([_spark_arrow_field(field) for field in schema])
