"""What the demo shows on the console: each phase timed as it ends, progress bars, and the summary (the results,
the time per phase, where things are, how to read the table)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_access import CatalogAccess
from sink_coordinator_demo.table_check import RouteCheck, TableCheck

console = Console()


@dataclass
class Phases:
    """Wall-clock time of each step, in order."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        except BaseException:
            console.print(f"[red]✗[/red] {name}")
            raise
        self.seconds[name] = time.monotonic() - started
        console.print(f"[green]✓[/green] {name} [dim]({self.seconds[name]:.1f} s)[/dim]")


def progress_bar(description: str) -> Progress:
    return Progress(
        TextColumn("  {task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def exactly_once_results(
    events: int, check: TableCheck, committed_epochs: int, routes: Sequence[RouteCheck] = ()
) -> tuple[Table, bool]:
    """The check of an append stream's table (every order exactly once), and whether it passed."""
    misrouted = sum(route.misrouted for route in routes)
    ok = check.duplicates == 0 and check.missing == 0 and check.rows == events and misrouted == 0
    results = Table(title="exactly once?" + (" [green]yes[/green]" if ok else " [red]NO[/red]"), show_header=False)
    results.add_column(style="bold")
    results.add_column(justify="right")
    for label, value in [
        ("records produced", events),
        ("rows in the Iceberg table" + ("s" if routes else ""), check.rows),
        ("distinct order ids", check.distinct_orders),
        ("duplicates (order ids seen more than once)", check.duplicates),
        ("missing (order ids not in the table)", check.missing),
        ("epochs (Spark micro-batches) committed", committed_epochs),
        ("Iceberg snapshots written by the sink", check.snapshots),
    ]:
        style = "red" if label.startswith(("duplicates", "missing")) and value else ""
        results.add_row(label, f"[{style}]{value:,}[/{style}]" if style else f"{value:,}")
    if routes:
        results.add_row("misrouted (rows in a table not routed their country)", f"{misrouted:,}")
    return results, ok


def print_summary(
    results: Table,
    ok: bool,
    settings: Settings,
    phases: Phases,
    where: dict[str, str],
    reading: str,
    routes: Sequence[RouteCheck] = (),
) -> None:
    """The results, the time of each phase, where things are, and (whole lines, to paste) how to read the table."""
    # The defaults at work: epochs checkpointed within one interval share a snapshot; maintenance keeps the
    # table's metadata and files bounded however long it streams (docs/operations.md).
    results.add_row("commit interval (epochs meanwhile: one snapshot)", f"{settings.commit_interval_seconds:g} s")
    results.add_row(
        "table maintenance (expiry, merge, compaction, sweep)",
        f"every {settings.maintenance_interval_seconds:g} s" if settings.maintenance_enabled else "off",
    )
    tables = Table(title="fan-out: the orders by country")
    for column in ("table", "countries routed to it", "rows", "misrouted"):
        tables.add_column(column, justify="right" if column in ("rows", "misrouted") else "left")
    for route in routes:
        tables.add_row(route.table, ", ".join(route.countries), f"{route.rows:,}", f"{route.misrouted:,}")
    timings = Table(title="time per phase", show_header=False)
    timings.add_column(style="bold")
    timings.add_column(justify="right")
    for name, seconds in phases.seconds.items():
        timings.add_row(name, f"{seconds:.1f} s")
    timings.add_row("total", f"{sum(phases.seconds.values()):.1f} s")
    places = Table(title="where things are", show_header=False)
    places.add_column(style="bold")
    places.add_column(overflow="fold")
    for place, location in where.items():
        places.add_row(place, location)
    console.print(results, *([tables] if routes else []), timings, places)
    console.print("read the table:", reading, sep="\n", soft_wrap=True, markup=False, highlight=False)
    if not ok:
        raise typer.Exit(1)


def read_the_table(access: CatalogAccess, data_dir: Path, *, secrets_are_local: bool) -> str:
    """pyiceberg's and DuckDB's lines for the demo's table, and the command that prints Spark's too."""
    spark = f"sink-coordinator catalog {access.table}" + (
        "" if data_dir == Path(".sink-coordinator").resolve() else f" --data-dir {data_dir}"
    )
    return "\n".join(
        [
            *access.pyiceberg(show_secrets=secrets_are_local),
            *access.duckdb(show_secrets=secrets_are_local),
            f"(Spark's lines too: {spark})",
        ]
    )


def while_serving(keep_serving: bool, s3: bool) -> str:
    """Where the console and the API are once the demo ended."""
    if keep_serving:
        return ""
    if s3:  # `make serve` has another data dir, and the emulator holding the table goes with the demo
        return (
            ", while the coordinator runs: run the demo with --keep-serving (the S3 and Glue emulator, and the "
            "table, go with the demo)"
        )
    return ", while the coordinator runs: --keep-serving, or `make serve`"
