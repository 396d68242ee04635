"""The `sink-coordinator` command: serve, migrate, status, catalog, delete, reconcile, verify (verify.py).

Every setting is a flag of the same name (--grpc-port for
SINK_COORDINATOR_GRPC_PORT), of the setting's type and with its default
(--maintenance-enabled/--no-maintenance-enabled, --compaction-target-file-bytes 128MiB,
--catalog key=value); flags win over the environment. The service's modules (SQLAlchemy, pyiceberg, the servers)
load inside the commands that use them, once the flags and the ports are checked: a refusal is said at once.
"""

from __future__ import annotations

import asyncio
import getpass
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from coordinator_service import listening
from coordinator_service.admin import display
from coordinator_service.cli.flags import METASTORE, console, reaching_metastore, refuse, with_settings
from coordinator_service.contract.errors import (
    CannotServe,
    CoordinatorError,
    InvalidArgument,
    NotFound,
    SchemaNotCurrent,
    quote,
)
from coordinator_service.contract.logs import configure_logging
from coordinator_service.settings import Settings
from coordinator_service.tables.warehouse import serving_refusal

if TYPE_CHECKING:  # the service's modules load in the commands that use them (see the module)
    from sqlalchemy.engine import URL

    from coordinator_service.engine.operations import Operations
    from coordinator_service.engine.operator.answers import Operator, SinkDeleted, SuspendedReconciled
    from coordinator_service.log.database import Database

