"""Compaction: the small files of each partition (smaller than 3/4 of COMPACTION_TARGET_FILE_BYTES, at least
COMPACTION_MIN_FILES of them), and every data file whose position deletes delete COMPACTION_DELETED_ROWS_RATIO of its
rows, at most COMPACTION_MAX_BYTES_PER_RUN in all, rewritten with their position deletes applied; and the position
delete files of each partition that has COMPACTION_DELETE_FILES_MIN of them, merged into one. All in a `replace`
snapshot that drops the delete files merged or no live data file is left to refer to (the rows read stay the same); a
file that an epoch not COMMITTED holds is never compacted, nor a partition with equality delete files (another
engine's)."""

from __future__ import annotations

import functools
from collections.abc import Collection

import structlog

from coordinator_service import failpoints
from coordinator_service.contract.errors import CatalogConflict
from coordinator_service.engine.maintenance_steps.step import MaintenanceStep, StepContext
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import path_claims
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import MaintenanceRun, Sink
from coordinator_service.log.path_claims import MarkRule
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import LoadedTable

log = structlog.get_logger(__name__)


def policy_plan(
    table: LoadedTable, files: cp.CompactionInput, policy: MaintenancePolicy, held: Collection[str]
) -> cp.CompactionPlan:
    """What `policy` compacts among the table's live `files`, those in `held` left alone."""
    return cp.compaction_plan(
        files,
        held,
        target_bytes=policy.compaction_target_file_bytes,
        min_files=policy.compaction_min_files,
        max_bytes=policy.compaction_max_bytes_per_run,
        spec_id=tm.default_spec_id(table),
        delete_files=policy.compaction_delete_files_min,
        deleted_rows_ratio=policy.compaction_deleted_rows_ratio,
    )


async def compaction_plan(
    database: Database, table: LoadedTable, policy: MaintenancePolicy
) -> tuple[cp.CompactionInput, cp.CompactionPlan]:
    """The table's live files, and what a compaction of it would rewrite now (what a run compacts, and what a
    commit's check counts); the log is asked which files are held only when there are any."""
    files = await in_catalog(cp.compaction_input, table)
    plan = functools.partial(policy_plan, table, files, policy)
    if not plan(set()):
        return files, cp.CompactionPlan()  # holding files back only takes more away
    async with database.transaction() as session:
        held = await path_claims.unsettled(session, [file.path for file in (*files.data, *files.deletes)])
    return files, plan(held)


class Compaction(MaintenanceStep):
    name = "compact"
    policy_fields: tuple[str, ...] = (
        "compaction_target_file_bytes",
        "compaction_min_files",
        "compaction_max_bytes_per_run",
        "compaction_delete_files_min",
        "compaction_deleted_rows_ratio",
    )
    counters: tuple[str, ...] = ("files_compacted", "files_written", "bytes_rewritten", "delete_files_merged")

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
        files, plan = await compaction_plan(context.database, table, policy)
        with_equality_deletes = files.partitions_with_equality_deletes()
        if with_equality_deletes:
            log.info(
                "compaction leaves alone the partitions that have equality delete files",
                sink=sink.name,
                table=identifier,
                partitions=len(with_equality_deletes),
            )
        if not plan:
            return
        rewrite = await in_catalog(cp.write_compacted, table, plan, policy.compaction_target_file_bytes)
        await failpoints.hit(Failpoint.MAINTENANCE_BEFORE_COMPACTION_COMMIT)
        try:
            committed = await in_catalog(cp.commit_compaction, table, rewrite)
        except CatalogConflict:
            # The commit did not happen (a conflict): the files written are nobody's.
            await context.deleter.delete(
                sink.name, sink.id, lock, [identifier], [f.file_path for f in rewrite.files_written], MarkRule.UNCLAIMED
            )
            raise
        context.tables.remember(identifier, committed)
        await failpoints.hit(Failpoint.MAINTENANCE_AFTER_COMPACTION_COMMIT)
        run.files_compacted += len(rewrite.replaced)
        run.files_written += len(rewrite.written)
        run.bytes_rewritten += sum(data_file.file_size_in_bytes for data_file in rewrite.replaced)
        run.delete_files_merged += sum(len(merge) for merge in plan.merges)
        if rewrite.deletes_dropped:
            log.info(
                "compaction merged or applied position delete files, and dropped them",
                sink=sink.name,
                table=identifier,
                delete_files_dropped=len(rewrite.deletes_dropped),
                delete_files_written=len(rewrite.deletes_written),
            )


STEP = Compaction()
