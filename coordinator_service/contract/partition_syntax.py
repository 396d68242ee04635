"""The syntax of partition fields (RegisterWriter's partition_by), read alike by the coordinator and the writer.

`region` or `identity(region)`, `year(ts)`, `month(ts)`, `day(ts)`, `hour(ts)`, `truncate(4, name)`.
`bucket(N, col)` is refused: the coordinator takes each file's partition from the file's column bounds, and a
hash bucket cannot be derived from them. The coordinator turns a field into a pyiceberg transform
(coordinator_service.tables.iceberg); the Spark writer applies the same transform to its rows
(spark_writer.sink.partitioning). This module imports no server dependency (tests/unit/test_writer_imports.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, cast

from coordinator_service.contract.errors import InvalidArgument, quote

TransformName = Literal["identity", "year", "month", "day", "hour", "truncate"]
TIME_TRANSFORMS: Final = frozenset({"year", "month", "day", "hour"})
# Iceberg keeps a truncate width as an int.
MAX_TRUNCATE_WIDTH: Final = 2**31 - 1

_PARTITION_FIELD = re.compile(
    r"^\s*(?:(?P<transform>identity|year|month|day|hour|bucket|truncate)\s*\(\s*"
    r"(?:(?P<width>\d+)\s*,\s*)?(?P<source>[A-Za-z_][\w.]*)\s*\)|(?P<bare>[A-Za-z_][\w.]*))\s*$"
)


@dataclass(frozen=True)
class PartitionFieldSpec:
    """One partition field: a source column, a transform and, for truncate, its width."""

    source: str
    transform: TransformName
    width: int | None = None

    def __str__(self) -> str:
        return f"truncate[{self.width}]" if self.transform == "truncate" else self.transform


def parse_partition_field(text: str) -> PartitionFieldSpec:
    """'region', 'day(ts)', 'truncate(4, name)' -> the field; InvalidArgument saying how to write it otherwise."""
    match = _PARTITION_FIELD.match(text)
    if match is None:
        raise InvalidArgument(
            f"partition field {quote(text)} is not understood: use a column name or identity(col), year(col), "
            "month(col), day(col), hour(col), truncate(W, col)"
        )
    if match["bare"]:
        return PartitionFieldSpec(match["bare"], "identity")
    name, width, source = match["transform"], match["width"], match["source"]
    needs_width = name in ("bucket", "truncate")
    if needs_width != (width is not None):
        expected = f"{name}(N, {source})" if needs_width else f"{name}({source})"
        raise InvalidArgument(f"partition field {quote(text)}: write it as {quote(expected)}")
    if name == "bucket":
        raise InvalidArgument(
            f"partition field {quote(text)}: bucket partitioning is not supported, because the coordinator takes "
            "each file's partition from its column bounds and a hash bucket cannot be derived from them; "
            "use identity, year/month/day/hour or truncate"
        )
    if name == "truncate":
        if not 1 <= int(str(width)) <= MAX_TRUNCATE_WIDTH:
            raise InvalidArgument(f"partition field {quote(text)}: the width must be 1 to {MAX_TRUNCATE_WIDTH}")
        return PartitionFieldSpec(source, "truncate", int(str(width)))
    return PartitionFieldSpec(source, cast(TransformName, name))
