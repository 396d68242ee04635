"""A sink verified: its committed epochs from the log, its tables' snapshots and live rows, and with Kafka access its
topics' offsets; whole, or from where each table was verified last (`since`: only the newer snapshots' files are read,
and a keyed table's keys, which any new row may repeat, in full)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import structlog

from coordinator_service.contract.errors import NotFound, quote
from coordinator_service.contract.markers import MARKER_EPOCH, SinkIdentity
from coordinator_service.contract.table_identifiers import sink_name_problem
from coordinator_service.contract.views import EpochStatus
from coordinator_service.engine.settlement import identity_of
from coordinator_service.engine.verification.findings import Offsets, TableVerification, Verification
from coordinator_service.engine.verification.positions import (
    check_keys,
    check_missing,
    check_positions,
    sorted_offsets,
)
from coordinator_service.engine.verification.ranges import (
    REWRITE,
    EpochFacts,
    RangeWalk,
    check_ranges,
    check_snapshots,
    newest_end_offsets,
)
from coordinator_service.engine.verification.topic_offsets import KafkaAccess, read_offsets
from coordinator_service.log import epoch_reads, sink_rows, sink_tables
from coordinator_service.log.database import Database
from coordinator_service.log.models import AbortCause
from coordinator_service.log.precommit_metadata import decode
from coordinator_service.tables import table_audit
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import LoadedTable, TableFormat
from coordinator_service.tables.table_audit import POSITION_COLUMNS, ReadCount, SnapshotFacts

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class VerifiedTable:
    """Where a table was verified last: its newest snapshot then, the sink's newest epoch it held, and the sink's
    end offsets then."""

    snapshot_id: int | None
    verified_epoch: int
    end_offsets: Offsets = field(default_factory=dict)


@dataclass
class _Sink:
    identity: SinkIdentity
    tables: list[str]
    epochs: list[EpochFacts]
    # The committed epoch the log said: the tables are verified as of their newest snapshot at or below it (a commit
    # appends before the log says COMMITTED, and may land between the two reads).
    committed: int
    # Whether it is an upsert or change stream's (its epochs' rows are at most their records).
    keyed: bool = False


class Verifier:
    def __init__(self, database: Database, iceberg: TableFormat) -> None:
        self.database = database
        self.iceberg = iceberg

    async def verify(
        self, name: str, kafka: KafkaAccess | None = None, since: Mapping[str, VerifiedTable] | None = None
    ) -> Verification:
        problem = sink_name_problem(name)
        if problem is not None:
            raise NotFound(f"no sink {quote(name)}: {problem}")
        since = since or {}
        sink = await self._read_sink(name, since)
        own = sink.tables[0]
        verification = Verification(sink=name, incremental=bool(since))
        # Nothing recorded (an epoch without end offsets stopped the walk): where it stood is unknown.
        begin = (since[own].end_offsets or None) if own in since else None
        results = [await in_catalog(self._table_facts, sink, table, since.get(table)) for table in sink.tables]
        own_table, own_snapshots, _ = results[0]
        walk = check_ranges(
            own_table, sink.epochs, begin, newest_end_offsets(own_snapshots, sink.identity), keyed=sink.keyed
        )
        low = walk.ranges[0][1] if walk.ranges else begin
        positions: list[pa.Table] = []
        for (table, snapshots, loaded), identifier in zip(results, sink.tables, strict=True):
            check_snapshots(table, snapshots, sink.identity, sink.epochs)
            if sink.epochs:  # committed: the table holds them, those without files in it trivially
                table.verified_epoch = max(table.verified_epoch, sink.epochs[-1].epoch)
            rows = await in_catalog(self._deep, table, loaded, snapshots, walk, low, identifier in since)
            if rows is not None:
                positions.append(rows)
            verification.tables.append(table)
        if kafka is not None and sink.keyed and positions:
            # A live row holds its key's last record: the records it replaced, and deletes, are in none by design.
            own_table.notes.append(
                "no check against Kafka: an upsert or change stream's live rows carry each key's last record only"
            )
        elif kafka is not None and walk.end is not None and low is not None and positions:
            ranges = {tp: (low.get(tp, 0), end) for tp, end in walk.end.items()}
            held = await in_catalog(read_offsets, kafka, ranges)
            plain = [table_audit.plain_strings(rows) for rows in positions]
            union = pa.concat_tables(plain, promote_options="permissive")
            bad = {epoch.epoch: epoch.bad_records for epoch in sink.epochs}
            check_missing(own_table, sorted_offsets(own_table, union), walk, held, bad)
            own_table.kafka = True
        verification.end_offsets = walk.end or {}
        log.info(
            "sink verified",
            sink=name,
            incremental=verification.incremental,
            faults=len(verification.faults),
            verified_epoch=verification.verified_epoch,
        )
        return verification

    async def _read_sink(self, name: str, since: Mapping[str, VerifiedTable]) -> _Sink:
        async with self.database.transaction() as session:
            row = await sink_rows.sink_by_name(session, name)
            if row is None:
                raise NotFound(f"no sink {quote(name)}")
            tables = [table.identifier for table in await sink_tables.tables_of_sink(session, row.id)]
            if not tables:
                tables = [row.table_identifier]
            above = since[tables[0]].verified_epoch if tables[0] in since else -1
            records = await epoch_reads.epochs_between(session, row.id, above, row.committed_epoch)
            identity = identity_of(row)
        epochs = []
        for record in records:
            # At or below the committed epoch: COMMITTED, or aborted by an operator for good.
            aborted = record.status is EpochStatus.ABORTED and record.abort_cause is AbortCause.OPERATOR
            if record.status is not EpochStatus.COMMITTED and not aborted:
                continue
            metadata = decode(record.metadata_)
            files = {
                table: [(entry.path, entry.record_count) for entry in entries]
                for table, entries in metadata.by_table().items()
            }
            epochs.append(EpochFacts.of(record.epoch, metadata.properties, files, record.snapshot_id, aborted))
        return _Sink(identity, tables, epochs, row.committed_epoch, keyed=bool(row.key_columns))

    def _table_facts(
        self, sink: _Sink, identifier: str, since: VerifiedTable | None
    ) -> tuple[TableVerification, list[SnapshotFacts], LoadedTable]:
        table = TableVerification(identifier)
        loaded = self.iceberg.load(identifier)
        count = ReadCount()
        after = None if since is None else since.snapshot_id
        snapshots = table_audit.snapshots_after(loaded, after, count)
        if snapshots is None:
            table.notes.append(f"snapshot {after} verified last is no longer in the table's history: all read again")
            after, snapshots = None, table_audit.snapshots_after(loaded, None, count) or []
        elif since is not None:
            table.verified_epoch = since.verified_epoch
        newer = next(
            (
                index
                for index, snapshot in enumerate(snapshots)
                if sink.identity.owns(snapshot.summary) and int(snapshot.summary[MARKER_EPOCH]) > sink.committed
            ),
            len(snapshots),
        )
        snapshots = snapshots[:newer]
        table.snapshot_id = snapshots[-1].snapshot_id if snapshots else after
        table.manifests_read = count.manifests
        return table, snapshots, loaded

    def _deep(
        self,
        table: TableVerification,
        loaded: LoadedTable,
        snapshots: list[SnapshotFacts],
        walk: RangeWalk,
        low: Offsets | None,
        incremental: bool,
    ) -> pa.Table | None:
        """The deep check of one table; its live rows' positions (None: it has no position columns)."""
        count = ReadCount()
        key = table_audit.identifier_columns(loaded)
        positioned = set(POSITION_COLUMNS) <= table_audit.column_names(loaded)
        if table.snapshot_id is None:
            # Nothing as of the committed epoch: no row, so none twice or outside the range; deep where the table's
            # columns would let a row be checked.
            table.deep = bool(key) or positioned
            return None
        if key:
            check_keys(table, table_audit.live_columns(loaded, key, count, table.snapshot_id), key)
            table.deep = True
        rows = None
        if positioned:
            # Incrementally, the rows the new snapshots appended, read without planning a scan of the whole table.
            rows = table_audit.appended_columns(loaded, snapshots, POSITION_COLUMNS, count) if incremental else None
            if rows is None:
                files = None
                if incremental:
                    files = {
                        path
                        for snapshot in snapshots
                        if snapshot.operation != REWRITE
                        for path, _ in snapshot.added_files
                    }
                rows = table_audit.live_columns(loaded, POSITION_COLUMNS, count, table.snapshot_id, files)
            check_positions(table, sorted_offsets(table, rows), walk, low)
            table.deep = True
        elif not key:
            table.notes.append(
                "no deep check: the table has neither the Kafka position columns (the writer's --kafka-metadata) "
                "nor a key"
            )
        table.rows_read += count.rows
        table.files_read += count.data_files
        return rows
