"""An operator's actions on a sink's tables: remove a fan-out table from it, delete the sink (and its tables, when
asked), each under the sink's commit lock, deleting files only through coordinator_service.engine.file_deletion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import structlog

from coordinator_service.contract.errors import CatalogUnavailable, FailedPrecondition, InvalidArgument, NotFound, quote
from coordinator_service.engine.file_deletion import DELETE_BATCH, DroppedTable, FileDeleter
from coordinator_service.engine.operator.answers import GivenUp, Operator, SinkDeleted, TableRemoved
from coordinator_service.engine.operator.base import OperationsBase, check_known_name, pending_epochs, sink_named
from coordinator_service.log import (
    commit_lock,
    epoch_reads,
    epoch_transitions,
    part_rows,
    path_claims,
    precommit_metadata,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.models import AbortCause, Sink
from coordinator_service.log.path_claims import CleanupDelays, MarkRule
from coordinator_service.log.sink_rows import RowLock
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog

log = structlog.get_logger(__name__)


class TableActions(OperationsBase):
    """An operator's removal of a fan-out table from its sink, and the deletion of a sink."""

    async def remove_table(self, name: str, table: str, confirm: str, reason: str, operator: Operator) -> TableRemoved:
        """The way out of a fan-out table gone for good (dropped from its catalog): it stops being one of the sink's
        tables, and the files the sink's epochs that are not COMMITTED have there are given up (their records are
        counted in the answer and the log; their paths are no longer the log's to delete). The writer is fenced: a
        writer still routing to the table must restart (its EnsureTables would make the table the sink's again).
        The sink's own table cannot be removed."""
        check_known_name(name)
        if confirm != table:
            raise InvalidArgument(f"confirm must repeat the table name {quote(table)} exactly, got {quote(confirm)}")
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
        if table == sink.table_identifier:
            raise FailedPrecondition(
                f"{quote(table)} is sink {name}'s own table: it cannot be removed from the sink, only the sink itself"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "remove table") as lock:
            await lock.verify()
            async with self.database.transaction() as session:
                sink = await sink_named(session, name, lock=RowLock.UPDATE)
                if table not in await sink_tables.recorded_epochs(session, sink.id):
                    raise NotFound(f"table {quote(table)} is not one of sink {name}'s tables")
                given_up = []
                for row in await epoch_reads.epochs_not_committed(session, sink.id):
                    metadata = precommit_metadata.decode(row.metadata_)
                    gone = metadata.by_table().get(table, [])
                    gone_keys = metadata.key_files_by_table().get(table, [])
                    if not gone and not gone_keys:
                        continue
                    kept = replace(
                        metadata,
                        data_files=tuple(e for e in metadata.data_files if e not in gone),
                        key_files=tuple(e for e in metadata.key_files if e not in gone_keys),
                    )
                    epoch_transitions.give_files_up(row, kept)
                    await path_claims.forget(session, [e.path for e in gone] + [e.path for e in gone_keys])
                    given_up.append(GivenUp(row.epoch, len(gone), sum(entry.record_count for entry in gone)))
                await sink_tables.remove_table(session, sink.id, table)
                sink.writer_term += 1
                await epoch_transitions.advance_committed_epoch(session, sink.id)
        log.warning(
            "table removed from a sink by an operator",
            sink=name,
            table=table,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            given_up={each.epoch: each.records for each in given_up},
            writer_term=sink.writer_term,
        )
        await self.committer.resume(sink.id)  # stuck on the table, most likely: the cause is gone
        return TableRemoved(table, await self.sink(name), tuple(given_up))

    async def missing_from_catalog(self, tables: Sequence[str]) -> set[str]:
        """Those of `tables` the catalog does not have (dropped from it); none when the catalog cannot be asked."""
        try:
            return {table for table in tables if not await in_catalog(self.iceberg.exists, table)}
        except CatalogUnavailable:
            return set()

    async def delete_sink(
        self, name: str, confirm: str, reason: str, drop_tables: bool, operator: Operator
    ) -> SinkDeleted:
        """Delete a sink: its rows in the log, the files of its epochs not committed, and with drop_tables its
        tables and their files. Refused, nothing changed, without its name in `confirm`, while its writer is
        live (a call within STALLED_AFTER_SECONDS: its next call would find no sink, and a restart would create
        it again without its epochs), and for drop_tables when another sink writes one of its tables.

        Holding the sink's commit lock (no commit, cleaner or maintenance of it meanwhile), its tables are fenced
        (as an abort does), every PENDING epoch is aborted, and every path it gave up goes to file_deletion at
        once (no cleanup delay: nothing will need them), which proves each one garbage or leaves it; then, when
        asked, the tables are dropped (_drop_tables) and the sink's rows deleted. What kept tables hold stays."""
        check_known_name(name)
        if confirm != name:
            raise InvalidArgument(f"confirm must repeat the sink name {name!r} exactly, got {quote(confirm)}")
        overview = await self.sink(name)
        async with self.database.transaction() as session:
            others = await sink_rows.sinks_writing(session, [t.identifier for t in overview.tables], besides=name)
        sink, called = overview.sink, overview.counts.writer_last_call_age_seconds
        if called is not None and called < self.settings.stalled_after_seconds:
            raise FailedPrecondition(
                f"sink {name}: its writer (term {sink.writer_term}) called {called:.0f} s ago: stop it first (its "
                "next call would find no sink, and its restart would create the sink again without these epochs), "
                f"then delete once it has been silent {self.settings.stalled_after_seconds:g} s "
                "(STALLED_AFTER_SECONDS). Nothing was changed"
            )
        if drop_tables and others:
            table, writers = next(iter(others.items()))
            raise FailedPrecondition(
                f"sink {name}: table {table} is also written by sink{'s' if len(writers) > 1 else ''} "
                f"{', '.join(writers)}: delete the sink without drop_tables, or those sinks first. Nothing was changed"
            )
        async with commit_lock.holding(self.database, sink.id, self.lock_timeout_seconds, "delete") as lock:
            present = [t.identifier for t in overview.tables if await in_catalog(self.iceberg.exists, t.identifier)]
            await self._fence(sink, present, lock, f"deletion of sink {name} by {operator}")
            async with self.database.transaction() as session:
                given_up = tuple(
                    GivenUp(row.epoch, row.file_count, row.record_count)
                    for row in await pending_epochs(session, sink, at_or_below=None)
                )
                await epoch_transitions.abort_pending_above(
                    session, sink.id, -1, f"sink deleted by {operator}: {reason}", AbortCause.OPERATOR
                )
                await part_rows.drop_parts(session, sink.id)
            deleted, kept = await self._delete_given_up(sink, present, lock)
            if drop_tables:
                dropped_deleted, dropped_kept = await self._drop_tables(sink, present, lock)
                deleted, kept = deleted + dropped_deleted, kept + dropped_kept
            await lock.verify()
            async with self.database.transaction() as session:
                await sink_rows.delete_sink(session, sink.id)
        dropped = tuple(present) if drop_tables else ()
        log.warning(
            "sink deleted by an operator",
            sink=name,
            who=operator.identity,
            client=operator.address,
            reason=reason,
            given_up={each.epoch: each.records for each in given_up},
            files_deleted=deleted,
            files_kept=kept,
            tables_dropped=list(dropped),
        )
        return SinkDeleted(name, given_up, deleted, kept, dropped)

    async def _delete_given_up(self, sink: Sink, tables: Sequence[str], lock: CommitLock) -> tuple[int, int]:
        """Every path the sink gave up, through file_deletion now (no delay); how many were deleted and how many
        left (the log stops deciding those: they stay on storage)."""
        at_once = CleanupDelays(0.0, 0.0)
        deleter = FileDeleter(self.database, self.iceberg, at_once)
        deleted = kept = 0
        while True:
            async with self.database.transaction() as session:
                due = [path.path for path in await path_claims.due_paths(session, sink.id, at_once, DELETE_BATCH)]
            if not due:
                return deleted, kept
            # No table left to prove them against (dropped by hand): nothing to hand the deleter, which would count
            # each as a refused deletion (an alert).
            done = await deleter.delete(sink.name, sink.id, lock, tables, due, MarkRule.DISCARDED) if tables else None
            left = sorted(set(due) - set(done.deleted if done else ()))
            async with self.database.transaction() as session:
                await path_claims.forget(session, left)
            deleted, kept = deleted + len(due) - len(left), kept + len(left)

    async def _drop_tables(self, sink: Sink, tables: Sequence[str], lock: CommitLock) -> tuple[int, int]:
        """Drop the tables from their catalog (the entry only: a catalog's purge would delete every file a table
        names, wherever it lies), then hand every file each one reached, read right before its drop under the lock,
        to file_deletion: it deletes those it proves garbage (under the dropped table's own directories, no link,
        no nested table, claimed by no other sink, the table still absent from the catalog). How many were deleted,
        and how many left on storage."""
        dropped, reached = [], set()
        for table in tables:
            await lock.verify()
            loaded = await in_catalog(self.iceberg.load, table)
            reached |= await in_catalog(tm.referenced_files, loaded)
            await in_catalog(self.iceberg.drop, table)
            dropped.append(DroppedTable(table, loaded))
        deleter = FileDeleter(self.database, self.iceberg, CleanupDelays(0.0, 0.0))
        done = await deleter.delete(
            sink.name, sink.id, lock, dropped, sorted(reached), MarkRule.DROPPED, metadata_files=True
        )
        return len(done.deleted), len(reached) - len(done.deleted)
