"""The demo's check of what it streamed: every order of the run in the sink's tables exactly once, the sink's
snapshots counted, and with --fan-out each table holding only the countries routed to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog

from coordinator_service.contract.markers import MARKER_SINK, snapshot_properties
from sink_coordinator_demo.orders import COUNTRY_CURRENCIES
from spark_writer.routing.routes import Routes

# --fan-out: the orders of these countries go to a table each; the others' (JP) to the sink's own table.
ROUTED_COUNTRIES: Final = ("DE", "FR", "ES", "GB", "US")


@dataclass(frozen=True)
class TableCheck:
    rows: int
    distinct_orders: int
    duplicates: int
    missing: int
    snapshots: int
    location: str


@dataclass(frozen=True)
class RouteCheck:
    """One table of a fan-out: the countries routed to it, its rows, and those of another country (none)."""

    table: str
    countries: tuple[str, ...]
    rows: int
    misrouted: int


def fan_out_routes(table: str) -> Routes:
    return Routes.static("country", [(country, f"{table}_{country.lower()}") for country in ROUTED_COUNTRIES])


def route_tables(table: str, routes: Routes | None) -> dict[str, tuple[str, ...]]:
    """Every table of the sink and the countries whose orders it must hold: the sink's own takes the rest."""
    if routes is None:
        return {table: tuple(COUNTRY_CURRENCIES)}
    routed = {route_table: (country,) for country, route_table in routes.tables.items()}
    return {table: tuple(sorted(set(COUNTRY_CURRENCIES) - set(routes.tables))), **routed}


def check_table(catalog: Catalog, tables: Sequence[str], sink: str, events: int) -> TableCheck:
    """Count the orders of the sink's tables (the first is its own): each of 1..events must be in one exactly once."""
    loaded = [catalog.load_table(table) for table in tables]
    ids = pa.chunked_array(
        [chunk for each in loaded for chunk in each.scan(selected_fields=("order_id",)).to_arrow()["order_id"].chunks],
        type=pa.int64(),
    )
    counts = pc.value_counts(ids).flatten()
    distinct = len(counts[0])
    duplicates = pc.sum(pc.greater(counts[1], 1)).as_py() or 0
    expected = pc.and_(pc.greater_equal(counts[0], 1), pc.less_equal(counts[0], events))
    return TableCheck(
        rows=len(ids),
        distinct_orders=distinct,
        duplicates=int(duplicates),
        missing=events - int(pc.sum(expected).as_py() or 0),
        snapshots=sum(
            1 for each in loaded for s in each.snapshots() if snapshot_properties(s).get(MARKER_SINK) == sink
        ),
        location=str(loaded[0].location()),
    )


def check_routes(catalog: Catalog, tables: Mapping[str, tuple[str, ...]]) -> list[RouteCheck]:
    """Each table's rows, and how many are of a country not routed to it."""
    checks = []
    for table, countries in tables.items():
        column = catalog.load_table(table).scan(selected_fields=("country",)).to_arrow().column("country")
        misrouted = pc.sum(pc.invert(pc.is_in(column, value_set=pa.array(countries)))).as_py() or 0
        checks.append(RouteCheck(table, countries, len(column), int(misrouted)))
    return checks
