"""The two-phase commit state machine: register, pre-commit, checkpoint, state.

An epoch is PENDING once its pre-commit is durable, COMMITTED once its files
are in the Iceberg table, ABORTED when recovery or an operator gave it up.
This module decides every transition; it knows no transport and reaches
Iceberg only through coordinator_service.tables.iceberg, in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import pyarrow as pa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import (
    CheckpointBehind,
    CoordinatorError,
    EpochAborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    quote,
)
from coordinator_service.contract.source_positions import check_positions
from coordinator_service.contract.table_identifiers import check_sink_name, check_table_identifier
from coordinator_service.contract.views import (
    CheckpointResult,
    EpochStatus,
    EpochView,
    PreCommitOutcome,
    PreCommitResult,
    Registration,
    SinkState,
    SinkTable,
    TableLocation,
    TablesEnsured,
    from_attributes,
)
from coordinator_service.engine import settlement
from coordinator_service.engine.cleaner import Cleaner
from coordinator_service.engine.committer import Committer
from coordinator_service.engine.writer_calls import WriterCalls
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import (
    checkpoint_record,
    commit_lock,
    commit_record,
    epoch_numbering,
    epoch_reads,
    epoch_transitions,
    part_rows,
    path_claims,
    precommit_metadata,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.database import Database
from coordinator_service.log.epoch_rules import check_checkpoint_range, check_not_suspended, check_term, existing_sink
from coordinator_service.log.models import AbortCause, EpochRecord, Sink
from coordinator_service.log.precommit_metadata import DataFileEntry, KeyFileEntry, PreCommitMetadata
from coordinator_service.log.sink_rows import RowLock
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.file_paths import canonical_uri, check_inside_location
from coordinator_service.tables.iceberg import DescribedFiles, IcebergGateway
from coordinator_service.tables.key_files import DescribedKeyFiles, read_key_files
from coordinator_service.tables.keyed_tables import check_key_request
from coordinator_service.tables.precommit_files import FileFacts, check_facts
from coordinator_service.tables.schema_fit import decode_arrow_schema

log = structlog.get_logger(__name__)

# Most first pre-commits written by one statement of the group insert.
GROUP_INSERT_MAX_ROWS = 256
MAX_FILES_PER_PRECOMMIT = 100_000
# Tables one EnsureTables call may name.
MAX_TABLES_PER_ENSURE = 1_000
MAX_PROPERTIES_BYTES = 64 * 1024
# How often a multi-writer epoch's part looks whether another writer's part completed the epoch.
MULTI_WRITER_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class PreCommitRequest:
    sink: str
    epoch: int
    writer_term: int
    paths: tuple[str, ...]
    writer_id: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    evolve_schema: bool = False
    # What the writer sent about some of the files besides their paths (their footers, sizes), by path.
    file_facts: Mapping[str, FileFacts] = field(default_factory=dict)
    # A directory holding every file (the writer's directory of the batch), listed once to check them; or "".
    files_directory: str = ""
    # Fan-out: the table of each file that names one (by path); the others are the sink's own table's.
    file_tables: Mapping[str, str] = field(default_factory=dict)
    # A keyed sink's key files (their facts and tables by path too, in file_facts and file_tables).
    key_paths: tuple[str, ...] = ()

    @property
    def all_paths(self) -> tuple[str, ...]:
        """Every file the pre-commit names: its data files, then its key files."""
        return (*self.paths, *self.key_paths)


@dataclass(frozen=True)
class TableRequest:
    """A table a fan-out writer routes records to (EnsureTables)."""

    table: str
    arrow_schema: bytes = b""
    partition_by: tuple[str, ...] = ()
    key_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class _SinkHint:
    """A sink as last read, for the pre-commit's fast path (which checks the sink again in SQL)."""

    sink_id: int
    table: str
    tables: frozenset[str]
    # Its key (fixed when the sink is created): key files are refused without one.
    key_columns: tuple[str, ...] = ()


