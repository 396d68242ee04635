"""The pre-commit: a writer's files of an epoch checked against their tables and persisted PENDING in the log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import failpoints, metrics
from coordinator_service.contract.errors import CoordinatorError, EpochAborted, InvalidArgument, NotFound, quote
from coordinator_service.contract.views import EpochStatus, PreCommitOutcome, PreCommitResult
from coordinator_service.engine.protocol_base import ProtocolBase, SinkHint, files_by_table, hint_of, key_files_by_table
from coordinator_service.engine.writer_requests import (
    PreCommitRequest,
    answer_if_repeated,
    check_precommit_request,
    conflicting_precommit,
)
from coordinator_service.failpoints import Failpoint
from coordinator_service.log import (
    epoch_reads,
    epoch_transitions,
    part_rows,
    path_claims,
    precommit_metadata,
    sink_rows,
    sink_tables,
)
from coordinator_service.log.epoch_rules import check_term, existing_sink
from coordinator_service.log.models import Sink
from coordinator_service.log.precommit_metadata import DataFileEntry, KeyFileEntry, PreCommitMetadata
from coordinator_service.log.sink_rows import RowLock
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.file_descriptions import DescribedFiles
from coordinator_service.tables.file_paths import canonical_uri, check_inside_location
from coordinator_service.tables.key_files import DescribedKeyFiles

log = structlog.get_logger(__name__)


# How often a multi-writer epoch's part looks whether another writer's part completed the epoch.
MULTI_WRITER_POLL_SECONDS = 0.05


class PreCommits(ProtocolBase):
    """PreCommit: an epoch's files described against their tables and persisted PENDING, by the fast path (one
    statement for a first attempt) or the general one (every case, in its order of checks), one writer's or the parts
    of a multi-writer epoch."""

    async def pre_commit(self, request: PreCommitRequest) -> PreCommitResult:
        started = time.monotonic()
        check_precommit_request(request)
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
            hint = self._sink_hints[sink.name] = await hint_of(session, sink)
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
        groups = files_by_table(request, hint, request.paths)
        key_groups = key_files_by_table(request, hint)
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
            files = await self._read_files(hint, files_by_table(request, hint, request.paths), request, False)
            key_files = await self._read_key_files(hint, key_files_by_table(request, hint), request)
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
        attempt = await self._group_insert.submit(row)
        if attempt is None:
            return None
        await failpoints.hit(Failpoint.PRECOMMIT_AFTER_PERSIST)
        return PreCommitResult(PreCommitOutcome.PERSISTED, attempt=attempt, record_count=metadata.record_count)

    def _claim_deadline(self, files: DescribedFiles, key_files: DescribedKeyFiles) -> float | None:
        """Until when the pre-commit may claim its files' paths: ORPHAN_GRACE_SECONDS after the oldest was written,
        when the orphan sweep may delete it (path_claims)."""
        written = [each.written_at for each in (files, key_files) if each.written_at is not None]
        if not written:
            return None
        return min(written) + self.committer.settings.orphan_grace_seconds

    async def _read_files(
        self, hint: SinkHint, groups: Mapping[str, Sequence[str]], request: PreCommitRequest, evolve_schema: bool
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
        return await _per_table(hint, groups, reads, DescribedFiles)

    async def _read_key_files(
        self, hint: SinkHint, groups: Mapping[str, Sequence[str]], request: PreCommitRequest
    ) -> DescribedKeyFiles:
        """A keyed sink's key files, each checked against its own table's key (as _read_files checks data files);
        none is no trip to the catalog's thread."""
        reads = [
            in_catalog(
                self.iceberg.read_key_files,
                table,
                paths,
                request.writer_id,
                request.file_facts,
                request.files_directory,
            )
            for table, paths in groups.items()
        ]
        return await _per_table(hint, groups, reads, DescribedKeyFiles)

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
                raise conflicting_precommit(request)
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


Described = TypeVar("Described", DescribedFiles, DescribedKeyFiles)


async def _per_table(
    hint: SinkHint, groups: Mapping[str, Sequence[str]], reads: Sequence[Awaitable[Described]], make: type[Described]
) -> Described:
    """The descriptions of the pre-commit's files read per table (concurrently, in the order of `groups`) as one:
    each entry naming its table unless it is the sink's own, and when the oldest file was written."""
    read = await asyncio.gather(*reads)
    return make(
        entries=[
            entry if table == hint.table else replace(entry, table=table)
            for table, described in zip(groups, read, strict=True)
            for entry in described.entries
        ],
        written_at=min((each.written_at for each in read if each.written_at is not None), default=None),
    )
