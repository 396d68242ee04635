"""The state the writer-facing operations share: the log, the tables, the committer and cleaner they wake, and each
sink as last read (a hint for the pre-commit's fast path, which checks the sink again in SQL)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service.contract.errors import InvalidArgument, quote
from coordinator_service.engine.cleaner import Cleaner
from coordinator_service.engine.committer import Committer
from coordinator_service.engine.grouped_statement import GroupedStatement
from coordinator_service.engine.writer_calls import WriterCalls
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.log import checkpoint_record, epoch_transitions, sink_tables
from coordinator_service.log.database import Database
from coordinator_service.log.models import Sink
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SinkHint:
    """A sink as last read, for the pre-commit's fast path (which checks the sink again in SQL)."""

    sink_id: int
    table: str
    tables: frozenset[str]
    # Its key (fixed when the sink is created): key files are refused without one.
    key_columns: tuple[str, ...] = ()


class ProtocolBase:
    """What every writer-facing operation of the protocol shares (coordinator_service.engine.protocol.Coordinator
    is made of them: registration, pre-commit, checkpoint)."""

    def __init__(self, database: Database, iceberg: TableFormat, committer: Committer, cleaner: Cleaner) -> None:
        self.database = database
        self.iceberg = iceberg
        self.committer = committer
        self.cleaner = cleaner
        # Sink name -> its id, own table and tables, as last read; only a hint for the fast path, which re-checks
        # the sink in SQL (a table once the sink's stays the sink's).
        self._sink_hints: dict[str, SinkHint] = {}
        # The fast paths' statements, each grouped across sinks (group commit): a first pre-commit's row, and a
        # checkpoint's record.
        self._group_insert = GroupedStatement(
            database, "insert of first pre-commits", _new_epoch_key, epoch_transitions.insert_new_epochs
        )
        self._group_checkpoint = GroupedStatement(
            database, "record of checkpoints", _checkpoint_key, checkpoint_record.record_checkpoints_over_pending
        )
        # The transport notes each writer call it answered here (liveness, coordinator_service.engine.writer_calls).
        self.writer_calls = WriterCalls(database)

    async def close(self) -> None:
        await self._group_insert.close()
        await self._group_checkpoint.close()
        await self.writer_calls.stop()


def _new_epoch_key(row: epoch_transitions.NewEpoch) -> tuple[int, int]:
    return (row.sink_id, row.epoch)


def _checkpoint_key(checkpoint: checkpoint_record.Checkpoint) -> str:
    return checkpoint.name


async def hint_of(session: AsyncSession, sink: Sink) -> SinkHint:
    tables = await sink_tables.tables_of_sink(session, sink.id)
    names = frozenset(table.identifier for table in tables)
    return SinkHint(sink.id, sink.table_identifier, names, tuple(sink.key_columns))


def key_files_by_table(request: PreCommitRequest, sink: SinkHint) -> dict[str, list[str]]:
    """The pre-commit's key files by table (as files_by_table); refused for a sink without a key."""
    if request.key_paths and not sink.key_columns:
        raise InvalidArgument(
            f"sink {request.sink} epoch {request.epoch}: the pre-commit names key files, but the sink has no key (an "
            "append stream): key files are for upsert and change streams, registered with their key. Nothing was "
            "changed"
        )
    return files_by_table(request, sink, request.key_paths) if request.key_paths else {}


def files_by_table(request: PreCommitRequest, sink: SinkHint, paths: Sequence[str]) -> dict[str, list[str]]:
    """The pre-commit's `paths` by the table each belongs to, the sink's own first; a table that is not the sink's
    is refused."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        groups.setdefault(request.file_tables.get(path) or sink.table, []).append(path)
    unknown = sorted(set(groups) - sink.tables)
    if unknown:
        raise InvalidArgument(
            f"sink {request.sink} epoch {request.epoch}: data files name table {quote(unknown[0])}, which is not one "
            f"of the sink's {len(sink.tables)} tables (its own is {sink.table}): call EnsureTables for it before "
            "writing its files. Nothing was changed"
        )
    return dict(sorted(groups.items(), key=lambda group: (group[0] != sink.table, group[0])))
