"""What every group of settings shares: the variables' prefix, and bounds the code can live with."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    ByteSize,
    Field,
    WithJsonSchema,
)
from pydantic_settings import NoDecode

ENV_PREFIX = "SINK_COORDINATOR_"


# A list in a variable: comma-separated ("localhost,coordinator.example"); a flag is repeated.
CommaSeparated = Annotated[list[str], NoDecode]


# Bounds the code can live with: durations become timedeltas and SQL intervals, counts SQL limits and integers.
DAY = 24 * 3600.0


THIRTY_DAYS = 30 * DAY


TEN_YEARS = 3650 * DAY


INT32_MAX = 2**31 - 1


# A size of data files: bytes, or with a unit (128MiB, 1GB) in a flag or a variable. JSON (the admin API, where a
# sink's overrides are integers) keeps the integer's schema.
MAX_FILE_BYTES = 2**50  # 1 PiB


FileBytes = Annotated[
    ByteSize,
    Field(ge=1024, le=MAX_FILE_BYTES),
    WithJsonSchema({"type": "integer", "minimum": 1024, "maximum": MAX_FILE_BYTES}),
]