class GroupInsert:
    """Group commit of first pre-commits: those that arrive while one PostgreSQL transaction runs share the next.

    No timer: a lone writer's row is written at once; under load, every transaction carries all the rows
    that queued up meanwhile (up to GROUP_INSERT_MAX_ROWS), one statement and one WAL flush for all of them.
    Each caller is answered only after the transaction holding its row has committed.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        # Its own connection, outside the pool, in autocommit: the one INSERT statement is the transaction,
        # durable when it returns (one round trip, not an INSERT and a COMMIT).
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._queue: list[tuple[epoch_transitions.NewEpoch, asyncio.Future[bool]]] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None

    async def insert(self, row: epoch_transitions.NewEpoch) -> bool:
        """True once the row is durably inserted; False if it was not (the general path decides then)."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((row, answer))
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain(), name="precommit-group-insert")
        return await answer

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:GROUP_INSERT_MAX_ROWS], self._queue[GROUP_INSERT_MAX_ROWS:]
                await self._write(batch)
        finally:
            self._draining = False

    async def _write(self, batch: list[tuple[epoch_transitions.NewEpoch, asyncio.Future[bool]]]) -> None:
        # One row per (sink, epoch): a second request for the same epoch goes the general way.
        unique: dict[tuple[int, int], epoch_transitions.NewEpoch] = {}
        for row, _ in batch:
            unique.setdefault((row.sink_id, row.epoch), row)
        rows = sorted(unique.values(), key=lambda row: (row.sink_id, row.epoch))  # one lock order
        try:
            if self._connection is None or self._connection.closed:
                self._connection = await psycopg.AsyncConnection.connect(
                    self.database.libpq_url, autocommit=True, **self.database.options.libpq()
                )
            inserted = await epoch_transitions.insert_new_epochs(self._connection, rows)
        except Exception as error:
            log.warning("group insert of pre-commits failed; each goes the general way", error=str(error))
            inserted = set()
            await self.close()
        for row, answer in batch:
            if not answer.done():  # a caller that gave up (deadline) is not answered
                answer.set_result(unique[(row.sink_id, row.epoch)] is row and (row.sink_id, row.epoch) in inserted)

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None


