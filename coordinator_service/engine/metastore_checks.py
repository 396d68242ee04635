"""Is the log in step with the tables? A metastore restored to an earlier point, another table, another catalog.

The tables are the truth about what they hold: every snapshot the coordinator writes carries its sink's marker,
and only checkpointed epochs are appended. So a table whose newest marker of the sink is above the log's recorded
checkpoint means the log went back in time (the metastore restored from an earlier backup while the catalog stayed
current). A table whose UUID is not the one recorded is another table under the same name; a sink created in
another catalog than the one configured now finds tables that are not its own (or none, and would create new empty
ones). Serving such a sink would report wrong epochs, refuse its running writer with a confusing message, or commit
into the wrong table.

Checked at start and every METASTORE_CHECK_INTERVAL_SECONDS, for every sink and each of its tables: a sink found
out of step is suspended (sinks.suspended_reason): nothing is committed, pre-committed, checkpointed or registered
for it, the gauge sink_coordinator_sink_suspended says so, and the reason names the way back (the admin API's
reconcile, or the configuration); a sink found in step again (the configuration fixed) is resumed by the next check.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

import structlog

from coordinator_service.contract.errors import InvalidArgument, cause
from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.engine import settlement
from coordinator_service.engine.committer import Committer
from coordinator_service.log import sink_rows, sink_tables
from coordinator_service.log.database import Database
from coordinator_service.log.models import Sink
from coordinator_service.log.sink_tables import RecordedTable
from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)

NEWEST = 2**63 - 1


@dataclass(frozen=True)
class TableSeen:
    """One of a sink's tables as the catalog has it: its UUID and the newest epoch its markers say it holds."""

    table_uuid: uuid.UUID
    newest_marker: int | None


def table_seen(tables: TableFormat, identifier: str, sink: SinkIdentity) -> TableSeen:
    """Blocking: the table loaded now (InvalidArgument when it does not exist), its UUID and newest own marker."""
    table = tables.load(identifier)
    markers = tables.sink_markers(identifier, sink, NEWEST, table)
    return TableSeen(tables.identity(table).uuid, markers[-1].epoch if markers else None)


def out_of_step(sink: Sink, table: RecordedTable, seen: TableSeen | None, catalog: str) -> str | None:
    """Why the log is out of step with this table, or None."""
    if sink.catalog != catalog:
        return (
            f"sink {sink.name} was created in catalog {sink.catalog!r}, but the coordinator now uses catalog "
            f"{catalog!r}: configure the catalog it was created in (docs/operations.md, 'Moving a sink')"
        )
    if seen is None:
        return (
            f"table {table.identifier} of sink {sink.name} does not exist in catalog {catalog!r}: the catalog changed, "
            "or the table was dropped; configure the right catalog, or remove a fan-out table from the sink"
        )
    if table.table_uuid is not None and seen.table_uuid != table.table_uuid:
        return (
            f"table {table.identifier} of sink {sink.name} is table {seen.table_uuid}, not {table.table_uuid} the log "
            "recorded: another table under its name (dropped and created again, or another catalog). Reconcile the "
            f"sink to take it as its own (POST /api/v1/sinks/{sink.name}/reconcile)"
        )
    if seen.newest_marker is not None and seen.newest_marker > sink.checkpointed_epoch:
        return (
            f"table {table.identifier} holds epoch {seen.newest_marker} of sink {sink.name}, but the log's checkpoint "
            f"is epoch {sink.checkpointed_epoch}: the metastore is behind the table (restored from an earlier "
            f"backup?). Reconcile the sink to the tables (POST /api/v1/sinks/{sink.name}/reconcile; "
            "docs/operations.md, 'A restored metastore')"
        )
    return None


class MetastoreChecks:
    """Checks every sink against its tables at start and every METASTORE_CHECK_INTERVAL_SECONDS."""

    def __init__(self, database: Database, iceberg: TableFormat, committer: Committer, settings: Settings) -> None:
        self.database = database
        self.iceberg = iceberg
        self.committer = committer
        self.settings = settings
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._check_forever(), name="metastore-checks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _check_forever(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # each sink's failure is logged by check_all
                await self.check_all()
            await asyncio.sleep(self.settings.metastore_check_interval_seconds)

    async def check_all(self) -> dict[str, str]:
        """Check every sink; the sinks out of step, with why (they are suspended)."""
        async with self.database.transaction() as session:
            sinks = await sink_rows.all_sinks(session)
            tables = await sink_tables.tables_of_sinks(session, [sink.id for sink in sinks])
        found: dict[str, str] = {}
        for sink in sinks:
            try:
                reason = await self.check(sink, tables[sink.id])
            except Exception as error:  # the catalog unreachable, say: nothing is decided on it
                log.warning("a sink could not be checked against its tables", sink=sink.name, error=cause(error))
                continue
            if reason is not None:
                found[sink.name] = reason
        return found

    async def check(self, sink: Sink, tables: list[RecordedTable]) -> str | None:
        """Check one sink's tables; suspend it when one is out of step, resume it when all are in step again."""
        identity = settlement.identity_of(sink)
        reason = None
        for table in tables:
            try:
                seen: TableSeen | None = await in_catalog(table_seen, self.iceberg, table.identifier, identity)
            except InvalidArgument:
                seen = None
            reason = out_of_step(sink, table, seen, self.iceberg.catalog_name)
            if reason is not None:
                # `sink` was read before the table: a commit meanwhile takes the table past the checkpoint read then,
                # as a restored metastore would. Decide on the log as it is now that the table is read (its
                # checkpoint only grows, and a table never holds an epoch above it).
                async with self.database.transaction() as session:
                    now = await sink_rows.sink_by_id(session, sink.id)
                if now is None or settlement.identity_of(now) != identity:
                    return sink.suspended_reason  # deleted or reset meanwhile: the next check decides
                sink = now
                reason = out_of_step(sink, table, seen, self.iceberg.catalog_name)
            if reason is not None:
                break
            if table.table_uuid is None and seen is not None:
                async with self.database.transaction() as session:
                    await sink_tables.record_table_uuid(session, sink.id, table.identifier, seen.table_uuid)
        async with self.database.transaction() as session:
            changed = await sink_rows.set_suspended(session, sink.id, reason)
        if changed and reason is not None:
            log.error("sink suspended: the log is out of step with its tables", sink=sink.name, reason=reason)
        elif changed:
            log.warning("sink resumed: the log is in step with its tables again", sink=sink.name)
            await self.committer.resume(sink.id)
        return reason
