"""The `sink-coordinator` command: serve, migrate, status.

Every setting is a flag of the same name (--grpc-port for
SINK_COORDINATOR_GRPC_PORT); flags win over the environment.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from coordinator_service import repository
from coordinator_service.database import Database
from coordinator_service.errors import SchemaNotCurrent
from coordinator_service.logs import configure_logging
from coordinator_service.runtime import metastore_url, require_migrated
from coordinator_service.runtime import migrate as migrate_metastore
from coordinator_service.settings import ENV_PREFIX, Settings
from coordinator_service.views import EpochStatus

app = typer.Typer(
    name="sink-coordinator",
    help="Exactly-once commits from Spark micro-batches to Apache Iceberg, through a PostgreSQL log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)


def _settings_from(options: dict[str, Any]) -> Settings:
    given: dict[str, Any] = {name: value for name, value in options.items() if value is not None}
    if "catalog" in given:
        pairs = given.pop("catalog")
        bad = [pair for pair in pairs if "=" not in pair]
        if bad:
            raise typer.BadParameter(f"--catalog takes key=value, got {bad}")
        given["catalog"] = dict(pair.split("=", 1) for pair in pairs)
    try:
        settings = Settings(**given)
    except ValidationError as error:
        problems = "; ".join(
            f"{ENV_PREFIX}{'_'.join(str(part) for part in item['loc']).upper() or 'SETTINGS'}: {item['msg']}"
            for item in error.errors()
        )
        console.print(f"[red]invalid configuration:[/red] {problems}")
        raise typer.Exit(2) from None
    configure_logging(settings.log_level, settings.log_format)
    return settings


def with_settings(command: Callable[[Settings], None]) -> Callable[..., None]:
    """Give a command one flag per setting and call it with the resulting Settings."""
    parameters = []
    for name, field in Settings.model_fields.items():
        env = f"{ENV_PREFIX}{name.upper()}"
        if name == "catalog":
            env = f"{ENV_PREFIX}CATALOG__<KEY>"
        help_text = f"{field.description} (env: {env})"
        annotation: Any = list[str] | None if name == "catalog" else str | None
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    annotation,
                    typer.Option(f"--{name.replace('_', '-')}", help=help_text, show_default=False),
                ],
            )
        )

    @wraps(command)
    def wrapper(**options: Any) -> None:
        command(_settings_from(options))

    wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return wrapper


@app.command()
@with_settings
def serve(settings: Settings) -> None:
    """Serve the gRPC writer API and the HTTP admin API until SIGTERM or Ctrl-C."""
    from coordinator_service.app import serve as serve_forever

    try:
        asyncio.run(serve_forever(settings))
    except SchemaNotCurrent as error:
        console.print(f"[red]cannot serve:[/red] {error}")
        raise typer.Exit(1) from None


@app.command()
@with_settings
def migrate(settings: Settings) -> None:
    """Create or upgrade the metastore schema (sinks, pending_sink_state)."""
    url, embedded = metastore_url(settings)
    revision = migrate_metastore(url)
    where = f"embedded PostgreSQL in {settings.data_dir}" if embedded else url.render_as_string(hide_password=True)
    console.print(f"metastore at revision {revision}: {where}")


@app.command()
@with_settings
def status(settings: Settings) -> None:
    """Show every sink with its checkpointed and committed epochs and its epochs not yet committed."""
    url, _ = metastore_url(settings)
    try:
        require_migrated(url)
    except SchemaNotCurrent as error:
        console.print(f"[red]cannot read the metastore:[/red] {error}")
        raise typer.Exit(1) from None
    asyncio.run(_print_status(Database(url, pool_size=1)))


async def _print_status(database: Database) -> None:
    sinks_table = Table(title="sinks")
    for column in ("sink", "table", "term", "checkpointed", "committed", "pending", "aborted"):
        sinks_table.add_column(column, justify="right" if column not in ("sink", "table") else "left")
    epochs_table = Table(title="epochs not committed")
    for column in ("sink", "epoch", "status", "attempt", "files", "records", "reason"):
        epochs_table.add_column(column)
    try:
        async with database.transaction() as session:
            for sink in await repository.all_sinks(session):
                epochs = await repository.epochs_not_committed(session, sink.id)
                pending = [e for e in epochs if e.status == EpochStatus.PENDING]
                sinks_table.add_row(
                    sink.name,
                    sink.table_identifier,
                    str(sink.writer_term),
                    str(sink.checkpointed_epoch),
                    str(sink.committed_epoch),
                    str(len(pending)),
                    str(len(epochs) - len(pending)),
                )
                for epoch in epochs:
                    epochs_table.add_row(
                        sink.name,
                        str(epoch.epoch),
                        epoch.status.value,
                        str(epoch.attempt),
                        str(epoch.file_count),
                        str(epoch.record_count),
                        epoch.reason or "",
                    )
    finally:
        await database.dispose()
    out = Console()
    out.print(sinks_table)
    if epochs_table.row_count:
        out.print(epochs_table)


if __name__ == "__main__":
    app()
