"""The keyed commit path (issue 29): a keyed sink's epochs committed to one of its tables as one row delta (their data
files, and position delete files for the live rows of every key they touched; the operation Java's row delta gives),
never appended (docs/architecture.md, "The keyed commit path").

The commit pass (coordinator_service.engine.commit_pass) calls it per table, under the sink's commit lock, after the
table's markers showed that it does not hold the epochs yet; the snapshot carries the sink's marker of the group's
newest epoch exactly as an append's does (contract.markers), so that a crash between this commit and the COMMITTED
record is found by the same marker walk (the epochs are only marked: nothing deleted or inserted twice).

The keys are resolved against the table as the pass loaded it, through the key index (where the keys live, brought
to that snapshot first), and the commit asserts that head: when the table moved (another commit, maintenance), the
catalog refuses it (CatalogConflict), nothing changed, and the pass walks the table again and resolves again, as an
append's conflict does (commit_retries). No equality delete file is ever written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from coordinator_service.contract.errors import MetastoreUnavailable
from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.engine.collector_pause import collector_paused
from coordinator_service.engine.key_index import KeyIndex
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.precommit_metadata import DataFileEntry, KeyFileEntry
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import LoadedTable, TableFormat
from coordinator_service.tables.row_deltas import (
    RowDeltaCommit,
    commit_planned_row_delta,
    epoch_change,
    plan_row_delta,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class KeyedEpochFiles:
    """One epoch's files in one table, as its pre-commit recorded them: its data files (the last row of each key it
    upserted) and its key files (every key it touched)."""

    data_files: Sequence[DataFileEntry]
    key_files: Sequence[KeyFileEntry]


@dataclass(frozen=True)
class KeyedTableCommit:
    """A group's row delta on one table: its snapshot and the files it added (data files and position delete files;
    none when the group only deleted keys the table does not hold: the snapshot then carries the marker alone)."""

    snapshot_id: int
    files: int


class KeyedCommits:
    """Row deltas of keyed sinks' epochs, their keys resolved through the key index."""

    def __init__(self, database: Database, tables: TableFormat) -> None:
        self.tables = tables
        self.key_index = KeyIndex(database)

    async def commit(
        self,
        table_name: str,
        table: LoadedTable,
        sink: SinkIdentity,
        top: int,
        epochs: Mapping[int, KeyedEpochFiles],
        lock: CommitLock,
        table_properties: Mapping[str, str],
        summary: Mapping[str, str],
    ) -> KeyedTableCommit:
        """Commit the epochs (by epoch, oldest first: each resolved after the one before) on `table` as loaded, as one
        snapshot carrying the sink's marker of `top`, the group's newest epoch, and `summary`; then record the commit
        in the key index. The committed table replaces the cached one; any failure drops it. Python's cyclic
        collector is paused meanwhile (collector_pause: the commit's objects per key hold no cycle).

        Raises:
            CatalogConflict: the table moved since it was loaded (the commit, or the key index, saw a newer head);
                nothing changed: walk the table again and commit again.
            CommitLockLost: the lock's connection died before the commit; nothing changed.
        """
        try:
            with collector_paused():
                return await self._commit(table_name, table, sink, top, epochs, lock, table_properties, summary)
        except BaseException:
            self.tables.forget(table_name)
            raise

    async def _commit(
        self,
        table_name: str,
        table: LoadedTable,
        sink: SinkIdentity,
        top: int,
        epochs: Mapping[int, KeyedEpochFiles],
        lock: CommitLock,
        table_properties: Mapping[str, str],
        summary: Mapping[str, str],
    ) -> KeyedTableCommit:
        changes = [await in_catalog(epoch_change, table, each.data_files, each.key_files) for each in epochs.values()]
        planned = await in_catalog(plan_row_delta, table, changes)
        live = await self.key_index.positions(planned.table, planned.keys.keys)
        # Resolving took a while: the lock's connection may have died since the walk, and another committer, an
        # operator or the cleaner may be deciding about these epochs now.
        await lock.verify()
        # Committed even when it changes no row (it only deleted keys the table does not hold): the snapshot asserts
        # the head the keys were resolved against (another writer may have added one of them since), and its marker
        # says that the table holds the group.
        committed = await in_catalog(
            commit_planned_row_delta,
            planned,
            live,
            {**summary, **sink.marker(top, uuid.uuid4().hex)},
            table_properties,
        )
        self.tables.remember(table_name, committed.table)
        recorded = await self._record(committed)
        log.debug(
            "keyed epochs committed as a row delta",
            committed_table=table_name,
            epochs=list(epochs),
            snapshot=committed.snapshot_id,
            data_files=committed.data_files,
            delete_files=len(committed.delete_files),
            deleted_rows=committed.deleted_rows,
            keys=committed.keys_resolved,
            key_index_recorded=recorded,
        )
        return KeyedTableCommit(committed.snapshot_id, files=committed.data_files + len(committed.delete_files))

    async def _record(self, committed: RowDeltaCommit) -> bool:
        """Record the commit in the key index; a metastore that fails now leaves the index at the commit's parent,
        and its next use catches up with the commit from the table (the commit stands: its marker says so)."""
        try:
            return await self.key_index.record(committed)
        except MetastoreUnavailable as error:
            log.warning("the key index did not record a commit; its next use catches up", error=str(error))
            return False