app = typer.Typer(
    name="sink-coordinator",
    help="Exactly-once commits from Spark micro-batches to Apache Iceberg, through a PostgreSQL log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's own help: rich's boxes cut flag and variable names to fit their columns. As wide as the terminal, up
    # to 120 columns.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


@app.command()
@with_settings()
def serve(settings: Settings) -> None:
    """Serve the gRPC writer API and the HTTP admin API until SIGTERM or Ctrl-C."""
    refusal = serving_refusal(settings)
    if refusal is not None:
        refuse("invalid configuration", ValueError(refusal), code=2)
    from coordinator_service.supervisor import ServingProcess, supervise

    process = ServingProcess.from_environment()
    try:
        if process is not None:  # one of a supervisor's serving processes: its ports are the supervisor's
            process.follow_supervisor()
            configure_logging(settings.log_level, settings.log_format, process=process.index)
            settings = process.settings(settings)
        elif settings.processes > 1:
            asyncio.run(supervise(settings, sys.argv[1:]))
            return
        else:
            # Said before the service loads (seconds): the service binds them for good (coordinator_service.app).
            listening.check_free(settings.bind_host, settings.http_port, "HTTP")
            listening.check_free(settings.bind_host, settings.grpc_port, "gRPC")
        from coordinator_service.app import serve as serve_forever

        asyncio.run(serve_forever(settings, process=process))
    except (SchemaNotCurrent, CannotServe) as error:
        if process is not None:  # its supervisor says it, once
            process.tell_refusal(error)
            raise typer.Exit(1) from None
        refuse("cannot serve", error)


@app.command()
@with_settings(*METASTORE, "migration_lock_timeout_seconds", "migration_retry_seconds")
def migrate(
    settings: Settings,
    to: Annotated[
        str,
        typer.Option(
            help="The schema revision to upgrade or roll back to (a rollback: the revision the release rolled back to "
            "knows as its head; docs/operations.md, 'Upgrades and rollbacks'). head: this release's.",
        ),
    ] = "head",
) -> None:
    """Create or upgrade the metastore schema (sinks, pending_sink_state), or roll it back with --to."""
    from alembic.util import CommandError

    from coordinator_service.runtime import metastore_url
    from coordinator_service.runtime import migrate as migrate_metastore

    url, embedded = metastore_url(settings)
    with reaching_metastore(url):
        try:
            revision = migrate_metastore(
                url, to, settings.migration_lock_timeout_seconds, settings.migration_retry_seconds
            )
        except (CommandError, ValueError) as error:
            refuse("cannot migrate", error, 2)
    where = f"embedded PostgreSQL in {settings.data_dir}" if embedded else url.render_as_string(hide_password=True)
    console.print(f"metastore at revision {revision}: {where}")


@app.command()
@with_settings(*METASTORE, "stalled_after_seconds")
def status(settings: Settings) -> None:
    """Show every sink (its writer, progress, last commit, the sinks sharing its tables) and its epochs not yet
    committed, as the metastore has them (whether or not a coordinator runs)."""
    from coordinator_service.log.database import ConnectionOptions, Database
    from coordinator_service.runtime import metastore_url, require_migrated

    url, _ = metastore_url(settings)
    with reaching_metastore(url):
        try:
            require_migrated(url)
        except SchemaNotCurrent as error:
            refuse("cannot read the metastore", error)
        asyncio.run(_print_status(Database(url, ConnectionOptions(pool_size=1)), settings.stalled_after_seconds))


@app.command()
@with_settings(*METASTORE, "catalog_name", "catalog")
def catalog(
    settings: Settings,
    table: Annotated[
        str | None, typer.Argument(help="A table, e.g. shop.orders: the lines read it.", metavar="TABLE")
    ] = None,
    show_secrets: Annotated[
        bool, typer.Option(help="Print passwords, tokens and credentials instead of hiding them.")
    ] = False,
) -> None:
    """Print how to read the coordinator's tables: the lines to paste into pyiceberg, DuckDB and Spark, for the
    catalog it uses with these settings (the embedded defaults, or CATALOG__*)."""
    from coordinator_service.runtime import catalog_properties, metastore_url
    from coordinator_service.tables.catalog_access import CatalogAccess

    url, _ = metastore_url(settings)
    access = CatalogAccess(settings.catalog_name, catalog_properties(settings, url), table)
    if table is not None:
        try:
            with reaching_metastore(url):
                access = replace(access, metadata_location=_metadata_location(settings, url, table))
        except CoordinatorError as error:
            refuse("cannot read the table", error, code=2 if isinstance(error, InvalidArgument) else 1)
    Console(soft_wrap=True).print(access.text(show_secrets), markup=False, highlight=False)


def _metadata_location(settings: Settings, url: URL, table: str) -> str:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from coordinator_service.contract.table_identifiers import check_table_identifier
    from coordinator_service.runtime import open_catalog

    check_table_identifier(table)
    try:
        location: str = open_catalog(settings, url).load_table(table).metadata_location
    except (NoSuchTableError, NoSuchNamespaceError):
        raise NotFound(f"table {quote(table)} does not exist in catalog {settings.catalog_name}") from None
    return location


@app.command()
@with_settings(*METASTORE, "catalog_name", "catalog", "stalled_after_seconds", "admin_lock_timeout_seconds")
def delete(
    settings: Settings,
    sink: Annotated[str, typer.Argument(help="The sink to delete.", metavar="SINK")],
    confirm: Annotated[str, typer.Option(help="The sink's name again, to confirm.")],
    reason: Annotated[str, typer.Option(help="Why; recorded in the log with who deleted it.")],
    drop_tables: Annotated[
        bool, typer.Option(help="Drop its tables too (their own files deleted when proven garbage); refused if shared.")
    ] = False,
) -> None:
    """Delete a sink: its rows in the metastore and the files of its epochs not committed; with --drop-tables its
    tables too. Refused while its writer is live. The same rules as the admin API's POST /api/v1/sinks/{sink}/delete,
    run from here against the metastore and the catalog (whether or not a coordinator runs)."""
    if not reason.strip() or "\x00" in reason:
        refuse("cannot delete", ValueError("give the reason (--reason): it is recorded"), code=2)
    from coordinator_service.runtime import metastore_url

    url, _ = metastore_url(settings)
    try:
        with reaching_metastore(url):
            deleted = asyncio.run(_delete(settings, sink, confirm, reason, drop_tables))
    except CoordinatorError as error:
        refuse("cannot delete", error, code=2 if isinstance(error, InvalidArgument) else 1)
    except SchemaNotCurrent as error:
        refuse("cannot delete", error)
    Console(soft_wrap=True).print(deleted.summary(), markup=False)


async def _delete(settings: Settings, sink: str, confirm: str, reason: str, drop_tables: bool) -> SinkDeleted:
    async with _operations(settings) as (operations, operator):
        return await operations.delete_sink(sink, confirm, reason, drop_tables, operator)


@app.command()
@with_settings(*METASTORE, "catalog_name", "catalog", "admin_lock_timeout_seconds")
def reconcile(
    settings: Settings,
    reason: Annotated[str, typer.Option(help="Why; recorded in the log with who reconciled.")],
    sinks: Annotated[
        list[str] | None, typer.Argument(help="The suspended sinks to reconcile (or --all).", metavar="SINK")
    ] = None,
    all_suspended: Annotated[
        bool, typer.Option("--all", help="Reconcile every sink that is suspended now (after a restore).")
    ] = False,
) -> None:
    """Reconcile suspended sinks to their tables (after the metastore was restored to an earlier point: every sink
    the restore put behind its tables, with --all): each as the admin API's POST /api/v1/sinks/{sink}/reconcile does,
    run from here against the metastore and the catalog (whether or not a coordinator runs). Prints each sink's
    restart epoch; exits 1 when one could not be reconciled (the others are). Stop the sinks' writers first."""
    if bool(sinks) == all_suspended:
        refuse("cannot reconcile", ValueError("name the suspended sinks to reconcile, or give --all"), code=2)
    if not reason.strip() or "\x00" in reason:
        refuse("cannot reconcile", ValueError("give the reason (--reason): it is recorded"), code=2)
    from coordinator_service.runtime import metastore_url

    url, _ = metastore_url(settings)
    try:
        with reaching_metastore(url):
            outcome = asyncio.run(_reconcile(settings, None if all_suspended else sinks, reason))
    except CoordinatorError as error:
        refuse("cannot reconcile", error, code=2 if isinstance(error, InvalidArgument) else 1)
    except SchemaNotCurrent as error:
        refuse("cannot reconcile", error)
    Console(soft_wrap=True).print("\n".join(outcome.summary()), markup=False)
    if outcome.refused:
        raise typer.Exit(1)


async def _reconcile(settings: Settings, sinks: list[str] | None, reason: str) -> SuspendedReconciled:
    async with _operations(settings) as (operations, operator):
        return await operations.reconcile_suspended(sinks, reason, operator)


@asynccontextmanager
async def _operations(settings: Settings) -> AsyncIterator[tuple[Operations, Operator]]:
    """The operator's actions on the metastore and the catalog of `settings`, as this command line's user."""
    from coordinator_service.engine.operations import Operations
    from coordinator_service.engine.operator.answers import Operator
    from coordinator_service.runtime import Runtime

    runtime = await Runtime.open(settings)
    try:
        operations = Operations(
            runtime.database, runtime.iceberg, runtime.committer, runtime.cleaner, runtime.maintainer, settings
        )
        yield operations, Operator("cli", f"{getpass.getuser()}@{socket.gethostname()}")
    finally:
        await runtime.close()


async def _print_status(database: Database, stalled_after_seconds: float) -> None:
    from coordinator_service.engine.operator.base import sink_overviews
    from coordinator_service.log import epoch_reads

    try:
        async with database.transaction() as session:
            overviews = await sink_overviews(session, {}, stalled_after_seconds)
            open_epochs = [(o.sink.name, await epoch_reads.epochs_not_committed(session, o.sink.id)) for o in overviews]
    finally:
        await database.dispose()
    out = Console()
    longest = max((len(overview.sink.name) for overview in overviews), default=4)
    sinks_table = Table(title="sinks")
    # The names whole (a terminal narrower than the table folds the other cells, never these).
    sinks_table.add_column("sink", no_wrap=True, min_width=longest)
    sinks_table.add_column("table", overflow="fold")
    for column in ("state", "writer"):
        sinks_table.add_column(column, overflow="fold")
    for column in ("checkpointed", "committed", "pending", "aborted"):
        sinks_table.add_column(column, justify="right", overflow="fold")
    sinks_table.add_column("last commit", overflow="fold")
    for overview in overviews:
        sink, counts = overview.sink, overview.counts
        shared = sorted({other for others in overview.also_written_by.values() for other in others})
        called = counts.writer_last_call_age_seconds
        sinks_table.add_row(
            sink.name,
            sink.table_identifier + (f" (shared with {', '.join(shared)})" if shared else ""),
            "stalled" if overview.stalled else "waiting" if counts.pending else "committed",
            f"term {sink.writer_term}, " + ("no call" if called is None else f"{display.duration(called)} ago"),
            display.epoch(sink.checkpointed_epoch),
            display.epoch(sink.committed_epoch),
            str(counts.pending),
            str(counts.aborted),
            display.moment(counts.last_commit_at),
        )
    epochs_table = Table(title="epochs not committed")
    epochs_table.add_column("sink", no_wrap=True, min_width=longest)
    for column in ("epoch", "status", "attempt", "files", "records"):
        epochs_table.add_column(column, justify="right" if column != "status" else "left", overflow="fold")
    epochs_table.add_column("reason", overflow="fold")
    for name, epochs in open_epochs:
        for epoch in epochs:
            epochs_table.add_row(
                name,
                str(epoch.epoch),
                epoch.status.value,
                str(epoch.attempt),
                str(epoch.file_count),
                str(epoch.record_count),
                epoch.reason or "",
            )
    out.print(sinks_table)
    for overview in overviews:
        if overview.stalled:
            out.print(f"{overview.sink.name} is stalled: {overview.stalled}")
    if epochs_table.row_count:
        out.print(epochs_table)


from coordinator_service.cli import verify as _verify_command  # noqa: E402,F401  (registers `verify` on app)
