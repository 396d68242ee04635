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
from sqlalchemy import Connection, inspect, text

from coordinator_service.contract.errors import SchemaNotCurrent, quote


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


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this release's migrations know."""
    return frozenset(script.revision for script in _scripts().walk_revisions())


def check_target(revision: str) -> None:
    """Refuse (ValueError, nothing touched) a revision to migrate to that is neither head nor one of this release's."""
    if revision != "head" and revision not in known_revisions():
        known = sorted(known_revisions())
        raise ValueError(
            f"this release knows no schema revision {quote(revision)}: give one from {known[0]} to {known[-1]} (a "
            "rollback: the head of the release rolled back to), or head"
        )


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(connection: Connection, revision: str = "head", lock_timeout_seconds: float = 10.0) -> None:
    """Apply the migrations up to `revision`, each waiting at most `lock_timeout_seconds` for a lock (the pods of the
    release being replaced keep serving meanwhile: a migration never queues behind their transactions for long),
    then record which releases' code runs on the schema it leaves (oldest_compatible_code)."""
    config = _alembic_config(connection)
    config.attributes["lock_timeout_seconds"] = lock_timeout_seconds
    command.upgrade(config, revision)
    _record_compatibility(connection)


def downgrade(connection: Connection, revision: str, lock_timeout_seconds: float = 10.0) -> None:
    """Undo the migrations above `revision` (a rollback: the release that knows `revision` as its head runs on it)."""
    config = _alembic_config(connection)
    config.attributes["lock_timeout_seconds"] = lock_timeout_seconds
    command.downgrade(config, revision)
    _record_compatibility(connection)


def oldest_compatible_code(revision: str) -> str:
    """The oldest release head whose code runs on the schema at `revision`: a migration that only adds (expand)
    declares OLDEST_COMPATIBLE_CODE, the head the releases before it stopped at, and keeps it; one that changes
    or removes what older code uses (contract) declares none, and only code that knows it runs on it."""
    oldest = "0000"
    for script in reversed(list(_scripts().walk_revisions("base", revision))):
        declared = getattr(script.module, "OLDEST_COMPATIBLE_CODE", None)
        oldest = max(oldest, script.revision if declared is None else declared)
    return oldest


def _record_compatibility(connection: Connection) -> None:
    current = current_revision(connection)
    if current is None or not inspect(connection).has_table("schema_compatibility"):
        return  # a schema from before revision 0011
    connection.execute(text("DELETE FROM schema_compatibility"))
    connection.execute(
        text("INSERT INTO schema_compatibility (oldest_compatible_code) VALUES (:oldest)"),
        {"oldest": oldest_compatible_code(current)},
    )


def require_current_schema(connection: Connection) -> None:
    """Refuse to run on a metastore this release cannot run on: one not migrated to its head, or a newer one that
    does not declare this release's code compatible (a rolling upgrade keeps the old pods ready only while the new
    release's migrations are the expanding kind; docs/operations.md, 'Upgrades and rollbacks')."""
    current = current_revision(connection)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaNotCurrent(
            "the metastore has no sink-coordinator schema yet: run `sink-coordinator migrate` "
            "(with the same SINK_COORDINATOR_DATABASE_URL) before `serve`"
        )
    if current not in known_revisions():
        oldest = connection.execute(text("SELECT oldest_compatible_code FROM schema_compatibility")).scalar()
        if oldest is not None and str(oldest) <= head:
            return
        raise SchemaNotCurrent(
            f"the metastore schema is at revision {current}, newer than this release knows (head {head}) and not "
            f"compatible with it (it needs a release at {oldest or current} or newer): upgrade sink-coordinator, or "
            "point it at another database"
        )
    raise SchemaNotCurrent(
        f"the metastore schema is at revision {current}, older than this release (head {head}): "
        "run `sink-coordinator migrate`"
    )
