"""What the tables already hold, settled in the log.

The snapshot markers are each table's own record of which epochs of a sink it
holds; the log's sink_tables record, per table, the newest epoch it holds as
far as the log knows. Every path that decides an epoch's fate against the
tables (the committer before it appends, RegisterWriter, an operator's abort
or reset, the cleaner) reads the markers of every table the epochs have files
in, on a fresh load, while it holds the sink's commit lock, and marks what the
tables hold COMMITTED before it aborts or deletes anything else. An epoch some
of its tables hold and others not yet (fan-out, between two tables' appends)
is neither: only the committer settles it, by appending to the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from coordinator_service.contract.markers import Marker, SinkIdentity
from coordinator_service.log import precommit_metadata
from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import TableFormat

log = structlog.get_logger(__name__)


def identity_of(sink: Sink) -> SinkIdentity:
    return SinkIdentity(
        name=sink.name,
        incarnation=str(sink.incarnation),
        generation=sink.generation,
        legacy_markers=sink.legacy_markers,
    )


def covering_snapshots(epochs: Iterable[int], markers: Sequence[Marker]) -> dict[int, int]:
    """The epochs a marker covers, each with the snapshot that added it: the oldest marker at or above it.

    Valid for PENDING epochs, per table: the committer appends checkpointed epochs in order, all of a table's
    files of them at once up to a marker, and a PENDING epoch is never below a marker it is not in (a re-attempt
    is always above the checkpoint, so above every marker).
    """
    covered: dict[int, int] = {}
    for epoch in sorted(epochs):
        covering = next((marker for marker in markers if marker.epoch >= epoch), None)
        if covering is None:
            break
        covered[epoch] = covering.snapshot_id
    return covered


@dataclass(frozen=True)
class Holdings:
    """What the sink's tables hold of some PENDING epochs."""

    # The epochs every table with files of them holds, by the snapshot of the sink's own table that holds each
    # (None: the epoch has no file there, or the log's record of the table says it holds it).
    held: dict[int | None, list[int]]
    # Epochs some of their tables hold and others not yet (a commit pass between two tables' appends, or a table
    # whose catalog fails): the tables that do not hold them yet. Only the committer may settle these, by
    # appending to the rest.
    partial: dict[int, list[str]]

    @property
    def epochs(self) -> list[int]:
        return sorted(epoch for epochs in self.held.values() for epoch in epochs)

    def touched(self) -> list[int]:
        """The epochs any table holds."""
        return sorted([*self.epochs, *self.partial])


async def holdings(
    tables: TableFormat, sink: Sink, recorded: Mapping[str, int], rows: Sequence[EpochRecord]
) -> Holdings:
    """Which of these PENDING epochs the sink's tables hold, each table walked on a fresh load (the caller holds
    the commit lock). A table holds an epoch when the log records it (`recorded`: the newest epoch each table
    holds) or one of its markers covers it. An epoch with files is held when every table with files of it holds
    it; an epoch without files when any table holds it (it was in an appended group: empty epochs are never
    appended, but marked with their group)."""
    if not rows:
        return Holdings({}, {})
    identity = identity_of(sink)
    files = {row.epoch: precommit_metadata.decode(row.metadata_).tables_with_files() for row in rows}
    walked: dict[str, dict[int, int]] = {}
    for table in sorted({table for each in files.values() for table in each} or {sink.table_identifier}):
        above = [
            epoch for epoch, each in files.items() if (table in each or not each) and epoch > recorded.get(table, -1)
        ]
        markers = await in_catalog(tables.sink_markers, table, identity, min(above)) if above else []
        walked[table] = covering_snapshots(above, markers)
    held: dict[int | None, list[int]] = {}
    partial: dict[int, list[str]] = {}
    for epoch, each in sorted(files.items()):
        holding = {table for table in walked if epoch <= recorded.get(table, -1) or epoch in walked[table]}
        if each and each <= holding:
            snapshot = walked[sink.table_identifier].get(epoch) if sink.table_identifier in each else None
            held.setdefault(snapshot, []).append(epoch)
        elif each and holding & each:
            partial[epoch] = sorted(each - holding)
        elif not each and holding:
            held.setdefault(None, []).append(epoch)
    return Holdings(held, partial)