class Coordinator:
    """The writer-facing operations of the protocol."""

    def __init__(self, database: Database, iceberg: IcebergGateway, committer: Committer, cleaner: Cleaner) -> None:
        self.database = database
        self.iceberg = iceberg
        self.committer = committer
        self.cleaner = cleaner
        # Sink name -> its id, own table and tables, as last read; only a hint for the fast path, which re-checks
        # the sink in SQL (a table once the sink's stays the sink's).
        self._sink_hints: dict[str, _SinkHint] = {}
        self._group_insert = GroupInsert(database)
        # The transport notes each writer call it answered here (liveness, coordinator_service.engine.writer_calls).
        self.writer_calls = WriterCalls(database)

    async def close(self) -> None:
        await self._group_insert.close()
        await self.writer_calls.stop()

    async def register_writer(
        self,
        sink: str,
        table: str,
        checkpointed_epoch: int,
        writer_count: int = 1,
        arrow_schema: bytes = b"",
        partition_by: Sequence[str] = (),
        key_columns: Sequence[str] = (),
    ) -> Registration:
        check_sink_name(sink)
        check_key_request(key_columns)
        if checkpointed_epoch < -1:
            raise InvalidArgument(f"checkpointed_epoch {checkpointed_epoch} is below -1 (-1 means no checkpoint)")
        if writer_count < 1:
            raise InvalidArgument(f"writer_count {writer_count} must be at least 1")
        schema: pa.Schema | None = decode_arrow_schema(arrow_schema) if arrow_schema else None

        # Every check first: a writer that will be refused changes nothing, the table included.
        async with self.database.transaction() as session:
            existing = await sink_rows.sink_by_name(session, sink)
            self._check_new_tables([table], set() if existing is None else {existing.table_identifier})
            if existing is not None:
                await _check_registration(session, existing, table, checkpointed_epoch, key_columns)
                above = await epoch_reads.pending_epochs_above(session, existing.id, checkpointed_epoch)
                recorded = await sink_tables.recorded_epochs(session, existing.id)
            others = (await sink_rows.sinks_writing(session, [table], besides=sink)).get(table, [])
        location = await in_catalog(
            self.iceberg.ensure_table, table, schema, tuple(partition_by), others, tuple(key_columns)
        )
        await failpoints.hit(Failpoint.REGISTER_BEFORE_RECOVERY)

        if existing is not None and above:
            # Epochs are about to be aborted: under the commit lock, what the table holds is settled first.
            async with commit_lock.holding(
                self.database, existing.id, self.committer.settings.admin_lock_timeout_seconds, f"sink {sink}: register"
            ) as lock:
                found = await settlement.holdings(self.iceberg, existing, recorded, above)
                if found.touched():
                    # Above the writer's checkpoint, yet in the tables: the checkpoint is behind the tables.
                    # Unreachable while the log is sound (only checkpointed epochs are appended).
                    async with self.database.transaction() as session:
                        marked = await commit_record.mark_held(session, existing.id, found.held)
                    raise CheckpointBehind(
                        f"sink {sink}: its tables already hold epochs {found.touched()}, above the writer's checkpoint "
                        f"{checkpointed_epoch}: the Spark checkpoint was lost or rolled back. Those in all their "
                        f"tables ({marked}) were marked COMMITTED and nothing else changed; reset the sink with "
                        f"POST /api/v1/sinks/{sink}/reset and start from a new checkpoint"
                    )
                await lock.verify()
                registration, sink_id = await self._register(
                    sink, table, checkpointed_epoch, writer_count, location, key_columns
                )
        else:
            registration, sink_id = await self._register(
                sink, table, checkpointed_epoch, writer_count, location, key_columns
            )
        await failpoints.hit(Failpoint.REGISTER_AFTER_RECOVERY)
        log.info(
            "writer registered",
            sink=sink,
            table=table,
            writer_term=registration.writer_term,
            checkpointed_epoch=checkpointed_epoch,
            aborted_epochs=list(registration.aborted_epochs),
            recommitting_epochs=list(registration.recommitting_epochs),
        )
        self.committer.wake(sink_id)
        if registration.aborted_epochs:
            self.cleaner.wake()
        return registration

    async def _register(
        self,
        sink: str,
        table: str,
        checkpointed_epoch: int,
        writer_count: int,
        location: str,
        key_columns: Sequence[str],
    ) -> tuple[Registration, int]:
        """The registration's one transaction: the checks again, under the sink's row lock, then the new term."""
        async with self.database.transaction() as session:
            await sink_rows.insert_sink_if_absent(
                session, sink, table, self.iceberg.catalog_name, checkpointed_epoch, key_columns
            )
            row = await sink_rows.sink_by_name(session, sink, lock=RowLock.UPDATE)
            assert row is not None
            if row.rebase_on_register:
                await _rebase_after_reset(session, row, checkpointed_epoch)
            await _check_registration(session, row, table, checkpointed_epoch, key_columns)
            row.writer_term += 1
            row.writer_count = writer_count
            row.checkpointed_epoch = checkpointed_epoch
            await part_rows.drop_parts(session, row.id)  # parts of multi-writer epochs of the fenced term
            aborted = await epoch_transitions.abort_pending_above(
                session,
                row.id,
                checkpointed_epoch,
                f"recovery: writer term {row.writer_term} restarted from checkpoint {checkpointed_epoch}",
                AbortCause.RECOVERY,
            )
            metrics.ABORTED_EPOCHS.labels(sink, "recovery").inc(len(aborted))
            await epoch_transitions.advance_committed_epoch(session, row.id)
            await session.refresh(row)
            recommitting = await epoch_reads.pending_epochs_at_or_below(
                session, row.id, checkpointed_epoch, limit=MAX_FILES_PER_PRECOMMIT
            )
            self._sink_hints[sink] = await _hint(session, row)
            return (
                Registration(
                    writer_term=row.writer_term,
                    committed_epoch=row.committed_epoch,
                    checkpointed_epoch=row.checkpointed_epoch,
                    aborted_epochs=tuple(aborted),
                    recommitting_epochs=tuple(r.epoch for r in recommitting),
                    table_location=location,
                    nested_namespaces=self.iceberg.nested_namespaces,
                    key_columns=tuple(row.key_columns),
                ),
                row.id,
            )

    def _check_new_tables(self, tables: Sequence[str], recorded: set[str]) -> None:
        """The name policy (table_identifiers) for each table the log does not record yet: a sink's table named
        before the policy existed keeps working; a new one must fit it, on this catalog."""
        for table in tables:
            if table not in recorded:
                check_table_identifier(table, nested_namespaces=self.iceberg.nested_namespaces)

    async def ensure_tables(self, sink: str, writer_term: int, tables: Sequence[TableRequest]) -> TablesEnsured:
        """Fan-out: create or evolve each table as RegisterWriter does the sink's own, then make them the sink's.

        Every check first (the request, the sink, the term): a writer that will be refused changes nothing. The
        tables are made the sink's under its row lock with the term checked again, so a writer fenced meanwhile
        adds none (a table it created in the catalog stays there, unused, as after a refused RegisterWriter).
        """
        check_sink_name(sink)
        if len(tables) > MAX_TABLES_PER_ENSURE:
            raise InvalidArgument(f"{len(tables)} tables in one EnsureTables exceed {MAX_TABLES_PER_ENSURE}")
        names = [spec.table for spec in tables]
        if len(set(names)) != len(names):
            duplicate = next(name for name in names if names.count(name) > 1)
            raise InvalidArgument(f"EnsureTables names table {quote(duplicate)} more than once")
        for spec in tables:
            check_key_request(spec.key_columns)
        schemas = [decode_arrow_schema(spec.arrow_schema) if spec.arrow_schema else None for spec in tables]
        async with self.database.transaction() as session:
            existing = await existing_sink(session, sink)
            check_term(existing, writer_term)
            for spec in tables:
                _check_same_key(existing, spec.key_columns, spec.table)
            self._check_new_tables(names, set(await sink_tables.recorded_epochs(session, existing.id)))
            others = await sink_rows.sinks_writing(session, names, besides=sink)
        locations = [
            await in_catalog(
                self.iceberg.ensure_table,
                spec.table,
                schema,
                spec.partition_by,
                others.get(spec.table, []),
                spec.key_columns,
            )
            for spec, schema in zip(tables, schemas, strict=True)
        ]
        async with self.database.transaction() as session:
            row = await existing_sink(session, sink, lock=RowLock.UPDATE)
            check_term(row, writer_term)
            await sink_tables.add_tables(session, row, names)
            self._sink_hints[sink] = await _hint(session, row)
        log.info("tables ensured", sink=sink, writer_term=writer_term, tables=names)
        return TablesEnsured(
            tuple(
                TableLocation(spec.table, location, spec.key_columns)
                for spec, location in zip(tables, locations, strict=True)
            )
        )

    async def pre_commit(self, request: PreCommitRequest) -> PreCommitResult:
        started = time.monotonic()
        _check_precommit_request(request)
        request = replace(
            request,
            paths=tuple(canonical_uri(path) for path in request.paths),
            key_paths=tuple(canonical_uri(path) for path in request.key_paths),
            file_facts={canonical_uri(path): facts for path, facts in request.file_facts.items()},
            files_directory=canonical_uri(request.files_directory) if request.files_directory else "",
            file_tables={canonical_uri(path): table for path, table in request.file_tables.items()},
        )
        if len(set(request.all_paths)) != len(request.all_paths):
            raise InvalidArgument("the pre-commit names a data file (or key file) more than once")
        if request.files_directory:
            for path in request.all_paths:
                check_inside_location(path, request.files_directory, within="files_directory")
        log_ = log.bind(
            sink=request.sink, epoch=request.epoch, writer_term=request.writer_term, writer_id=request.writer_id
        )
        fast = await self._pre_commit_first_attempt(request)
        if fast is not None:
            metrics.record_precommit(request.sink, time.monotonic() - started)
            log_.debug(
                "pre-commit persisted", attempt=fast.attempt, records=fast.record_count, files=len(request.paths)
            )
            return fast
        async with self.database.transaction() as session:
            sink = await existing_sink(session, request.sink)
            hint = self._sink_hints[sink.name] = await _hint(session, sink)
            check_term(sink, request.writer_term)
            if request.writer_id >= sink.writer_count:
                raise InvalidArgument(
                    f"writer_id {request.writer_id} is out of range: sink {sink.name} has "
                    f"writer_count {sink.writer_count} (ids 0..{sink.writer_count - 1})"
                )
            if request.epoch <= sink.committed_epoch:
                log_.info("pre-commit of an epoch already committed")
                return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=0, record_count=0)
            current = await epoch_reads.epoch_row(session, sink.id, request.epoch)
            sink_id, writer_count = sink.id, sink.writer_count
        groups = _files_by_table(request, hint, request.paths)
        key_groups = _key_files_by_table(request, hint)
        if current is not None:
            repeated = answer_if_repeated(current, request)
            if repeated is not None:
                return repeated
        files = await self._read_files(hint, groups, request, request.evolve_schema)
        key_files = await self._read_key_files(hint, key_groups, request)
        deadline = self._claim_deadline(files, key_files)
        if writer_count == 1:
            result = await self._persist(
                sink_id, request, files.entries, key_files.entries, dict(request.properties), deadline
            )
        else:
            result = await self._gather(sink_id, writer_count, request, files.entries, key_files.entries, deadline)
        metrics.record_precommit(request.sink, time.monotonic() - started)
        log_.debug(
            "pre-commit persisted", attempt=result.attempt, records=result.record_count, files=len(files.entries)
        )
        return result

    async def _pre_commit_first_attempt(self, request: PreCommitRequest) -> PreCommitResult | None:
        """The common case in one statement: the first pre-commit of an epoch, by the only writer, term current.

        Reads the footers on the (cached) table of the sink as last seen, then inserts the row through the
        group insert, whose SQL checks the term, the committed epoch and the writer count under the sink's
        share lock. Anything else (a repeat, a re-attempt, a refusal, a bad file, a multi-writer sink)
        returns None, and the general path answers it from the start, in its order of checks.
        """
        hint = self._sink_hints.get(request.sink)
        if hint is None or request.writer_id != 0:
            return None
        try:
            # Never evolve here: the tables must not change for a request that may yet be refused (a fenced
            # term). Files that need new columns fail to fit, and the general path evolves after its checks.
            # A table the sink did not have when last read is looked up by the general path.
            files = await self._read_files(hint, _files_by_table(request, hint, request.paths), request, False)
            key_files = await self._read_key_files(hint, _key_files_by_table(request, hint), request)
        except CoordinatorError:
            return None
        metadata = PreCommitMetadata(
            table=hint.table,
            data_files=tuple(files.entries),
            properties=dict(request.properties),
            key_files=tuple(key_files.entries),
        )
        row = epoch_transitions.NewEpoch(
            sink_id=hint.sink_id,
            epoch=request.epoch,
            writer_term=request.writer_term,
            metadata=precommit_metadata.encode(metadata),
            file_count=len(files.entries),
            record_count=metadata.record_count,
            paths=request.all_paths,
            tables=tuple(sorted((set(metadata.by_table()) | set(metadata.key_files_by_table())) - {hint.table})),
            deadline=self._claim_deadline(files, key_files),
        )
        await failpoints.hit(Failpoint.PRECOMMIT_BEFORE_PERSIST)
        if not await self._group_insert.insert(row):
            return None
        await failpoints.hit(Failpoint.PRECOMMIT_AFTER_PERSIST)
        return PreCommitResult(PreCommitOutcome.PERSISTED, attempt=1, record_count=metadata.record_count)

    def _claim_deadline(self, files: DescribedFiles, key_files: DescribedKeyFiles) -> float | None:
        """Until when the pre-commit may claim its files' paths: ORPHAN_GRACE_SECONDS after the oldest was written,
        when the orphan sweep may delete it (path_claims)."""
        written = [each.written_at for each in (files, key_files) if each.written_at is not None]
        if not written:
            return None
        return min(written) + self.committer.settings.orphan_grace_seconds

    async def _read_files(
        self, hint: _SinkHint, groups: Mapping[str, Sequence[str]], request: PreCommitRequest, evolve_schema: bool
    ) -> DescribedFiles:
        """The manifest entries of the pre-commit's files, each checked against its own table (location, schema,
        partitioning; evolved by its own files), the sink's own table's first, then by table name, and when the
        oldest was written. The tables are read concurrently; an empty epoch makes no trip to the catalog's
        thread."""
        reads = [
            in_catalog(
                self.iceberg.read_data_files,
                table,
                paths,
                request.writer_id,
                evolve_schema,
                request.file_facts,
                request.files_directory,
            )
            for table, paths in groups.items()
        ]
        read = await asyncio.gather(*reads)
        return DescribedFiles(
            entries=[
                entry if table == hint.table else replace(entry, table=table)
                for table, described in zip(groups, read, strict=True)
                for entry in described.entries
            ],
            written_at=min((each.written_at for each in read if each.written_at is not None), default=None),
        )

    async def _read_key_files(
        self, hint: _SinkHint, groups: Mapping[str, Sequence[str]], request: PreCommitRequest
    ) -> DescribedKeyFiles:
        """A keyed sink's key files, each checked against its own table's key (as _read_files checks data files);
        none is no trip to the catalog's thread."""
        reads = [
            in_catalog(
                read_key_files,
                self.iceberg,
                table,
                paths,
                request.writer_id,
                request.file_facts,
                request.files_directory,
            )
            for table, paths in groups.items()
        ]
        read = await asyncio.gather(*reads)
        return DescribedKeyFiles(
            entries=[
                entry if table == hint.table else replace(entry, table=table)
                for table, described in zip(groups, read, strict=True)
                for entry in described.entries
            ],
            written_at=min((each.written_at for each in read if each.written_at is not None), default=None),
        )

    async def _gather(
        self,
        sink_id: int,
        writer_count: int,
        request: PreCommitRequest,
        entries: list[DataFileEntry],
        key_files: list[KeyFileEntry],
        deadline: float | None,
    ) -> PreCommitResult:
        """One writer's part of a multi-writer epoch. The parts are kept in the metastore (epoch_parts), so
        writers whose calls reach different replicas still complete the epoch: the part that completes it
        persists the epoch with the others' in the same transaction; every other writer's call answers once
        the epoch is persisted (or its writer is fenced, or its deadline passes: it sends its part again). A part
        claims its paths while it waits (path_claims), so no deletion takes its files meanwhile."""
        part = PreCommitMetadata(
            table="", data_files=tuple(entries), properties=dict(request.properties), key_files=tuple(key_files)
        )
        await failpoints.hit(Failpoint.PRECOMMIT_BEFORE_PERSIST)
        async with self.database.transaction() as session:
            # Exclusive: a sink's parts are stored one at a time, so exactly one call sees the last one arrive.
            sink = await sink_rows.sink_by_name(session, request.sink, lock=RowLock.UPDATE)
            if sink is None:
                raise NotFound(f"sink {request.sink} was deleted during the pre-commit")
            check_term(sink, request.writer_term)
            if request.epoch <= sink.committed_epoch:
                return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=0, record_count=0)
            # Completed by the other writers' parts since this call looked (this writer's part included).
            current = await epoch_reads.epoch_row(session, sink_id, request.epoch)
            repeated = None if current is None else answer_if_repeated(current, request)
            if repeated is not None:
                return repeated
            previous = await part_rows.part_of(session, sink_id, request.epoch, request.writer_id)
            released = sorted(precommit_metadata.decode(previous).paths - part.paths) if previous else []
            paths = sorted(part.paths)
            await _check_files_free(session, sink, request.epoch, paths)
            if not await path_claims.claim_for_part(session, sink_id, request.epoch, paths, released, deadline):
                raise await _unclaimable(session, sink, request.epoch, paths)
            parts = await part_rows.store_part(
                session, sink_id, request.epoch, request.writer_id, request.writer_term, precommit_metadata.encode(part)
            )
            if len(parts) == writer_count:
                decoded = [precommit_metadata.decode(encoded) for encoded in parts]
                combined = [entry for each in decoded for entry in each.data_files]
                combined_keys = [entry for each in decoded for entry in each.key_files]
                if len(frozenset().union(*(each.paths for each in decoded))) != len(combined) + len(combined_keys):
                    raise InvalidArgument(
                        f"sink {request.sink} epoch {request.epoch}: two writers' parts name the same data file; "
                        "each writer must name files of its own. Nothing was persisted"
                    )
                properties = {key: value for each in decoded for key, value in each.properties.items()}
                result = await self._persist_in(session, sink, request, combined, combined_keys, properties, deadline)
                await part_rows.drop_parts(session, sink_id, request.epoch)
                completed = True
            else:
                completed = False
        if completed:
            await failpoints.hit(Failpoint.PRECOMMIT_AFTER_PERSIST)
            return result
        return await self._persisted_by_another_part(request)

    async def _persisted_by_another_part(self, request: PreCommitRequest) -> PreCommitResult:
        """Wait until the epoch this writer sent its part of is persisted (its writer's part in it)."""
        while True:
            async with self.database.transaction() as session:
                sink = await existing_sink(session, request.sink)
                check_term(sink, request.writer_term)
                if request.epoch <= sink.committed_epoch:
                    return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=0, record_count=0)
                row = await epoch_reads.epoch_row(session, sink.id, request.epoch)
                answer = None if row is None else answer_if_repeated(row, request)
            if answer is not None:
                return answer
            # The other writers' parts may reach another replica: there is no event here to wait on.
            await asyncio.sleep(MULTI_WRITER_POLL_SECONDS)

    async def _persist(
        self,
        sink_id: int,
        request: PreCommitRequest,
        entries: list[DataFileEntry],
        key_files: list[KeyFileEntry],
        properties: dict[str, str],
        deadline: float | None,
    ) -> PreCommitResult:
        await failpoints.hit(Failpoint.PRECOMMIT_BEFORE_PERSIST)
        async with self.database.transaction() as session:
            sink = await sink_rows.sink_by_name(session, request.sink, lock=RowLock.SHARE)
            if sink is None:
                raise NotFound(f"sink {request.sink} was deleted during the pre-commit")
            result = await self._persist_in(session, sink, request, entries, key_files, properties, deadline)
        await failpoints.hit(Failpoint.PRECOMMIT_AFTER_PERSIST)
        return result

    async def _persist_in(
        self,
        session: AsyncSession,
        sink: Sink,
        request: PreCommitRequest,
        entries: list[DataFileEntry],
        key_files: list[KeyFileEntry],
        properties: dict[str, str],
        deadline: float | None,
    ) -> PreCommitResult:
        """The epoch's row, in the caller's transaction (which holds the sink's row lock): inserted, or a new
        attempt of an ABORTED one, or the answer to a repeat; its files claimed (path_claims: a path an earlier
        attempt named is taken over unless a deletion marked it, and no deletion can take it afterwards)."""
        sink_id = sink.id
        check_term(sink, request.writer_term)
        if request.epoch <= sink.committed_epoch:
            return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=0, record_count=0)
        metadata = PreCommitMetadata(
            table=sink.table_identifier, data_files=tuple(entries), properties=properties, key_files=tuple(key_files)
        )
        # Under the sink's row lock: an operator may have removed a table since the files were read.
        named = set(metadata.by_table()) | set(metadata.key_files_by_table())
        removed = sorted(named - set(await sink_tables.recorded_epochs(session, sink_id)))
        if removed:
            raise InvalidArgument(
                f"sink {request.sink} epoch {request.epoch}: table {quote(removed[0])} is no longer one of the sink's "
                "(an operator removed it): route no records to it. Nothing was changed"
            )
        row = await epoch_reads.epoch_row(session, sink_id, request.epoch, for_update=True)
        paths = sorted(metadata.paths)
        if row is not None:
            repeated = answer_if_repeated(row, request)
            if repeated is not None:
                return repeated
            if row.status != EpochStatus.ABORTED:
                raise _conflicting_precommit(request)
            if request.epoch <= sink.checkpointed_epoch:
                raise EpochAborted(
                    f"sink {request.sink} epoch {request.epoch} was aborted ({row.reason}) after its "
                    "checkpoint; it cannot be pre-committed again"
                )
        await _check_files_free(session, sink, request.epoch, paths)
        attempt = await epoch_transitions.persist_attempt(session, sink_id, request.epoch, row, metadata)
        if not await path_claims.claim_for_attempt(session, sink_id, request.epoch, attempt, paths, deadline):
            raise await _unclaimable(session, sink, request.epoch, paths)
        return PreCommitResult(PreCommitOutcome.PERSISTED, attempt=attempt, record_count=metadata.record_count)

    async def commit_checkpoint(self, sink: str, epoch: int, writer_term: int, wait: bool) -> CheckpointResult:
        check_sink_name(sink)
        if epoch < 0:
            raise InvalidArgument(f"epoch {epoch} is negative: Spark batch ids start at 0")
        async with self.database.connection(autocommit=True) as connection:
            recorded = await checkpoint_record.record_checkpoint_over_pending(connection, sink, writer_term, epoch)
        if recorded is None:
            async with self.database.transaction() as session:
                recorded = await checkpoint_record.record_checkpoint(session, sink, writer_term, epoch)
        sink_id, numbering = recorded.sink_id, (recorded.incarnation, recorded.generation)
        result = CheckpointResult(recorded.committed_epoch, recorded.checkpointed_epoch)
        await failpoints.hit(Failpoint.CHECKPOINT_AFTER_RECORD)
        log.debug("checkpoint recorded", sink=sink, epoch=epoch, writer_term=writer_term)
        self.committer.wake(sink_id, flush=wait)
        if wait and result.committed_epoch < epoch:
            committed = await self.committer.wait_committed(sink_id, epoch, numbering)
            return CheckpointResult(committed_epoch=committed, checkpointed_epoch=result.checkpointed_epoch)
        return result

    async def sink_state(self, sink: str) -> SinkState:
        check_sink_name(sink)
        async with self.database.transaction() as session:
            row = await existing_sink(session, sink)
            epochs = await epoch_reads.epochs_not_committed(session, row.id)
            tables = await sink_tables.tables_of_sink(session, row.id)
            return from_attributes(
                SinkState,
                row,
                sink=row.name,
                table=row.table_identifier,
                tables=tuple(SinkTable(table.table, table.committed_epoch) for table in tables),
                epochs=tuple(from_attributes(EpochView, epoch) for epoch in epochs),
            )


