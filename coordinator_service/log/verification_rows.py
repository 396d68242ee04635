"""The log's statements on where verification of a sink's tables stands (sink_verifications, migration 0016)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.log.models import VerificationRecord


@dataclass(frozen=True)
class VerificationRow:
    """One table's verification as recorded: `advance` False keeps where the proof stood (a failed verification)."""

    table: str
    snapshot_id: int | None
    verified_epoch: int
    end_offsets: dict[str, dict[str, int]]
    ok: bool
    faults: list[dict[str, object]]
    notes: list[str]
    deep: bool
    kafka: bool
    checked_at: datetime


async def verification_records(session: AsyncSession, sink_id: int) -> list[VerificationRecord]:
    """The sink's tables' verifications, by table name."""
    statement = (
        select(VerificationRecord)
        .where(VerificationRecord.sink_id == sink_id)
        .order_by(VerificationRecord.table_identifier)
    )
    return list((await session.execute(statement)).scalars().all())


async def record_verifications(session: AsyncSession, sink_id: int, rows: Sequence[VerificationRow]) -> None:
    """Record each table's last verification; one that failed keeps the snapshot, epoch and offsets proven before
    (none yet: those it started from)."""
    for row in rows:
        values = {
            "sink_id": sink_id,
            "table_identifier": row.table,
            "snapshot_id": row.snapshot_id,
            "verified_epoch": row.verified_epoch,
            "end_offsets": row.end_offsets,
            "outcome": "ok" if row.ok else "failed",
            "faults": row.faults,
            "notes": row.notes,
            "deep": row.deep,
            "kafka": row.kafka,
            "checked_at": row.checked_at,
        }
        kept = ("outcome", "faults", "notes", "deep", "kafka", "checked_at")
        updated = {name: values[name] for name in values if row.ok or name in kept}
        statement = insert(VerificationRecord).values(**values)
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=[VerificationRecord.sink_id, VerificationRecord.table_identifier],
                set_={
                    **{name: getattr(statement.excluded, name) for name in updated},
                    "updated_at": statement.excluded.checked_at,
                },
            )
        )
