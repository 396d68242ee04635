"""What a writer scope may create or take, decided before a RegisterWriter or an EnsureTables runs.

A call that would add a sink or a table to its scope (a sink not registered yet; a table not yet one of the
sink's) runs holding the scope's admission lock, a PostgreSQL advisory lock taken on a connection of its own,
so that calls of one scope that create, on any replica, are counted one after the other:

* quotas: the sinks the scope's patterns cover stay within max_sinks, the tables those sinks write within
  max_tables (coordinator_service.writer_scopes); QuotaExceeded (RESOURCE_EXHAUSTED) names the setting;
* origin: a table no sink writes yet must be missing (the call creates it), the coordinator's, or adopted by
  an operator (coordinator_service.tables.table_origin); FailedPrecondition names the admin action.

A call that adds nothing (a writer restarting, tables it ensured before) reads once and takes no lock.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

from sqlalchemy import ColumnElement, distinct, false, func, or_, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.errors import InvalidArgument, QuotaExceeded, Unavailable
from coordinator_service.contract.table_identifiers import check_sink_name, check_table_identifier
from coordinator_service.engine.writer_requests import MAX_TABLES_PER_ENSURE
from coordinator_service.log.database import Database
from coordinator_service.log.models import Sink, SinkTableRecord
from coordinator_service.settings.bounds import ENV_PREFIX
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat
from coordinator_service.writer_scopes import OPEN, UNSCOPED, Scope

# First key of the two-int advisory locks of scope admissions ("SW"); the commit locks use another.
ADMISSION_LOCK_CLASS: Final = 0x5357


class Admission:
    def __init__(self, database: Database, iceberg: TableFormat, lock_timeout_seconds: float) -> None:
        self.database = database
        self.iceberg = iceberg
        self.lock_timeout_seconds = lock_timeout_seconds

    @asynccontextmanager
    async def admitting(self, scope: Scope, sink: str, tables: Sequence[str]) -> AsyncIterator[None]:
        """Run the block as the call that may add `sink` and `tables` to the scope: at once when it adds
        nothing, else under the scope's lock once the quotas and the tables' origin allow it."""
        # The names first, by the name policy, and as many as a call may name: what the call would refuse never
        # reaches the metastore or the catalog.
        check_sink_name(sink)
        if len(tables) > MAX_TABLES_PER_ENSURE:
            raise InvalidArgument(f"{len(tables)} tables in one call exceed {MAX_TABLES_PER_ENSURE}")
        named = list(dict.fromkeys(tables))
        for table in named:
            check_table_identifier(table)
        async with self.database.reading() as session:
            new_sink, new_tables = await _additions(session, sink, named)
        if not new_sink and not new_tables:
            yield
            return
        async with self._scope_locked(scope):
            async with self.database.reading() as session:
                new_sink, new_tables = await _additions(session, sink, named)
                await _check_quotas(session, scope, new_sink, named)
                unwritten = set(new_tables) - await _written(session, new_tables)
            for table in sorted(unwritten):
                await in_catalog(self.iceberg.require_takeable, table)
            yield

    @asynccontextmanager
    async def _scope_locked(self, scope: Scope) -> AsyncIterator[None]:
        key = zlib.crc32(scope.name.encode()) - 2**31  # a signed int4
        async with self.database.connection(autocommit=True) as connection:
            try:
                await connection.execute(text(f"SET lock_timeout = {int(self.lock_timeout_seconds * 1000)}"))
                await connection.execute(
                    text("SELECT pg_advisory_lock(:class_id, :key)"), {"class_id": ADMISSION_LOCK_CLASS, "key": key}
                )
            except DBAPIError as error:
                if getattr(error.orig, "sqlstate", None) == "55P03":  # lock_not_available
                    raise Unavailable(
                        f"writer scope {scope.name}: another call creating a sink or a table of the scope has held "
                        f"its admission for over {self.lock_timeout_seconds} s; retry"
                    ) from error
                raise
            try:
                yield
            finally:
                await connection.execute(
                    text("SELECT pg_advisory_unlock(:class_id, :key)"), {"class_id": ADMISSION_LOCK_CLASS, "key": key}
                )


async def _additions(session: AsyncSession, sink: str, tables: list[str]) -> tuple[bool, list[str]]:
    """Whether the sink is new, and which of the tables are not the sink's yet."""
    row = await session.scalar(select(Sink.id).where(Sink.name == sink))
    if row is None:
        return True, tables
    held = set(
        await session.scalars(
            select(SinkTableRecord.table_identifier).where(
                SinkTableRecord.sink_id == row, SinkTableRecord.table_identifier.in_(tables)
            )
        )
    )
    return False, [table for table in tables if table not in held]


async def _written(session: AsyncSession, tables: list[str]) -> set[str]:
    """Those of the tables some sink writes."""
    statement = select(SinkTableRecord.table_identifier).where(SinkTableRecord.table_identifier.in_(tables)).distinct()
    return set(await session.scalars(statement))


async def _check_quotas(session: AsyncSession, scope: Scope, new_sink: bool, tables: list[str]) -> None:
    covered = _covered(scope)
    if new_sink:
        sinks = await session.scalar(select(func.count()).select_from(Sink).where(covered)) or 0
        if sinks >= scope.rules.max_sinks:
            raise QuotaExceeded(
                f"writer scope {scope.name} has {sinks} sinks, its quota ({scope.rules.max_sinks}): an operator "
                f"raises {_quota_setting(scope, 'MAX_SINKS')}. Nothing was changed"
            )
    scope_tables = (
        select(SinkTableRecord.table_identifier).join(Sink, Sink.id == SinkTableRecord.sink_id).where(covered)
    )
    held = set(await session.scalars(scope_tables.where(SinkTableRecord.table_identifier.in_(tables))))
    adding = [table for table in tables if table not in held]
    if not adding:
        return
    count = await session.scalar(select(func.count(distinct(scope_tables.subquery().c.table_identifier)))) or 0
    if count + len(adding) > scope.rules.max_tables:
        raise QuotaExceeded(
            f"writer scope {scope.name} writes {count} tables and the call adds {len(adding)}, over its quota "
            f"({scope.rules.max_tables}): an operator raises {_quota_setting(scope, 'MAX_TABLES')}. Nothing was "
            "changed"
        )


def _quota_setting(scope: Scope, field: str) -> str:
    if scope.name in (UNSCOPED, OPEN):
        return f"it by giving the writers a scope of their own ({ENV_PREFIX}WRITER_SCOPES__<scope>__{field})"
    return f"{ENV_PREFIX}WRITER_SCOPES__{scope.name}__{field}"


def _covered(scope: Scope) -> ColumnElement[bool]:
    """The sinks a scope's patterns cover, as SQL."""
    conditions: list[ColumnElement[bool]] = []
    for pattern in scope.rules.sinks:
        if pattern.endswith("*"):
            prefix = pattern[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conditions.append(Sink.name.like(prefix + "%", escape="\\"))
        else:
            conditions.append(Sink.name == pattern)
    return or_(false(), *conditions)