async def _rebase_after_reset(session: AsyncSession, sink: Sink, checkpoint: int) -> None:
    """The first registration after an operator reset or reconcile: the writer's checkpoint starts a new epoch
    numbering (epoch_numbering.rebase_numbering; see coordinator_service.engine.operations.reset_sink)."""
    previous_committed_epoch = sink.committed_epoch
    dropped = await epoch_numbering.rebase_numbering(session, sink, checkpoint)
    log.warning(
        "sink rebased on the first writer after a reset",
        sink=sink.name,
        generation=sink.generation,
        previous_committed_epoch=previous_committed_epoch,
        checkpointed_epoch=checkpoint,
        log_rows_dropped=dropped,
    )


async def _hint(session: AsyncSession, sink: Sink) -> _SinkHint:
    tables = await sink_tables.tables_of_sink(session, sink.id)
    names = frozenset(table.table for table in tables)
    return _SinkHint(sink.id, sink.table_identifier, names, tuple(sink.key_columns))


def _key_files_by_table(request: PreCommitRequest, sink: _SinkHint) -> dict[str, list[str]]:
    """The pre-commit's key files by table (as _files_by_table); refused for a sink without a key."""
    if request.key_paths and not sink.key_columns:
        raise InvalidArgument(
            f"sink {request.sink} epoch {request.epoch}: the pre-commit names key files, but the sink has no key (an "
            "append stream): key files are for upsert and change streams, registered with their key. Nothing was "
            "changed"
        )
    return _files_by_table(request, sink, request.key_paths) if request.key_paths else {}


