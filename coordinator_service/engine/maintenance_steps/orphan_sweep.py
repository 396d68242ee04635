"""The orphan sweep: every ORPHAN_SWEEP_INTERVAL_SECONDS (and at an operator's run), the files under the table's data
and metadata directories that no snapshot references and no log row holds are deleted once they are older than
ORPHAN_GRACE_SECONDS (at most ORPHAN_MAX_FILES_PER_RUN of them)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from coordinator_service import failpoints
from coordinator_service.engine.file_deletion import nested_table_roots
from coordinator_service.engine.maintenance_steps.step import MaintenanceStep, RunOccasion, StepContext
from coordinator_service.failpoints import Failpoint
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.models import MaintenanceRun, MaintenanceTrigger, Sink
from coordinator_service.log.path_claims import MarkRule
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import LoadedTable

# Orphan files deleted between two verifications of the commit lock.
ORPHAN_DELETE_BATCH = 100


class OrphanSweep(MaintenanceStep):
    name = "sweep"
    policy_fields: tuple[str, ...] = (
        "orphan_sweep_interval_seconds",
        "orphan_grace_seconds",
        "orphan_max_files_per_run",
    )
    counters: tuple[str, ...] = ("orphans_deleted",)

    def wanted(self, policy: MaintenancePolicy, occasion: RunOccasion) -> bool:
        interval = timedelta(seconds=policy.orphan_sweep_interval_seconds)
        return (
            occasion.trigger == MaintenanceTrigger.OPERATOR
            or occasion.last_sweep is None
            or datetime.now(UTC) - occasion.last_sweep >= interval
        )

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
        if not tm.retention_of(table, 0, 0).gc_enabled:
            return
        # A sink's override can only lengthen the grace: pre-commits refuse files older than the coordinator's.
        grace = max(policy.orphan_grace_seconds, context.settings.orphan_grace_seconds)
        candidates = await in_catalog(_unreferenced_files, table, grace)
        run.swept = True
        deletion = await context.deleter.delete(
            sink.name,
            sink.id,
            lock,
            [identifier],
            [file.uri for file in candidates][: policy.orphan_max_files_per_run],
            MarkRule.UNCLAIMED,
            metadata_files=True,
            batch=ORPHAN_DELETE_BATCH,
            after_batch=lambda: failpoints.hit(Failpoint.MAINTENANCE_DURING_SWEEP),
        )
        run.orphans_deleted += len(deletion.deleted)


def _unreferenced_files(table: LoadedTable, grace_seconds: float) -> list[tm.StoredFile]:
    """Files under the table's data and metadata directories that no snapshot references and that are older
    than the grace (data files, manifests and manifest lists, metadata files no longer in the metadata log),
    never one under another table's location nested in this one's (its sweep is that table's)."""
    referenced = tm.referenced_files(table)
    oldest = (time.time() - grace_seconds) * 1000
    roots = tm.storage_roots(table)
    stored = tm.stored_files(table, roots.data) + tm.stored_files(table, roots.metadata)
    nested = nested_table_roots(roots.location, (file.uri for file in stored))
    return sorted(
        (
            file
            for file in stored
            if tm.same_file(file.uri) not in referenced
            and file.modified_ms < oldest
            and file.uri.endswith((".parquet", ".avro", ".metadata.json"))
            and not any(file.uri.startswith(root + "/") for root in nested)
        ),
        key=lambda file: file.modified_ms,
    )


STEP = OrphanSweep()
