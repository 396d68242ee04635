"""The key index: where each key lives among a keyed table's live rows, kept in PostgreSQL beside the log (it survives
restarts and serves every replica), so that a commit of row mutations costs what its epochs hold, not what the table
holds (docs/architecture.md, "The key index").

The commit path calls it per table, under the sink's commit lock, around the row delta:

    planned = await in_catalog(plan_row_delta, table, changes)          # the epochs' own files read: O(epoch)
    live = await key_index.positions(planned.table, planned.keys.keys)  # O(keys), after a catch-up if the table moved
    committed = await in_catalog(commit_planned_row_delta, planned, live, markers, table_properties)
    await key_index.record(committed)                                   # O(epoch)

`positions` answers exactly what key_resolution.live_rows (the scan) answers for the table as loaded. The index
names the snapshot whose live rows it holds; when the table moved past it (a commit not recorded, another writer,
compaction), it first catches up, snapshot by snapshot, from the manifests each wrote (O(what changed)); when it
cannot follow (no index yet, its snapshot expired or not an ancestor, the key changed, an equality delete file, a
delete file removed while its data files stay), it is rebuilt from a scan of the live rows (O(table), once). A crash
between a commit and its record leaves the index at the commit's parent: the next catch-up reads that commit.

Each table's index is used under its row lock (FOR UPDATE), in one transaction per call: two sinks may write one
table, and each sees the other's changes whole.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import suppress

import numpy as np
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.errors import CatalogConflict
from coordinator_service.log import key_index
from coordinator_service.log.database import Database
from coordinator_service.log.key_index import IndexState
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.data_file_codec import DescriptionOutdated
from coordinator_service.tables.format import LoadedTable
from coordinator_service.tables.key_index_reads import (
    CatchUp,
    Current,
    IndexedTable,
    Rebuild,
    RowNumbers,
    SnapshotChanges,
    TableBehind,
    TableFile,
    added_pieces,
    answer,
    commit_record,
    deleted_by_path,
    encoded_keys,
    files_to_index,
    indexed_table,
    live_files_to_index,
    live_pieces,
    plan_catch_up,
    snapshot_changes,
)
from coordinator_service.tables.key_resolution import Key, LiveRows
from coordinator_service.tables.row_deltas import RowDeltaCommit

log = structlog.get_logger(__name__)

# Rows loaded at once (a rebuild, a catch-up of a compaction) after which the index's statistics are refreshed.
_ANALYZE_AFTER_ROWS = 100_000


class KeyIndex:
    """The key index of every keyed table, in the metastore."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def positions(self, table: LoadedTable, keys: Iterable[Key]) -> LiveRows:
        """Where `keys` live among the live rows of `table` as loaded (its current snapshot): exactly what
        key_resolution.live_rows(table, keys) answers (each key's rows sorted by path and position), from the index
        brought to that snapshot first.

        Raises:
            CatalogConflict: the table as loaded is older than the index (another commit moved it since it was
                loaded, and a row delta on it would be refused): load it again and ask again.
            ValueError: the table is not a keyed format v2 table; a key holds a null or a value its column refuses.
            MetastoreUnavailable, CatalogUnavailable: retry.
        """
        wanted = list(set(keys))
        if not wanted:
            return LiveRows()
        indexed = indexed_table(table)
        encoded = await asyncio.to_thread(encoded_keys, table, wanted)
        outdated = None
        async with self.database.transaction() as session:
            index, loaded = await self._follow(session, table, indexed)
            found = await key_index.find_keys(session, index.index_id, encoded)
            files = await key_index.files_by_id(session, index.index_id, sorted({row[1] for row in found}))
            try:
                live = await asyncio.to_thread(answer, table, wanted, encoded, found, files)
            except DescriptionOutdated as error:
                # A file indexed under a schema the table dropped since (Java's expiry can remove unused ones):
                # describe every file again.
                outdated = error
                loaded += await self._rebuild(session, table, indexed, index, str(error))
        if loaded >= _ANALYZE_AFTER_ROWS:
            await self._analyze()
        return live if outdated is None else await self.positions(table, wanted)

    async def record(self, committed: RowDeltaCommit) -> bool:
        """Record a row delta committed on the snapshot it was resolved at (`committed`, from row_deltas): the rows
        it deleted out of the index, its new rows in, the index at its snapshot; in one transaction. Recorded only
        when the index is at the commit's base snapshot (False otherwise: the index is behind, rebuilt or ahead, and
        the next positions() catches up with the commit from the table).

        Raises MetastoreUnavailable: retry, or leave it to the next catch-up."""
        record = await asyncio.to_thread(commit_record, committed)
        if record is None:
            return False
        async with self.database.transaction() as session:
            index = await key_index.existing_index(session, record.table.table_uuid)
            if (
                index is None
                or not index.built
                or index.snapshot_id != record.base_snapshot_id
                or not record.table.keyed_as(index)
            ):
                return False
            # The commit deleted every live row of the keys it touched: the index's rows of those keys at its base.
            # By key, not by place: the lookup that resolved the commit just read those keys' pages.
            removed = await key_index.remove_keys(session, index.index_id, record.touched)
            if removed != record.deleted_rows:
                # The index held other rows of those keys than the commit deleted: it was wrong before it.
                log.error(
                    "the key index did not hold the rows a commit deleted: it is rebuilt at its next use",
                    table=record.table.name,
                    deleted=record.deleted_rows,
                    found=removed,
                )
                await key_index.mark_unbuilt(session, index.index_id)
                return False
            added = await key_index.add_files(session, index.index_id, record.new_files)
            if record.new_rows:
                await key_index.copy_in(session, _each(record.pieces(index.index_id, added)))
            await key_index.move_to(session, index.index_id, record.snapshot_id, len(record.new_rows) - removed)
        log.debug(
            "key index recorded a commit",
            table=record.table.name,
            snapshot=record.snapshot_id,
            added=len(record.new_rows),
            removed=removed,
        )
        return True

    async def forget(self, table_uuid: uuid.UUID) -> bool:
        """Drop a table's index (the table was dropped or replaced: a replaced table has another UUID, and its own
        index); whether it had one."""
        async with self.database.transaction() as session:
            return await key_index.forget_index(session, table_uuid)

    async def _follow(self, session: AsyncSession, table: LoadedTable, indexed: IndexedTable) -> tuple[IndexState, int]:
        """The table's index, locked, brought to the table's current snapshot (caught up or rebuilt), and how many rows
        that loaded."""
        index = await key_index.lock_index(session, indexed.table_uuid, indexed.name, indexed.key_columns)
        plan = await in_catalog(plan_catch_up, table, index)
        if isinstance(plan, Current):
            return index, 0
        if isinstance(plan, TableBehind):
            raise CatalogConflict(
                f"table {indexed.name} as loaded (snapshot {indexed.snapshot_id}) is older than its key index "
                f"(snapshot {plan.index_snapshot_id}): load it again"
            )
        if isinstance(plan, CatchUp):
            # A catch-up of a compaction may load millions of rows in one statement.
            await key_index.without_statement_timeout(session)
            started = time.monotonic()
            loaded = 0
            for snapshot_id in plan.snapshot_ids:
                changes = await in_catalog(snapshot_changes, table, snapshot_id)
                applied = changes if isinstance(changes, Rebuild) else await self._apply(session, table, index, changes)
                if isinstance(applied, Rebuild):
                    return index, await self._rebuild(session, table, indexed, index, applied.reason)
                loaded += applied
            log.info(
                "key index caught up",
                table=indexed.name,
                snapshots=len(plan.snapshot_ids),
                rows_loaded=loaded,
                seconds=round(time.monotonic() - started, 3),
            )
            return index, loaded
        return index, await self._rebuild(session, table, indexed, index, plan.reason)

    async def _apply(
        self, session: AsyncSession, table: LoadedTable, index: IndexState, changes: SnapshotChanges
    ) -> Rebuild | int:
        """Apply one snapshot's changes: its removed data files' rows out, its added data files' rows in (how many:
        the answer), the rows its added position delete files delete out, but those its removed ones deleted already
        (a compaction that merges a partition's delete files into one adds a file of rows long gone); Rebuild when a
        removed delete file deleted a row of a data file it keeps that no added one deletes (the row may be live
        again)."""
        index_id = index.index_id
        gone = await key_index.file_ids_by_path(session, index_id, changes.removed_paths)
        removed = await key_index.remove_files(session, index_id, list(gone.values()))
        added = await self._add_data_files(session, table, index_id, changes.added_data)
        before = await in_catalog(deleted_by_path, table, changes.removed_deletes)
        after = await in_catalog(deleted_by_path, table, changes.added_deletes)
        revived = [path for path, rows in before.items() if _without(rows, after.get(path)).size]
        kept = await key_index.file_ids_by_path(session, index_id, revived)
        if kept:
            return Rebuild(
                f"snapshot {changes.snapshot_id} removed a delete file of data files it keeps ({min(kept)}): "
                "the rows it deleted may be live again"
            )
        newly = {path: _without(rows, before.get(path)) for path, rows in after.items()}
        numbers = await key_index.file_ids_by_path(session, index_id, list(newly))
        removed += await key_index.remove_rows(session, index_id, _places(numbers, newly))
        await key_index.move_to(session, index_id, changes.snapshot_id, added - removed)
        return added

    async def _add_data_files(
        self, session: AsyncSession, table: LoadedTable, index_id: int, data_files: Sequence[TableFile]
    ) -> int:
        """Name these data files in the index and load every row of each; how many rows."""
        if not data_files:
            return 0
        new_files = await asyncio.to_thread(files_to_index, table, data_files)
        numbers = await key_index.add_files(session, index_id, new_files)
        loaded = 0

        async def pieces() -> AsyncIterator[bytes]:
            nonlocal loaded
            for data_file, new_file in zip(data_files, new_files, strict=True):
                count, file_pieces = await in_catalog(added_pieces, table, data_file, index_id, numbers[new_file.path])
                loaded += count
                for piece in file_pieces:
                    yield piece

        await key_index.copy_in(session, pieces())
        return loaded

    async def _rebuild(
        self, session: AsyncSession, table: LoadedTable, indexed: IndexedTable, index: IndexState, reason: str
    ) -> int:
        """Load the index afresh from the live rows of the table's current snapshot (the scan key_resolution reads
        keys with), with COPY; how many rows."""
        started = time.monotonic()
        await key_index.without_statement_timeout(session)  # the table's every row, in one statement
        await key_index.empty_index(session, index.index_id, indexed.name, indexed.key_columns, indexed.key_types)
        tasks, new_files = await in_catalog(live_files_to_index, table)
        numbers = await key_index.add_files(session, index.index_id, new_files)
        files = live_pieces(table, tasks, index.index_id, numbers)
        loaded = 0

        async def pieces() -> AsyncIterator[bytes]:
            nonlocal loaded
            while (read := await in_catalog(next, files, None)) is not None:
                count, file_pieces = read
                loaded += count
                for piece in file_pieces:
                    yield piece

        try:
            await key_index.copy_in(session, pieces())
        finally:
            # A cancelled call may leave a read running in its thread ("generator already executing"): the reader
            # pool then ends with the generator, when it is collected.
            with suppress(ValueError):
                await asyncio.to_thread(files.close)
        await key_index.mark_built(session, index.index_id, indexed.snapshot_id, loaded)
        log.info(
            "key index rebuilt",
            table=indexed.name,
            reason=reason,
            rows=loaded,
            files=len(new_files),
            seconds=round(time.monotonic() - started, 3),
        )
        return loaded

    async def _analyze(self) -> None:
        """Bring the planner's statistics of the index to what a load just put in it, after its transaction: without
        them PostgreSQL reads a table's whole index for a lookup by key or place (it takes `index_id = n` for
        selective). Autovacuum keeps them after that, as commits change the index a little at a time."""
        started = time.monotonic()
        async with self.database.connection(autocommit=True) as connection:
            await key_index.refresh_statistics(connection)
        log.info("key index statistics refreshed", seconds=round(time.monotonic() - started, 3))


def _without(rows: RowNumbers, others: RowNumbers | None) -> RowNumbers:
    """`rows` (each once) not among `others`."""
    return rows if others is None else np.setdiff1d(rows, others, assume_unique=True)


def _places(numbers: Mapping[str, int], positions: Mapping[str, RowNumbers]) -> list[int]:
    """The places (key_index.file_row) of these positions by path, in the files the index names (`numbers`): a file
    it does not name holds no row of it."""
    return [
        key_index.file_row(numbers[path], position)
        for path, rows in positions.items()
        if path in numbers
        for position in rows.tolist()
    ]


async def _each(pieces: Iterable[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
