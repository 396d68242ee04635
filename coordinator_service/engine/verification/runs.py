"""A verification run: where each table's proof stood (the log's sink_verifications), the verifier from there or from
the start, and the outcome recorded (a failed table keeps where its proof stood, so the next run finds its fault
again). What the CLI, the admin API and the maintenance step share."""

from __future__ import annotations

from datetime import UTC, datetime

from coordinator_service import metrics
from coordinator_service.contract.errors import NotFound, quote
from coordinator_service.engine.verification.findings import Offsets, TableVerification, Verification
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.engine.verification.verifier import VerifiedTable, Verifier
from coordinator_service.log import sink_rows, verification_rows
from coordinator_service.log.database import Database
from coordinator_service.log.models import VerificationRecord
from coordinator_service.log.verification_rows import VerificationRow
from coordinator_service.tables.format import TableFormat


class VerificationRuns:
    def __init__(self, database: Database, iceberg: TableFormat) -> None:
        self.database = database
        self.verifier = Verifier(database, iceberg)

    async def run(self, name: str, kafka: KafkaAccess | None = None, incremental: bool = False) -> Verification:
        """Verify the sink (from where each table's proof stood with `incremental`) and record the outcome."""
        since = {}
        if incremental:
            since = {record.table_identifier: verified_table(record) for record in await self.records(name)}
        verification = await self.verifier.verify(name, kafka, since)
        now = datetime.now(UTC)
        rows = [_row(table, verification.end_offsets, now) for table in verification.tables]
        async with self.database.transaction() as session:
            sink = await sink_rows.sink_by_name(session, name)
            if sink is not None:  # deleted meanwhile: nothing to record
                await verification_rows.record_verifications(session, sink.id, rows)
        for table in verification.tables:
            if table.faults:
                metrics.VERIFICATION_FAILURES.labels(name).inc()
        return verification

    async def records(self, name: str) -> list[VerificationRecord]:
        """Where each of the sink's tables' verification stands (none: never verified)."""
        async with self.database.transaction() as session:
            sink = await sink_rows.sink_by_name(session, name)
            if sink is None:
                raise NotFound(f"no sink {quote(name)}")
            return await verification_rows.verification_records(session, sink.id)


def verified_table(record: VerificationRecord) -> VerifiedTable:
    offsets: Offsets = {
        (topic, int(partition)): int(offset)
        for topic, partitions in record.end_offsets.items()
        for partition, offset in partitions.items()
    }
    return VerifiedTable(record.snapshot_id, record.verified_epoch, offsets)


def _row(table: TableVerification, end_offsets: Offsets, now: datetime) -> VerificationRow:
    spelled: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in end_offsets.items():
        spelled.setdefault(topic, {})[str(partition)] = offset
    return VerificationRow(
        table=table.table,
        snapshot_id=table.snapshot_id,
        verified_epoch=table.verified_epoch,
        end_offsets=spelled,
        ok=not table.faults,
        faults=[{"kind": f.kind.value, "epoch": f.epoch, "detail": f.detail} for f in table.faults],
        notes=table.notes,
        deep=table.deep,
        kafka=table.kafka,
        checked_at=now,
    )
