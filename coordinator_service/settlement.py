"""What the table already holds, settled in the log.

The snapshot markers are the table's own record of which epochs of a sink it
holds. Every path that decides an epoch's fate against the table (the
committer before it appends, RegisterWriter, an operator's abort or reset, the
cleaner) reads them on a fresh load while it holds the sink's commit lock, and
marks what the table holds COMMITTED before it aborts or deletes anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import metrics, precommit_metadata, repository
from coordinator_service.catalog_calls import in_catalog
from coordinator_service.iceberg import IcebergGateway, Marker, SinkIdentity
from coordinator_service.models import PendingSinkState, Sink
from coordinator_service.views import EpochStatus

log = structlog.get_logger(__name__)


def identity_of(sink: Sink) -> SinkIdentity:
    return SinkIdentity(
        name=sink.name,
        incarnation=str(sink.incarnation),
        generation=sink.generation,
        legacy_markers=sink.legacy_markers,
    )


def held_by_snapshot(epochs: Iterable[int], markers: Sequence[Marker]) -> dict[int, list[int]]:
    """The epochs a marker covers, by the snapshot that added each: the oldest marker at or above it.

    Valid for PENDING epochs: the committer appends checkpointed epochs in order, all of them at once up to
    a marker, and a PENDING epoch is never below a marker it is not in (a re-attempt is always above the
    checkpoint, so above every marker).
    """
    by_snapshot: dict[int, list[int]] = {}
    for epoch in sorted(epochs):
        covering = next((marker for marker in markers if marker.epoch >= epoch), None)
        if covering is None:
            break
        by_snapshot.setdefault(covering.snapshot_id, []).append(epoch)
    return by_snapshot


async def pending_held_by_table(tables: IcebergGateway, sink: Sink, epochs: Sequence[int]) -> dict[int, list[int]]:
    """Which of these PENDING epochs the table holds, walked on a fresh load (the caller holds the commit lock)."""
    if not epochs:
        return {}
    markers = await in_catalog(tables.sink_markers, sink.table_identifier, identity_of(sink), min(epochs))
    return held_by_snapshot(epochs, markers)


async def mark_held(session: AsyncSession, sink_id: int, held: dict[int, list[int]]) -> list[int]:
    """Mark the epochs the table holds COMMITTED, each with its snapshot; return them."""
    for snapshot_id, epochs in held.items():
        await repository.mark_committed(session, sink_id, epochs, snapshot_id)
    return sorted(epoch for epochs in held.values() for epoch in epochs)


async def adopt_appended(
    session: AsyncSession, sink: Sink, row: PendingSinkState, appended: PendingSinkState, snapshot_id: int | None
) -> None:
    """The table holds `appended` (an attempt of row's epoch) although the log had moved on (aborted, or a newer
    attempt): the table is the truth. The row becomes COMMITTED with that attempt's record and files; files of
    other attempts are discarded (the cleaner removes them). An alert: a committer appended without its lock."""
    previous = f"{row.status.value} attempt {row.attempt}" + (f" ({row.reason})" if row.reason else "")
    row.status = EpochStatus.COMMITTED
    row.snapshot_id = snapshot_id
    row.attempt = appended.attempt
    row.metadata_ = appended.metadata_
    row.file_count = appended.file_count
    row.record_count = appended.record_count
    row.reason = f"the table holds attempt {appended.attempt} although the log had it as {previous}"
    row.abort_cause = None
    row.aborted_at = None
    row.files_cleaned = False
    await session.flush()
    paths = sorted(precommit_metadata.decode(appended.metadata_).paths)
    await repository.claim_files(session, sink.id, row.epoch, appended.attempt, paths)
    await repository.advance_committed_epoch(session, sink.id)
    alert(sink.name, "appended_after_abort", epoch=row.epoch, snapshot_id=snapshot_id, previous=previous)


def alert(sink: str, kind: str, **fields: object) -> None:
    """Something only a lost commit lock explains: logged as an error and counted, for an operator to look at."""
    metrics.COMMIT_ANOMALIES.labels(sink, kind).inc()
    log.error("exactly-once anomaly: a commit landed without its commit lock", sink=sink, anomaly=kind, **fields)
