"""The log's statements on a sink's tables (sink_tables): the tables and what each holds, added, re-based, removed,
recorded after a commit."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.log.models import (
    Sink,
    SinkTableRecord,
)


@dataclass(frozen=True)
class RecordedTable:
    """One of a sink's tables and the newest epoch it holds (see models.SinkTableRecord)."""

    sink_id: int
    identifier: str
    committed_epoch: int
    # The table's UUID as the first check of the sink found it (metastore_checks); None before.
    table_uuid: uuid.UUID | None = None


# The sink's own table first, then the others by name.
_TABLES_OF_SINKS = """
    SELECT t.sink_id, t.table_identifier, t.committed_epoch, t.table_uuid
    FROM sink_tables t JOIN sinks s ON s.id = t.sink_id
    WHERE t.sink_id = ANY(:sink_ids)
    ORDER BY t.sink_id, t.table_identifier <> s.table_identifier, t.table_identifier
"""


async def tables_of_sinks(session: AsyncSession, sink_ids: Sequence[int]) -> dict[int, list[RecordedTable]]:
    """The tables of each of these sinks, each sink's own first, then the others by name."""
    rows = await session.execute(text(_TABLES_OF_SINKS), {"sink_ids": list(sink_ids)})
    tables: dict[int, list[RecordedTable]] = {sink_id: [] for sink_id in sink_ids}
    for sink_id, table, committed_epoch, table_uuid in rows.all():
        tables[sink_id].append(RecordedTable(sink_id, table, committed_epoch, table_uuid))
    return tables


async def tables_of_sink(session: AsyncSession, sink_id: int) -> list[RecordedTable]:
    return (await tables_of_sinks(session, [sink_id]))[sink_id]


async def recorded_epochs(session: AsyncSession, sink_id: int) -> dict[str, int]:
    """The newest epoch each of the sink's tables holds, as the log records it."""
    return {table.identifier: table.committed_epoch for table in await tables_of_sink(session, sink_id)}


async def add_tables(session: AsyncSession, sink: Sink, tables: Sequence[str]) -> None:
    """Make these tables the sink's (those it has stay as they are), in the caller's transaction, which holds the
    sink's row lock: a new table holds every epoch up to the sink's committed one, none of which has files in it."""
    if not tables:
        return
    await session.execute(
        insert(SinkTableRecord)
        .values(
            [
                {"sink_id": sink.id, "table_identifier": table, "committed_epoch": sink.committed_epoch}
                for table in tables
            ]
        )
        .on_conflict_do_nothing(index_elements=[SinkTableRecord.sink_id, SinkTableRecord.table_identifier])
    )


async def record_table_uuid(session: AsyncSession, sink_id: int, table: str, table_uuid: uuid.UUID) -> None:
    await session.execute(
        update(SinkTableRecord)
        .where(SinkTableRecord.sink_id == sink_id, SinkTableRecord.table_identifier == table)
        .values(table_uuid=table_uuid)
    )


async def record_tables_at(session: AsyncSession, sink_id: int, held: Mapping[str, int]) -> None:
    """Set the newest epoch each of these tables holds, as found in the tables (a reconcile): forward or back."""
    for table, epoch in held.items():
        await session.execute(
            update(SinkTableRecord)
            .where(SinkTableRecord.sink_id == sink_id, SinkTableRecord.table_identifier == table)
            .values(committed_epoch=epoch, updated_at=func.now())
        )


async def remove_table(session: AsyncSession, sink_id: int, table: str) -> None:
    """The table stops being one of the sink's (an operator's way out of a table dropped for good)."""
    await session.execute(
        delete(SinkTableRecord).where(SinkTableRecord.sink_id == sink_id, SinkTableRecord.table_identifier == table)
    )


async def rebase_tables(session: AsyncSession, sink_id: int, epoch: int) -> None:
    """A new epoch numbering (the first writer after a reset): every table of the sink is at its first epoch."""
    await session.execute(
        update(SinkTableRecord)
        .where(SinkTableRecord.sink_id == sink_id)
        .values(committed_epoch=epoch, updated_at=func.now())
    )


# The sink's numbering is checked on its row locked (FOR SHARE: its newest version, a rebase that committed after
# the statement's snapshot included), not as the snapshot has it: a table row re-read at its newest version after
# waiting for a rebase must not take an epoch of the numbering before it.
_RECORD_TABLES = """
    WITH sink AS (
        SELECT id FROM sinks
        WHERE id = :sink_id AND incarnation = :incarnation AND generation = :generation FOR SHARE
    )
    UPDATE sink_tables t SET committed_epoch = r.epoch, updated_at = now()
    FROM unnest(CAST(:tables AS text[]), CAST(:table_epochs AS bigint[])) AS r(table_identifier, epoch)
    WHERE t.sink_id = (SELECT id FROM sink) AND t.table_identifier = r.table_identifier AND t.committed_epoch < r.epoch
"""


async def record_tables(connection: AsyncConnection, sink: Sink, held: Mapping[str, int]) -> None:
    """Record the newest epoch each of these tables holds (in the sink's numbering as `sink` has it; nothing
    after a reset or for another incarnation): a table's epoch only moves forward."""
    await connection.execute(text(_RECORD_TABLES), {**table_parameters(held), **numbering_parameters(sink)})


def table_parameters(held: Mapping[str, int]) -> dict[str, object]:
    return {"tables": list(held), "table_epochs": list(held.values())}


def numbering_parameters(sink: Sink) -> dict[str, object]:
    return {"sink_id": sink.id, "incarnation": sink.incarnation, "generation": sink.generation}