def _files_by_table(request: PreCommitRequest, sink: _SinkHint, paths: Sequence[str]) -> dict[str, list[str]]:
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


async def _check_registration(
    session: AsyncSession, sink: Sink, table: str, checkpoint: int, key_columns: Sequence[str]
) -> None:
    """Refuse a writer that does not fit the sink: another table, another key, a checkpoint behind the recorded one,
    or one over epochs never pre-committed or aborted. After a reset, the first writer's checkpoint is adopted."""
    _check_same_table(sink, table)
    _check_same_key(sink, key_columns, table)
    check_not_suspended(sink)
    if sink.rebase_on_register:
        return
    if checkpoint < sink.checkpointed_epoch:
        raise CheckpointBehind(
            f"sink {sink.name}: the writer's checkpoint holds epoch {checkpoint}, but the coordinator "
            f"recorded checkpoint {sink.checkpointed_epoch} (committed {sink.committed_epoch}): the Spark "
            f"checkpoint was lost or rolled back. Nothing was changed. Restore the checkpoint, or reset "
            f"the sink with POST /api/v1/sinks/{sink.name}/reset and start from a new checkpoint"
        )
    between = await epoch_reads.epochs_between(session, sink.id, sink.checkpointed_epoch, checkpoint)
    check_checkpoint_range(sink.name, between, sink.checkpointed_epoch, checkpoint)


