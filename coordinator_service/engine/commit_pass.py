"""A commit pass of one sink: its checkpointed PENDING epochs into each of its tables, in order, each table's files
of a group in one snapshot with the sink's marker, then the COMMITTED record (coordinator_service.log.commit_record)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import CatalogConflict, CommitLockLost, SinkSuspended, cause
from coordinator_service.contract.source_positions import snapshot_positions
from coordinator_service.engine import settlement
from coordinator_service.engine.commit_history import CommitHistory
from coordinator_service.engine.commit_retries import cannot_succeed_by_retrying
from coordinator_service.engine.commit_state import SinkCommitState, TableFailure, numbering_of
from coordinator_service.engine.keyed_commit import KeyedCommits, KeyedEpochFiles
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import commit_record, epoch_reads, precommit_metadata, sink_rows, sink_tables
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.log.precommit_metadata import DataFileEntry, KeyFileEntry, PreCommitMetadata
from coordinator_service.settings import Settings
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat
from coordinator_service.tables.table_maintenance import table_properties_for

log = structlog.get_logger(__name__)


class CommitPasses:
    """A commit pass: the next group of a sink's checkpointed epochs appended to each of its tables (or found there),
    then recorded COMMITTED; coordinator_service.engine.committer.Committer drives the passes of every sink."""

    def __init__(self, database: Database, iceberg: TableFormat, settings: Settings) -> None:
        self.database = database
        self.iceberg = iceberg
        self.settings = settings
        # A keyed sink's epochs are committed as row deltas, their keys resolved through the key index.
        self.keyed = KeyedCommits(database, iceberg)
        # Each sink's committer in this process, by sink id.
        self._sinks: defaultdict[int, SinkCommitState] = defaultdict(SinkCommitState)
        # The last hour of each sink's commits made here, for the console's charts.
        self.history = CommitHistory()
        # Notified when a pass or a commit of any sink ends here; each sink's own count (SinkCommitState.progress) says
        # whether it was that sink's.
        self._progress = asyncio.Condition()
        self._background: list[asyncio.Task[None]] = []
        # A pass holds two connections (its advisory lock's and a transaction's): bounding the passes keeps
        # the pool from running dry with every sink's task holding a lock connection, waiting for a second.
        # asyncio's semaphore hands its slots out in arrival order: a sink that just committed queues behind
        # the sinks already waiting.
        self._passes = asyncio.Semaphore(max(1, settings.commit_concurrency))
        # Told each table a pass appended files to, once the pass is recorded (the maintainer sets it: it asks for the
        # sink's run when the commit took the table past a maintenance threshold).
        self.after_append: Callable[[Sink, str], None] = lambda sink, table: None

    async def _notify_progress(self, *sink_ids: int) -> None:
        async with self._progress:
            for sink_id in sink_ids:
                self._sinks[sink_id].progress += 1
            self._progress.notify_all()

    async def commit_checkpointed(self, sink_id: int, lock: CommitLock) -> None:
        """Commit every checkpointed PENDING epoch of the sink under a lock the caller holds (a reset), pass after
        pass, at once: no slot, no interval, no retry (a failure is the caller's)."""
        while await self._commit_next(sink_id, lock):
            pass

    async def _commit_next(self, sink_id: int, lock: CommitLock) -> bool:
        """Commit the next group of checkpointed epochs to each of the sink's tables; whether more may wait (or the
        group must be walked again).

        Per table, only the epochs above the newest one it holds (the log's record) are its work: the tables
        a crash or a failure left behind catch up, and those that hold the group already are not walked. A table
        that fails does not stop the others: the pass records what each holds and marks COMMITTED the epochs all
        of their tables hold, then raises the failure (the pass is retried, and only that table has work then).
        """
        limit = self.settings.commit_max_epochs
        async with self.database.reading() as session:  # a plan: the COMMITTED record checks it again under locks
            sink, waiting, recorded = await epoch_reads.sink_and_checkpointed_pending(session, sink_id, limit=limit + 1)
        if sink is None or not waiting:
            return False
        pending, more = waiting[:limit], len(waiting) > limit
        state = self._sinks[sink_id]
        state.name = sink.name
        if sink.suspended_reason is not None:
            raise SinkSuspended(sink.suspended_reason)
        structlog.contextvars.bind_contextvars(sink=sink.name)
        log_ = log.bind(table=sink.table_identifier, epochs=[row.epoch for row in pending])
        decoded = [precommit_metadata.decode(row.metadata_) for row in pending]
        started = time.monotonic()
        if not any(each.data_files or each.key_files for each in decoded):
            # Empty epochs are never appended, so no marker can hold them: mark them without reading the tables.
            empty = _PassAppends()
            await self._record_commit(sink, pending, empty.of(pending, {}), empty, started, log_)
            await self._stuck_cause_gone(sink)
            return more
        files = _files_by_table(sink, recorded, pending, decoded)
        keys = _key_files_by_table(pending, decoded)
        top = pending[-1].epoch
        # The newest epoch each table holds after the pass: a table without work holds the whole group.
        held = {table: max(epoch, top) if table not in files else epoch for table, epoch in recorded.items()}
        appends = _PassAppends()
        found: list[int] = []
        failures: list[BaseException] = []
        grown: list[str] = []
        health = state.healthy()
        for index, (table, work) in enumerate(files.items()):
            try:
                outcome = await self._commit_table(
                    sink, table, work, keys.get(table, {}), top, decoded[-1].properties, lock
                )
            except Exception as error:
                health.failing_tables[table] = TableFailure(
                    f"{type(error).__name__}: {cause(error)}", not cannot_succeed_by_retrying(error)
                )
                if isinstance(error, CommitLockLost) or len(files) == 1:
                    raise
                # The other tables go on: this one is retried by the next pass (alone, unless more epochs came), or,
                # when no retry can help (a table dropped for good), waits for an operator (stuck) while the others
                # hold what they got.
                failures.append(error)
                log_.warning("commit to one of the sink's tables failed", failed_table=table, error=str(error))
                held[table] = max(recorded[table], next(iter(work)) - 1)  # below its first epoch with files
                continue
            if outcome is None:
                return True  # a cached table was stale: walk the current one (what this pass appended is found)
            health.failing_tables.pop(table, None)
            if outcome.files:
                grown.append(table)
            held[table] = outcome.held
            appends.add(outcome, own=table == sink.table_identifier)
            if not outcome.committed:
                found.extend(outcome.snapshots)
                more = True
            if index < len(files) - 1:
                await failpoints.hit(Failpoint.COMMIT_BETWEEN_TABLES)
        if appends.snapshots:
            await failpoints.hit(Failpoint.COMMIT_AFTER_APPEND)
        settled = min(held.values())
        done = [row for row in pending if row.epoch <= settled]
        moved = {table: epoch for table, epoch in held.items() if epoch > recorded[table]}
        if done:
            await self._record_commit(sink, done, appends.of(done, moved), appends, started, log_)
        elif moved:
            async with self.database.connection(autocommit=True) as connection:
                await sink_tables.record_tables(connection, sink, moved)
        marked_found = sorted({epoch for epoch in found if epoch <= settled})
        if marked_found:
            log_.info("epochs found already in the table; marked committed", epochs=marked_found)
        for table in grown:
            self.after_append(sink, table)
        if failures:
            raise failures[0]
        if done:
            await self._stuck_cause_gone(sink)
        return more

    async def _stuck_cause_gone(self, sink: Sink) -> None:
        """A pass committed while the log said a committer was stuck on the sink (one that stuck, then restarted,
        say): the cause is gone. Counted as a resume, so that the committers stuck elsewhere go on too."""
        if sink.committer_stuck_reason is None:
            return
        async with self.database.transaction() as session:
            await sink_rows.record_resume(session, sink.id)
        log.warning("the sink committed again: its stuck state is cleared, and committers stuck elsewhere resume")

    async def _commit_table(
        self,
        sink: Sink,
        table_name: str,
        work: Mapping[int, Sequence[DataFileEntry]],
        keys: Mapping[int, Sequence[KeyFileEntry]],
        top: int,
        properties: Mapping[str, str],
        lock: CommitLock,
    ) -> _TableCommit | None:
        """Append the table's files of these epochs (by epoch, oldest first) as one snapshot with the sink's marker of
        `top`, the group's newest epoch, or, for a keyed sink, commit them with their key files (`keys`) as one row
        delta with that marker (engine.keyed_commit); or, when its markers show that it holds some already, only say
        which. None: the cached table was stale, and the pass must walk the current one."""
        identity = settlement.identity_of(sink)
        # The cached table (kept current by this process's own commits): the append asserts its branch head,
        # so a stale one fails the commit and the next round walks a freshly loaded table.
        table, from_cache = await in_catalog(self.iceberg.cached, table_name)
        markers = await in_catalog(self.iceberg.sink_markers, table_name, identity, next(iter(work)), table)
        if markers and markers[-1].epoch >= next(iter(work)):
            if from_cache:
                # Marking needs the current table, not a remembered one: walk again on a fresh load.
                self.iceberg.forget(table_name)
                return None
            # A crash hit after an append and before its record: those epochs are only marked, and the pass
            # after appends the rest (on a table walked again).
            return _TableCommit(
                settlement.covering_snapshots(work, markers), files=0, held=markers[-1].epoch, committed=False
            )
        await failpoints.hit(Failpoint.COMMIT_BEFORE_APPEND)
        # The lock's connection may have died since the walk: then another committer, an operator or the
        # cleaner may be deciding about these epochs, and the append must not happen.
        await lock.verify()
        # A coalesced snapshot says where its newest epoch ended.
        summary = snapshot_positions(properties)
        try:
            if sink.key_columns:
                epochs = {epoch: KeyedEpochFiles(entries, keys.get(epoch, ())) for epoch, entries in work.items()}
                keyed = await self.keyed.commit(
                    table_name, table, identity, top, epochs, lock, self._table_properties(sink), summary
                )
                snapshot_id, files = keyed.snapshot_id, keyed.files
            else:
                entries = [entry for each in work.values() for entry in each]
                snapshot_id = await in_catalog(
                    self.iceberg.append,
                    table_name,
                    identity,
                    top,
                    uuid.uuid4().hex,
                    entries,
                    table,
                    self._table_properties(sink),
                    summary,
                )
                files = len(entries)
        except CatalogConflict as error:
            if not from_cache:
                raise
            # The remembered table was behind the catalog (the commit forgot it): walk the current one now.
            log.debug("cached table was stale; walking the current table", stale_table=table_name, error=str(error))
            return None
        return _TableCommit(dict.fromkeys(work, snapshot_id), files=files, held=top, committed=True)

    def _table_properties(self, sink: Sink) -> Mapping[str, str]:
        """What the sink's commits make sure its tables have: manifest merging and old metadata files removed
        when its maintenance is on (coordinator_service.engine.maintenance)."""
        policy = self.settings.with_overrides(sink.maintenance_overrides)
        return table_properties_for(policy.manifest_merge_min_count) if policy.maintenance_enabled else {}

    async def _record_commit(
        self,
        sink: Sink,
        pending: Sequence[EpochRecord],
        appended: commit_record.Appended,
        appends: _PassAppends,
        started: float,
        log_: structlog.stdlib.BoundLogger,
    ) -> None:
        """The COMMITTED record of the pass (commit_record.record_commit), and what this process keeps of it."""
        epochs = [row.epoch for row in pending]
        committed = await commit_record.record_commit(
            self.database, sink, pending, appended, appends.files, self.settings.retention_epochs
        )
        if committed is None:
            return
        state = self._sinks[sink.id]
        state.committed_here = (numbering_of(sink), committed)
        await failpoints.hit(Failpoint.COMMIT_AFTER_MARK)
        state.last_commit = time.monotonic()
        state.healthy()  # committed here: no longer idle
        seconds = time.monotonic() - started
        metrics.record_commit(sink.name, len(epochs), snapshots=appends.snapshots, seconds=seconds)
        self.history.record(sink.name, seconds, len(epochs), lag_epochs=sink.checkpointed_epoch - committed)
        log_.debug(
            "epochs committed",
            epochs=epochs,
            snapshot_ids=sorted({snapshot for snapshot in appended.snapshots.values() if snapshot is not None}),
            files=appends.files,
            records=sum(row.record_count for row in pending),
            seconds=round(time.monotonic() - started, 4),
        )
        await self._notify_progress(sink.id)


@dataclass(frozen=True)
class _TableCommit:
    """One table's part of a pass: the snapshot that holds each of the table's epochs (found by its markers or
    committed now) and the files it added."""

    snapshots: dict[int, int]
    files: int
    # The newest epoch the table holds now.
    held: int
    # Whether the pass committed the snapshot (else its markers showed it holds the epochs already). A keyed group
    # that only deleted keys the table does not hold is a snapshot of no file.
    committed: bool


@dataclass
class _PassAppends:
    """What a pass did to the sink's tables."""

    # The snapshot of the sink's own table that holds each epoch with files there.
    own_snapshots: dict[int, int] = field(default_factory=dict)
    files: int = 0
    snapshots: int = 0

    def add(self, outcome: _TableCommit, own: bool) -> None:
        if own:
            self.own_snapshots.update(outcome.snapshots)
        self.files += outcome.files
        self.snapshots += 1 if outcome.committed else 0

    def of(self, done: Sequence[EpochRecord], tables: Mapping[str, int]) -> commit_record.Appended:
        """The COMMITTED record of the epochs all their tables hold, and of the tables that moved."""
        return commit_record.Appended(
            attempts={row.epoch: row.attempt for row in done},
            snapshots={row.epoch: self.own_snapshots.get(row.epoch) for row in done},
            tables=tables,
        )


def _files_by_table(
    sink: Sink, recorded: Mapping[str, int], pending: Sequence[EpochRecord], decoded: Sequence[PreCommitMetadata]
) -> dict[str, dict[int, list[DataFileEntry]]]:
    """Each table's work in a pass: its data files of each epoch above the newest it holds, by epoch (only epochs with
    files there, key files counted: an epoch that only deletes has none but them); the sink's own table first, then
    the others by name, each with work."""
    work: dict[str, dict[int, list[DataFileEntry]]] = {}
    for row, metadata in zip(pending, decoded, strict=True):
        data_files = metadata.by_table()
        for table in sorted(metadata.tables_with_files()):
            if table not in recorded:
                raise AssertionError(f"epoch {row.epoch} has files in table {table}, which is not one of the sink's")
            if row.epoch > recorded[table]:
                work.setdefault(table, {})[row.epoch] = data_files.get(table, [])
    return dict(sorted(work.items(), key=lambda item: (item[0] != sink.table_identifier, item[0])))


def _key_files_by_table(
    pending: Sequence[EpochRecord], decoded: Sequence[PreCommitMetadata]
) -> dict[str, dict[int, list[KeyFileEntry]]]:
    """Each table's key files of each epoch (a keyed sink's), by epoch."""
    keys: dict[str, dict[int, list[KeyFileEntry]]] = {}
    for row, metadata in zip(pending, decoded, strict=True):
        for table, entries in metadata.key_files_by_table().items():
            keys.setdefault(table, {})[row.epoch] = entries
    return keys
