"""Snapshot expiry: the snapshots older than SNAPSHOT_MAX_AGE_SECONDS or beyond the newest SNAPSHOT_MAX_COUNT expire
(never a branch or tag head, nor a snapshot whose marker the recovery walk may still need: a sink's marker above the
newest epoch of that sink the log records the table holds), then the files only they referenced are deleted."""

from __future__ import annotations

import time

from coordinator_service import failpoints
from coordinator_service.engine import settlement
from coordinator_service.engine.maintenance_steps.step import MaintenanceStep, StepContext
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import sink_rows
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.models import MaintenanceRun, Sink
from coordinator_service.log.path_claims import MarkRule
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog


class Expiry(MaintenanceStep):
    name = "expire"
    policy_fields: tuple[str, ...] = ("snapshot_max_age_seconds", "snapshot_max_count")
    counters: tuple[str, ...] = ("snapshots_expired", "expired_files_deleted")

    async def run(
        self,
        context: StepContext,
        sink: Sink,
        identifier: str,
        policy: MaintenancePolicy,
        lock: CommitLock,
        run: MaintenanceRun,
    ) -> None:
        table = await in_catalog(context.tables.load, identifier)
        retention = tm.retention_of(table, int(policy.snapshot_max_age_seconds * 1000), policy.snapshot_max_count)
        if not retention.gc_enabled:
            return  # the table's owners said so (gc.enabled=false)
        async with context.database.transaction() as session:
            sinks = await sink_rows.sinks_of_table(session, identifier)
        keep = tm.protected_by_refs(table) | tm.protected_by_markers(
            table, [(settlement.identity_of(sink), committed_epoch) for sink, committed_epoch in sinks]
        )
        expired = tm.snapshots_to_expire(
            tm.snapshots_of(table),
            now_ms=int(time.time() * 1000),
            max_age_ms=retention.max_age_ms,
            max_count=retention.max_count,
            keep=keep,
        )
        if not expired:
            return
        await lock.verify()
        committed, gone = await in_catalog(tm.expire, table, expired)
        context.tables.remember(identifier, committed)
        run.snapshots_expired += len(expired)
        await failpoints.hit(Failpoint.MAINTENANCE_AFTER_EXPIRE)
        # Files nothing claims, or that COMMITTED epochs held (never a file an epoch that is not COMMITTED holds:
        # only a lost commit lock could have put one there), that no snapshot left reaches.
        deletion = await context.deleter.delete(
            sink.name, sink.id, lock, [identifier], sorted(gone.all()), MarkRule.EXPIRED, metadata_files=True
        )
        run.expired_files_deleted += len(deletion.deleted)


STEP = Expiry()
