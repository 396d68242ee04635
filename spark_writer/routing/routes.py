"""Fan-out: which Iceberg table each record goes to, by the value of one column, the *route column*.

Two modes, one per sink:

* static: a list of routes, value -> table. A record goes to the table of its column's value, compared as
  text (an integer column's 7 takes the route "7");
* dynamic: the column's value is the table identifier itself, "namespace.table", checked by the
  coordinator's own rules (coordinator_service.contract.table_identifiers), so a name routed to is never one it refuses.

A record that no route takes (static: a value without a route; dynamic: a value that is no table identifier;
either: null) is *unrouted*: it goes to the sink's own table (`Unrouted.DEFAULT`, the table the writer
registers, which a route may name too) or fails the batch before anything of it is pre-committed
(`Unrouted.FAIL`), with an error naming the values and where the first record of each came from.

Every table receives the rows with the same schema, the route column included: a table's rows say what
routed them, and a table created for a route is created from the data's schema like the sink's own.

Invariants: a `Routes` is valid once built (a column; static routes or dynamic mode, not both; every table a
valid identifier; no value routed twice); `check_schema` refuses, before any record is read, a route column
that is missing or whose type the routes cannot match. Pure: pyarrow and the shared identifier rules only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import pyarrow as pa

from coordinator_service.contract.errors import quote
from coordinator_service.contract.table_identifiers import table_identifier_problem

UNROUTED_HINT: Final = "add a route for them, or let unrouted records go to the sink's own table (--unrouted default"


class Unrouted(StrEnum):
    """What happens to a record that no route takes."""

    DEFAULT = "default"  # written to the sink's own table
    FAIL = "fail"  # the batch fails, naming the values


class UnroutedRecordsError(ValueError):
    """Records no route takes, under Unrouted.FAIL: the batch fails and nothing of it is pre-committed."""


def _is_integer(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(arrow_type))


def _is_string(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


@dataclass(frozen=True)
class Routes:
    """Where a fan-out sink's records go: by `column`, through the static `tables` (value -> table) or, with
    `dynamic`, to the table the value names; `unrouted` says what becomes of the others."""

    column: str
    tables: Mapping[str, str] = field(default_factory=dict)
    dynamic: bool = False
    unrouted: Unrouted = Unrouted.DEFAULT

    def __post_init__(self) -> None:
        if not self.column.strip():
            raise ValueError("the route column needs a name")
        if self.dynamic and self.tables:
            raise ValueError("routes are either static (value=table) or dynamic (the column names the table), not both")
        if not self.dynamic and not self.tables:
            raise ValueError(
                f"route column {self.column!r} routes nothing: give static routes (value=table) or dynamic routes"
            )
        for value, table in self.tables.items():
            if not value:
                raise ValueError(f"the route to {table!r} has an empty value")
            problem = table_identifier_problem(table)
            if problem is not None:
                raise ValueError(f"route {value!r}: {problem}")

    @classmethod
    def static(cls, column: str, routes: Iterable[tuple[str, str]], unrouted: Unrouted = Unrouted.DEFAULT) -> Routes:
        """Static routes from (value, table) pairs; a value given twice is refused."""
        tables: dict[str, str] = {}
        for value, table in routes:
            if value in tables:
                raise ValueError(f"route value {value!r} is given twice: to {tables[value]!r} and to {table!r}")
            tables[value] = table
        return cls(column, tables, unrouted=unrouted)

    @property
    def static_tables(self) -> tuple[str, ...]:
        """The tables of the static routes, each once, in the routes' order."""
        return tuple(dict.fromkeys(self.tables.values()))

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse (ValueError) a route column the data lacks, or one whose values the routes cannot match."""
        if self.column not in schema.names:
            raise ValueError(
                f"route column {self.column!r} is not a top-level column of the data ({', '.join(schema.names)}); "
                "with JSON records, give it in the schema (--schema)"
            )
        column_type = schema.field(self.column).type
        if self.dynamic:
            if not _is_string(column_type):
                raise ValueError(
                    f"dynamic routes need a string route column: {self.column!r} is {column_type}, "
                    "which cannot name a table"
                )
            return
        if _is_integer(column_type):
            misfits = [value for value in self.tables if not _is_integer_text(value)]
            if misfits:
                raise ValueError(
                    f"route column {self.column!r} holds integers ({column_type}): the route values "
                    f"{', '.join(quote(value) for value in misfits)} can never match (write integers as 7 or -7)"
                )
        elif not _is_string(column_type):
            raise ValueError(f"route column {self.column!r} is {column_type}: routes match string or integer columns")

    def unrouted_error(self, batch_id: int, own_table: str, described: Iterable[str], records: int) -> str:
        """The message of a batch that fails for its unrouted records (`described`: each value, counted)."""
        mode = "names no valid table" if self.dynamic else "has no route"
        return (
            f"batch {batch_id}: {records} record(s) whose route column {self.column!r} {mode}: "
            f"{'; '.join(described)}. Nothing of the batch was committed: {UNROUTED_HINT}, {own_table})"
        )


def _is_integer_text(value: str) -> bool:
    """An integer as an integer column's value reads as text: no sign but '-', no leading zero, no spaces."""
    try:
        return str(int(value)) == value
    except ValueError:
        return False


def parse_route(text: str) -> tuple[str, str]:
    """'DE=shop.orders_de' -> ('DE', 'shop.orders_de'); the last '=' separates (a value may hold '=')."""
    value, equals, table = text.rpartition("=")
    if not equals or not value or not table:
        raise ValueError(f"--route {text!r} is not VALUE=TABLE, e.g. --route DE=shop.orders_de")
    return value, table


def routes_from_flags(
    route_by: str | None, routes: Sequence[str], dynamic: bool, unrouted: Unrouted | None
) -> Routes | None:
    """The routes sink-writer's flags give (None: no fan-out); ValueError naming the flags for a bad combination."""
    if route_by is None:
        given = [
            flag
            for flag, set_ in (("--route", routes), ("--dynamic-routes", dynamic), ("--unrouted", unrouted))
            if set_
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(
                f"{' and '.join(given)} {verb} --route-by COLUMN: the column that picks each record's table"
            )
        return None
    if dynamic and routes:
        raise ValueError(
            "--route and --dynamic-routes exclude each other: static routes, or the column names the table"
        )
    if not dynamic and not routes:
        raise ValueError(f"--route-by {route_by} needs --route VALUE=TABLE (repeat) or --dynamic-routes")
    unrouted = unrouted or Unrouted.DEFAULT
    if dynamic:
        return Routes(route_by, dynamic=True, unrouted=unrouted)
    return Routes.static(route_by, (parse_route(text) for text in routes), unrouted)
