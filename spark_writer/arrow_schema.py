"""The Arrow form of a Spark schema, as the coordinator and the Parquet files see it.

The coordinator creates and evolves the Iceberg table from an Arrow schema, and
checks every data file's Parquet schema against the table. Both come from here,
so they agree: Spark's own Spark -> Arrow mapping, with timestamps fixed to
microseconds in UTC whatever the session time zone is (Iceberg's timestamptz is
an instant; the zone name is only metadata).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_writer.spark_arrow_types import ICEBERG_TIME_ZONE


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema of Spark rows as written to Parquet (timestamp[us, tz=UTC], date32, ...)."""
    return to_arrow_schema(schema, timezone=ICEBERG_TIME_ZONE, error_on_duplicated_field_names_in_struct=True)


def serialize_schema(schema: pa.Schema) -> bytes:
    """Arrow IPC bytes, the form RegisterWriter takes."""
    return bytes(schema.serialize().to_pybytes())