async def _check_files_free(session: AsyncSession, sink: Sink, epoch: int, paths: Sequence[str]) -> None:
    """Refuse data files the epoch cannot claim: a file of a COMMITTED epoch is in the table (its rows would be there
    twice), a file of another PENDING or ABORTED epoch or of another epoch's waiting part belongs to it (and its
    cleaner), a given-up file waits for the cleaner, a file a deletion marked is being deleted."""
    holders = await path_claims.holders(session, sink.id, epoch, paths)
    if holders:
        raise _held_elsewhere(sink, epoch, holders)


def _held_elsewhere(sink: Sink, epoch: int, holders: Sequence[path_claims.PathHolder]) -> InvalidArgument:
    described = "; ".join(holder.describe() for holder in holders[:3])
    return InvalidArgument(
        f"sink {sink.name} epoch {epoch}: {len(holders)} data file(s) cannot be its own: {described}. "
        "Every pre-commit must name files of its own; nothing was changed"
    )


async def _unclaimable(session: AsyncSession, sink: Sink, epoch: int, paths: Sequence[str]) -> InvalidArgument:
    """Why a claim failed after the checks passed: something took a path meanwhile, or the deadline passed."""
    holders = await path_claims.holders(session, sink.id, epoch, paths)
    if holders:
        return _held_elsewhere(sink, epoch, holders)
    return InvalidArgument(
        f"sink {sink.name} epoch {epoch}: its oldest data file was written more than ORPHAN_GRACE_SECONDS ago, so "
        "the orphan sweep may be deleting it. Nothing was changed: write the batch again"
    )


