"""Applying and checking the metastore's Alembic migrations.

The migration scripts are read once per process (they ship inside the package and
do not change while it runs): a readiness probe checks the database's revision
against the head read at the first check, without parsing every script again.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from coordinator_service.errors import SchemaNotCurrent


def _alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(str(files("coordinator_service.migrations")))))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_alembic_config())


@cache
def head_revision() -> str:
    head = _scripts().get_current_head()
    assert head is not None, "the migrations directory has no revision"
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(connection: Connection, revision: str = "head") -> None:
    command.upgrade(_alembic_config(connection), revision)


def require_current_schema(connection: Connection) -> None:
    """Refuse to run on a metastore that this release has not migrated."""
    current = current_revision(connection)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaNotCurrent(
            "the metastore has no sink-coordinator schema yet: run `sink-coordinator migrate` "
            "(with the same SINK_COORDINATOR_DATABASE_URL) before `serve`"
        )
    known = {revision.revision for revision in _scripts().walk_revisions()}
    if current not in known:
        raise SchemaNotCurrent(
            f"the metastore schema is at revision {current}, newer than this release knows (head {head}): "
            "upgrade sink-coordinator, or point it at another database"
        )
    raise SchemaNotCurrent(
        f"the metastore schema is at revision {current}, older than this release (head {head}): "
        "run `sink-coordinator migrate`"
    )
