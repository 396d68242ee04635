"""The cleaner: deletes the files the log gave up, once they are due, through file_deletion.

A path is given up (discarded, path_claims) when its epoch is aborted, when a newer attempt of its epoch does not
name it, or when the waiting part that named it is dropped (a new writer term). It is due CLEANUP_DELAY_SECONDS
later; after a recovery abort, RECOVERY_FILES_KEEP_SECONDS later unless Spark pre-committed the epoch's new attempt
first (if Kafka's retention removed the batch's records meanwhile, these files are their last copy). The cleaner
takes each sink's commit lock, hands its due paths to the deleter (which proves each one garbage at the moment it
deletes it), marks cleaned the ABORTED epochs that hold nothing any more, and settles a path a table references
after all (an append that landed without its lock) with the table's side. It also finishes the deletions of its
sink that a crash interrupted, and forgets the marks of deletions older than ORPHAN_GRACE_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import cause
from coordinator_service.contract.views import EpochStatus
from coordinator_service.engine import settlement
from coordinator_service.engine.file_deletion import FileDeleter
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import (
    anomalies,
    commit_lock,
    epoch_reads,
    epoch_transitions,
    path_claims,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.database import Database
from coordinator_service.log.models import Sink
from coordinator_service.log.path_claims import CleanupDelays, DuePath, MarkRule
from coordinator_service.settings import Settings
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)

# Paths handed to the deleter per sink and round.
CLEANUP_BATCH = 100


class Cleaner:
    def __init__(self, database: Database, iceberg: TableFormat, settings: Settings) -> None:
        self.database = database
        self.iceberg = iceberg
        self.settings = settings
        self.delays = CleanupDelays(settings.cleanup_delay_seconds, settings.recovery_files_keep_seconds)
        self.deleter = FileDeleter(database, iceberg, self.delays)
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._clean_forever(), name="cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def wake(self) -> None:
        self._event.set()

    async def _clean_forever(self) -> None:
        while True:
            # Woken by an abort, or every POLL_INTERVAL_SECONDS: paths become due with time alone.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), self.settings.poll_interval_seconds)
            self._event.clear()
            try:
                await self.clean()
            except Exception as error:
                log.warning("cleaning given-up files failed; will try again", error=cause(error))

    async def clean(self) -> int:
        """One round over every sink with due paths; the number of paths handed to the deleter."""
        async with self.database.transaction() as session:
            sink_ids = await path_claims.sinks_with_cleanup_work(session, self.delays)
        handled = 0
        for sink_id in sink_ids:
            handled += await self._clean_sink(sink_id)
        async with self.database.connection(autocommit=True) as connection:
            await path_claims.expire_marks(connection, self.settings.orphan_grace_seconds)
        return handled

    async def _clean_sink(self, sink_id: int) -> int:
        async with commit_lock.try_holding(self.database, sink_id) as lock:
            if lock is None:
                return 0  # its committer (or an operator, or maintenance) holds the sink: the next round
            async with self.database.transaction() as session:
                sink = await sink_rows.sink_by_id(session, sink_id)
                due = await path_claims.due_paths(session, sink_id, self.delays, CLEANUP_BATCH)
                tables = [table.identifier for table in await sink_tables.tables_of_sink(session, sink_id)]
            if sink is None:
                return 0
            deleted = 0
            if due:
                deletion = await self.deleter.delete(
                    sink.name, sink_id, lock, tables, [path.path for path in due], MarkRule.DISCARDED
                )
                deleted = len(deletion.deleted)
                await failpoints.hit(Failpoint.CLEANUP_AFTER_DELETE)
                by_path = {path.path: path for path in due}
                if deletion.referenced:
                    await self._settle_referenced(sink, [by_path[path] for path in deletion.referenced])
                if deletion.refused:
                    await self._forget(sorted(deletion.refused))
                metrics.CLEANED_FILES.labels(sink.name).inc(deleted)
            async with self.database.transaction() as session:
                cleaned = await path_claims.settle_cleaned(session, sink_id)
            for epoch in cleaned:
                log.info("aborted epoch cleaned", sink=sink.name, epoch=epoch)
            if deleted:
                log.info("given-up files deleted", sink=sink.name, files_deleted=deleted)
            if len(due) == CLEANUP_BATCH:
                self.wake()
            return len(due)

    async def _settle_referenced(self, sink: Sink, referenced: Sequence[DuePath]) -> None:
        """Given-up paths that a table references (an append landed after the abort: its committer had lost the
        commit lock). They are kept, and the epoch takes the tables' side where the log can say so."""
        # Paths of epochs the log no longer has (pruned, or an older numbering): the table keeps them.
        gone = [path.path for path in referenced if path.epoch is None]
        for epoch in sorted({path.epoch for path in referenced if path.epoch is not None}):
            paths = sorted(path.path for path in referenced if path.epoch == epoch)
            async with self.database.transaction() as session:
                row = await epoch_reads.epoch_row(session, sink.id, epoch, for_update=True)
                if row is None:
                    gone += paths
                    continue
                recorded = await sink_tables.recorded_epochs(session, sink.id)
                found = await settlement.holdings(self.iceberg, sink, recorded, [row])
                if row.status == EpochStatus.ABORTED and found.held and row.epoch <= sink.checkpointed_epoch:
                    [snapshot_id] = found.held
                    await epoch_transitions.adopt_appended(session, sink, row, row, snapshot_id)
                    continue
                # No marker of this numbering holds it in every table with its files (a reset came in between), or
                # the files are a replaced attempt's: they stay, held by the epoch, and the cleaner leaves them.
                await path_claims.hold_again(session, sink.id, epoch, row.attempt, paths)
                anomalies.alert(sink.name, "aborted_files_in_table", epoch=epoch, files=paths[:10])
        if gone:
            await self._forget(sorted(gone))
            anomalies.alert(sink.name, "given_up_files_in_table", files=sorted(gone)[:10])

    async def _forget(self, paths: Sequence[str]) -> None:
        """Claims the cleaner will not delete: a table keeps them, or they are not where a table keeps its files."""
        async with self.database.transaction() as session:
            await path_claims.forget(session, paths)
