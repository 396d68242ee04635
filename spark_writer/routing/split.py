"""A task's rows split by route (spark_writer.routing.routes): each table's rows, the records no route takes, and the
tables the task has no location for.

It runs in the writer's tasks (spark_writer.sink.parquet_writer.task_writer) on every Arrow table of rows, before the
rows are split by partition. The route column is dictionary-encoded, so a batch looks a route up (and, in
dynamic mode, checks an identifier) once per distinct value, not per row, and the rows are grouped in one
pass (Arrow's group_by), whatever the number of tables.

Invariants: every input row is in exactly one of a written table's rows, `unrouted` (Unrouted.FAIL), `unknown`
(a table without a location: the driver ensures it and writes its rows in a second pass), or left out
because `only` excludes its table; a table is written only under its own location, as the driver got it from
RegisterWriter or EnsureTables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from coordinator_service.contract.errors import quote
from coordinator_service.contract.table_identifiers import table_identifier_problem
from spark_writer.routing.routes import Routes, Unrouted

# Distinct unrouted values a task describes; the records of any others are counted together.
MAX_UNROUTED_VALUES: Final = 10
OTHER_VALUES: Final = "other values"
_KAFKA_COLUMNS: Final = ("kafka_topic", "kafka_partition", "kafka_offset")
_RECORD_COLUMNS: Final = ("topic", "partition", "offset")


@dataclass(frozen=True)
class TaskRouting:
    """What a task needs to route its rows; pickled to the executors with the batch's target."""

    routes: Routes
    own_table: str
    # Every table the tasks may write, the sink's own included, with its location.
    locations: Mapping[str, str]
    # A batch's second pass, after it met tables without a location: only these tables' rows are written.
    only: frozenset[str] | None = None
    # Whether the catalog holds nested namespaces (RegisterWriter's answer): a dynamic route's value names a table
    # of one (lake.shop.orders) only then; elsewhere it is unrouted, as any value outside the name policy.
    nested_namespaces: bool = False

    def destination(self, value: str | None) -> tuple[str | None, str]:
        """The table of a route column's value (as text), or None and how a message describes the value."""
        if value is None:
            table, description = None, "null"
        elif self.routes.dynamic:
            problem = table_identifier_problem(value, nested_namespaces=self.nested_namespaces)
            table, description = (value, "") if problem is None else (None, problem)
        else:
            table, description = self.routes.tables.get(value), quote(value)
        if table is None and self.routes.unrouted is Unrouted.DEFAULT:
            return self.own_table, ""
        return table, description


@dataclass(frozen=True)
class UnroutedValue:
    """A value no route takes (Unrouted.FAIL): as a message describes it, its records, and the first one's row."""

    description: str
    records: int
    first_row: int


@dataclass
class RouteSplit:
    """One table of rows, split: what to write per table, what no route takes, what has no location yet."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    unrouted: list[UnroutedValue] = field(default_factory=list)
    # Tables with rows but no location (dynamic mode): their records, not written.
    unknown: dict[str, int] = field(default_factory=dict)


def split_by_route(rows: pa.Table, routing: TaskRouting) -> RouteSplit:
    """The rows of `rows` by destination, per `routing`."""
    split = RouteSplit()
    if rows.num_rows == 0:
        return split
    column = rows.column(routing.routes.column).combine_chunks()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.string())  # integer routes compare as text (routing.Routes.check_schema)
    encoded = column.dictionary_encode()
    values: list[str | None] = [*encoded.dictionary.to_pylist(), None]
    null_index = len(values) - 1
    indices = pc.fill_null(encoded.indices, null_index)
    groups = (
        pa.table({"value": indices, "row": pa.array(range(rows.num_rows), type=pa.int64())})
        .group_by("value", use_threads=False)
        .aggregate([("row", "list")])
    )
    by_table: dict[str, list[pa.Array]] = {}
    for index, row_list in zip(groups.column("value").to_pylist(), groups.column("row_list"), strict=True):
        table, description = routing.destination(values[index])
        row_numbers = row_list.values
        if table is None:
            split.unrouted.append(UnroutedValue(description, len(row_numbers), row_numbers[0].as_py()))
        elif table not in routing.locations:
            split.unknown[table] = split.unknown.get(table, 0) + len(row_numbers)
        elif routing.only is not None and table not in routing.only:
            continue
        else:
            by_table.setdefault(table, []).append(row_numbers)
    for table, parts in by_table.items():
        # A table that takes every row (one route per batch, or all to one table) is not copied.
        taken = sum(len(part) for part in parts)
        split.tables[table] = rows if taken == rows.num_rows else rows.take(pa.concat_arrays(parts))
    return split


def record_origin(rows: pa.Table, row: int, kafka_records: pa.RecordBatch | None) -> str | None:
    """Where the row came from, as a message says it: its Kafka position when the rows carry the kafka_* columns,
    else the range of Kafka records it was decoded from when they hold one topic-partition; None otherwise."""
    if all(name in rows.column_names for name in _KAFKA_COLUMNS):
        topic, partition, offset = (rows.column(name)[row].as_py() for name in _KAFKA_COLUMNS)
        return f"topic {topic} partition {partition} offset {offset}"
    if kafka_records is None or not all(name in kafka_records.schema.names for name in _RECORD_COLUMNS):
        return None
    topics, partitions = (pc.unique(kafka_records.column(name)).to_pylist() for name in ("topic", "partition"))
    if len(topics) != 1 or len(partitions) != 1:
        return None
    bounds = pc.min_max(kafka_records.column("offset")).as_py()
    return f"topic {topics[0]} partition {partitions[0]} offsets {bounds['min']} to {bounds['max']}"


@dataclass
class UnroutedTally:
    """A task's unrouted values over its batches: records per description and where the first came from; at most
    MAX_UNROUTED_VALUES values, the others' records counted under OTHER_VALUES."""

    values: dict[str, tuple[int, str]] = field(default_factory=dict)

    def add(self, description: str, records: int, origin: str) -> None:
        key = description if description in self.values or len(self.values) < MAX_UNROUTED_VALUES else OTHER_VALUES
        counted, first = self.values.get(key, (0, origin))
        self.values[key] = (counted + records, first)