def _check_same_table(sink: Sink, table: str) -> None:
    if sink.table_identifier != table:
        raise FailedPrecondition(
            f"sink {sink.name} writes table {sink.table_identifier}, not {quote(table)}: "
            "use another sink name for another table"
        )


def _check_same_key(sink: Sink, key_columns: Sequence[str], table: str) -> None:
    """A sink's key is fixed when it is created: a writer (or a table it ensures) naming another key, or none for a
    keyed sink, would have its epochs committed the wrong way (rows appended as new ones, or resolved by other
    columns)."""
    if list(key_columns) == list(sink.key_columns):
        return
    has = f"is keyed by {quote(', '.join(sink.key_columns))}" if sink.key_columns else "has no key (an append stream)"
    names = f"names the key {quote(', '.join(key_columns))}" if key_columns else "names no key (an append stream)"
    raise FailedPrecondition(
        f"sink {sink.name} {has}, but its writer {names} for table {quote(table)}: a sink's key is fixed when it is "
        "created. Write with the sink's key, or use another sink (and table) for another key. Nothing was changed"
    )


def _check_precommit_request(request: PreCommitRequest) -> None:
    check_sink_name(request.sink)
    if request.epoch < 0:
        raise InvalidArgument(f"epoch {request.epoch} is negative: Spark batch ids start at 0")
    if request.writer_term < 1:
        raise InvalidArgument(f"writer_term {request.writer_term} is not a term RegisterWriter returns (>= 1)")
    if request.writer_id < 0:
        raise InvalidArgument(f"writer_id {request.writer_id} is negative")
    if len(request.all_paths) > MAX_FILES_PER_PRECOMMIT:
        raise InvalidArgument(
            f"{len(request.all_paths)} data and key files in one pre-commit exceed {MAX_FILES_PER_PRECOMMIT}: write "
            "larger files"
        )
    if sum(len(k) + len(v) for k, v in request.properties.items()) > MAX_PROPERTIES_BYTES:
        raise InvalidArgument(f"pre-commit properties exceed {MAX_PROPERTIES_BYTES} bytes")
    try:
        check_positions(request.properties)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None
    for path, facts in request.file_facts.items():
        check_facts(path, facts)


def answer_if_repeated(row: EpochRecord, request: PreCommitRequest) -> PreCommitResult | None:
    """The answer to a pre-commit that repeats a persisted one, or None if it is not a repeat."""
    if row.status == EpochStatus.COMMITTED:
        return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=row.attempt, record_count=0)
    if row.status == EpochStatus.ABORTED:
        return None
    recorded = precommit_metadata.decode(row.metadata_)
    if recorded.paths_of_writer(request.writer_id) == frozenset(request.all_paths):
        return PreCommitResult(PreCommitOutcome.PERSISTED, attempt=row.attempt, record_count=row.record_count)
    raise _conflicting_precommit(request)


def _conflicting_precommit(request: PreCommitRequest) -> FailedPrecondition:
    return FailedPrecondition(
        f"sink {request.sink} epoch {request.epoch} is already pre-committed with other data files by "
        f"writer {request.writer_id} in term {request.writer_term}; an epoch's files cannot change within a term"
    )
