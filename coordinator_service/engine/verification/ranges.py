"""The shallow check, from the log and the tables' snapshots: the committed epochs' offset ranges follow one another
without overlap or gap and end where the newest snapshot says, each epoch's files hold no more rows than its range
has offsets, and every snapshot that changed a table's rows is one of the sink's epochs (or maintenance's rewrite).

An epoch's range is [start, end) per topic-partition: its end from its `kafka.end-offsets` property
(contract/source_positions.py), its start its own declared `$start` (the Spark writer's batch 0, inside
`spark.end_offsets`) or the previous epoch's end. Offsets a topic does not hold (compaction, transaction markers)
are inside ranges and in no row: the shallow check is about ranges, the deep check with Kafka about records."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from coordinator_service.contract.markers import FENCE_SINK, MARKER_EPOCH, MARKER_SINK, SinkIdentity
from coordinator_service.contract.source_positions import END_OFFSETS, SNAPSHOT_END_OFFSETS
from coordinator_service.engine.verification.findings import (
    FaultKind,
    Offsets,
    TableVerification,
    describe_offsets,
    first,
)
from coordinator_service.tables.table_audit import SnapshotFacts

SPARK_END_OFFSETS = "spark.end_offsets"
START_KEY = "$start"
# The Spark writer's count of a batch's records that did not fit the schema, what its policy made of them, and the
# Kafka records the batch read (spark_writer/sink/kafka_records.py).
BAD_RECORDS = "sink-coordinator.bad-records"
ON_BAD_RECORD = "sink-coordinator.on-bad-record"
RECORDS_READ = "sink-coordinator.records-read"
# The policy that sends a record that does not fit to the dead-letter topic instead of a row.
DEAD_LETTER = "dead-letter"
# Maintenance's rewrite of files (compaction): the same rows in other files.
REWRITE = "replace"


@dataclass(frozen=True)
class EpochFacts:
    """A committed epoch as the log holds it: where it read, and what its files hold in each table."""

    epoch: int
    start: Offsets | None  # its own declared start (None: where the previous one ended)
    end: Offsets | None  # None: its writer did not say
    rows: Mapping[str, int]  # records of its data files, by table
    paths: Mapping[str, frozenset[str]]  # its data files, by table
    snapshot_id: int | None
    bad_records: int = 0
    # An operator aborted it (with force, its batch checkpointed): its records are lost by design, and the next
    # epoch starts where it ended.
    aborted: bool = False
    # The Kafka records its writer read (None: the writer did not say), and how many of them became no row (sent to
    # the dead-letter topic).
    records_read: int | None = None
    dead_lettered: int = 0

    @classmethod
    def of(
        cls,
        epoch: int,
        properties: Mapping[str, str],
        files: Mapping[str, Sequence[tuple[str, int]]],
        snapshot_id: int | None,
        aborted: bool = False,
    ) -> EpochFacts:
        bad = properties.get(BAD_RECORDS, "0")
        bad_records = int(bad) if bad.isdigit() else 0
        read = properties.get(RECORDS_READ, "")
        return cls(
            epoch=epoch,
            start=declared_start(properties),
            end=parse_offsets(properties[END_OFFSETS]) if END_OFFSETS in properties else None,
            rows={table: sum(records for _, records in entries) for table, entries in files.items()},
            paths={table: frozenset(path for path, _ in entries) for table, entries in files.items()},
            snapshot_id=snapshot_id,
            bad_records=bad_records,
            aborted=aborted,
            records_read=int(read) if read.isdigit() else None,
            dead_lettered=bad_records if properties.get(ON_BAD_RECORD) == DEAD_LETTER else 0,
        )


def parse_offsets(raw: str) -> Offsets:
    """`{"topic": {"partition": offset}}` (checked at pre-commit by source_positions.check_positions)."""
    return {
        (str(topic), int(partition)): int(offset)
        for topic, partitions in json.loads(raw).items()
        if not str(topic).startswith("$")
        for partition, offset in partitions.items()
    }


def declared_start(properties: Mapping[str, str]) -> Offsets | None:
    """The start a batch declares (the Spark writer's batch 0 keeps its resolved start under `$start`)."""
    raw = properties.get(SPARK_END_OFFSETS)
    if raw is None:
        return None
    try:
        sources = json.loads(raw)
    except ValueError:
        return None
    starts = [source[START_KEY] for source in sources if isinstance(source, dict) and START_KEY in source]
    if not starts:
        return None
    return {tp: offset for start in starts for tp, offset in parse_offsets(json.dumps(start)).items()}


@dataclass
class RangeWalk:
    """The committed epochs' ranges walked in order: where the previous one ended, and each epoch's range (to name
    the epoch of an offset the deep check finds at fault)."""

    end: Offsets | None
    ranges: list[tuple[int, Offsets, Offsets]]
    # The ranges of epochs an operator aborted: in no table by design.
    lost: list[tuple[int, Offsets, Offsets]] = field(default_factory=list)

    def epoch_of(self, topic: str, partition: int, offset: int) -> int | None:
        return _epoch_in(self.ranges, topic, partition, offset)

    def lost_by_abort(self, topic: str, partition: int, offset: int) -> bool:
        return _epoch_in(self.lost, topic, partition, offset) is not None


def _epoch_in(ranges: Sequence[tuple[int, Offsets, Offsets]], topic: str, partition: int, offset: int) -> int | None:
    for epoch, start, end in ranges:
        if start.get((topic, partition), 0) <= offset < end.get((topic, partition), -1):
            return epoch
    return None


def check_ranges(
    sink_table: TableVerification,
    epochs: Sequence[EpochFacts],
    begin: Offsets | None,
    newest_end: tuple[int, Offsets] | None,
    keyed: bool = False,
) -> RangeWalk:
    """Check the epochs' ranges (ascending epochs, all committed) from `begin` (where verification starts: the
    sink's declared start, or where it was verified last) against the newest snapshot's (epoch, end offsets), and
    each epoch's rows against the records its writer read (`keyed`: a row per key it left, so at most as many); the
    sink's own table carries the faults."""
    walk = RangeWalk(begin, [])
    ends: dict[int, Offsets] = {}
    unsaid = [epoch.epoch for epoch in epochs if epoch.end is None]
    if unsaid:
        sink_table.notes.append(
            f"epochs without end offsets (their writer did not say where they ended): {first([str(e) for e in unsaid])}"
        )
    for epoch in epochs:
        if not epoch.aborted:
            _check_rows_read(sink_table, epoch, keyed)
        if epoch.end is None:
            walk.end = None  # the next epoch's start is unknown unless it declares it
            continue
        previous = walk.end
        start = epoch.start if epoch.start is not None else previous
        if start is None:
            sink_table.notes.append(f"epoch {epoch.epoch}'s start is unknown (the epochs before it are not in the log)")
        elif epoch.start is not None and previous is not None:
            _check_follows(sink_table, epoch.epoch, previous, epoch.start)
        start = {**(previous or {}), **(start or {})}
        if epoch.aborted:
            sink_table.notes.append(
                f"epoch {epoch.epoch} was aborted by an operator: its range {describe_offsets(start)} to "
                f"{describe_offsets(epoch.end)} is in no table (lost by design)"
            )
            walk.lost.append((epoch.epoch, start, epoch.end))
            walk.end = ends[epoch.epoch] = {**start, **epoch.end}
            continue
        backwards = {tp: offset for tp, offset in epoch.end.items() if offset < start.get(tp, 0)}
        if backwards:
            sink_table.fault(
                FaultKind.OVERLAP,
                epoch.epoch,
                f"its range ends before it starts (read again): ends at {describe_offsets(backwards)}, starts at "
                f"{describe_offsets({tp: start.get(tp, 0) for tp in backwards})}",
            )
        if start is not None and not backwards:
            offsets = sum(offset - start.get(tp, 0) for tp, offset in epoch.end.items())
            rows = sum(epoch.rows.values())
            if rows > offsets:
                sink_table.fault(
                    FaultKind.TOO_MANY_ROWS,
                    epoch.epoch,
                    f"its files hold {rows} rows, its range {describe_offsets(start)} to "
                    f"{describe_offsets(epoch.end)} has {offsets} offsets",
                )
            elif rows < offsets - epoch.bad_records:
                sink_table.notes.append(
                    f"epoch {epoch.epoch}: {offsets - rows} offsets of its range in no row (compaction, transaction "
                    f"markers or records that did not fit; the deep check with Kafka tells them from losses)"
                )
        walk.ranges.append((epoch.epoch, start, epoch.end))
        walk.end = {**start, **epoch.end}
        ends[epoch.epoch] = walk.end
    # The newest snapshot marks the newest epoch with files in the table: epochs after it may have had none.
    if newest_end is not None and newest_end[0] in ends:
        marked, snapshot_end = newest_end
        differing = {tp: offset for tp, offset in snapshot_end.items() if ends[marked].get(tp) != offset}
        if differing:
            sink_table.fault(
                FaultKind.END_MISMATCH,
                marked,
                f"the newest snapshot ends at {describe_offsets(differing)}, its epoch at "
                f"{describe_offsets({tp: ends[marked].get(tp, 0) for tp in differing})}",
            )
    return walk


def _check_follows(sink_table: TableVerification, epoch: int, previous: Offsets, start: Offsets) -> None:
    for tp in sorted(set(previous) | set(start)):
        before, now = previous.get(tp, 0), start.get(tp, 0)
        topic, partition = tp
        if now < before:
            sink_table.fault(
                FaultKind.OVERLAP,
                epoch,
                f"starts at {topic}-{partition}@{now}, the previous epoch ended at {before}: offsets {now} to "
                f"{before - 1} read twice",
            )
        elif now > before:
            sink_table.fault(
                FaultKind.GAP,
                epoch,
                f"starts at {topic}-{partition}@{now}, the previous epoch ended at {before}: offsets {before} to "
                f"{now - 1} never read",
            )


def _check_rows_read(sink_table: TableVerification, epoch: EpochFacts, keyed: bool) -> None:
    """The rows of the epoch's files (in every table) are the records its writer read, less those it sent to the
    dead-letter topic; for a keyed sink at most as many (the last version of each key it touched, none for a
    delete)."""
    if epoch.records_read is None:
        return
    rows = sum(epoch.rows.values())
    expected = epoch.records_read - epoch.dead_lettered
    if rows > expected or (rows < expected and not keyed):
        dead_lettered = f", {epoch.dead_lettered} of them sent to the dead-letter topic" if epoch.dead_lettered else ""
        sink_table.fault(
            FaultKind.ROWS_NOT_READ,
            epoch.epoch,
            f"its files hold {rows} rows, its writer read {epoch.records_read} records{dead_lettered}: "
            f"{'at most ' if keyed else ''}{expected} rows expected",
        )


def newest_end_offsets(snapshots: Sequence[SnapshotFacts], sink: SinkIdentity) -> tuple[int, Offsets] | None:
    """The newest of the sink's snapshots' epoch and the end offsets it carries."""
    for snapshot in reversed(snapshots):
        if sink.owns(snapshot.summary) and SNAPSHOT_END_OFFSETS in snapshot.summary:
            return int(snapshot.summary[MARKER_EPOCH]), parse_offsets(snapshot.summary[SNAPSHOT_END_OFFSETS])
    return None


def check_snapshots(
    table: TableVerification, snapshots: Sequence[SnapshotFacts], sink: SinkIdentity, epochs: Sequence[EpochFacts]
) -> None:
    """Each snapshot that changed the table's rows: the sink's own adds exactly its epochs' files, maintenance's
    rewrite keeps the rows, and no other changed them (another sink's, by name, is noted)."""
    by_snapshot: dict[int, list[EpochFacts]] = {}
    for epoch in epochs:
        if epoch.snapshot_id is not None:
            by_snapshot.setdefault(epoch.snapshot_id, []).append(epoch)
    for snapshot in snapshots:
        summary = snapshot.summary
        added, deleted = snapshot.added_records, int(summary.get("deleted-records", "0") or 0)
        owned = sink.owns(summary)
        if owned:
            table.verified_epoch = max(table.verified_epoch, int(summary[MARKER_EPOCH]))
            covered = by_snapshot.get(snapshot.snapshot_id)
            if covered is None:
                continue  # its epochs are pruned from the log: their files are not known any more
            expected = frozenset().union(*(epoch.paths.get(table.table, frozenset()) for epoch in covered))
            paths = {path for path, _ in snapshot.added_files}
            if paths != expected:
                table.fault(
                    FaultKind.SNAPSHOT_ROWS,
                    covered[-1].epoch,
                    f"snapshot {snapshot.snapshot_id} added {len(paths)} files, its epochs hold {len(expected)}: "
                    f"{first(sorted(paths ^ expected))}",
                )
        elif snapshot.operation == REWRITE and snapshot.deleted_rows_removed is None:
            table.notes.append(
                f"snapshot {snapshot.snapshot_id} ({snapshot.operation}) applied position deletes that went with "
                "the snapshots expiry removed: how many rows it left out is not known"
            )
        elif _keeps_rows(snapshot, summary, added, deleted):
            continue
        elif MARKER_SINK in summary:
            table.notes.append(
                f"snapshot {snapshot.snapshot_id} is another sink's, or an earlier incarnation or generation's "
                f"({summary[MARKER_SINK]!r})"
            )
        else:
            table.fault(
                FaultKind.FOREIGN_CHANGE,
                None,
                f"snapshot {snapshot.snapshot_id} ({snapshot.operation}) was not written by the coordinator and "
                f"added {len(snapshot.added_files)} files ({added} rows), deleted {deleted} rows: "
                f"{first(sorted(path for path, _ in snapshot.added_files))}",
            )


def _keeps_rows(snapshot: SnapshotFacts, summary: Mapping[str, str], added: int, deleted: int) -> bool:
    """A rewrite of the same live rows (compaction, which leaves out the rows position deletes deleted), a fence, or a
    change of no row."""
    return (
        (snapshot.operation == REWRITE and added == deleted - (snapshot.deleted_rows_removed or 0))
        or FENCE_SINK in summary
        or not (added or deleted)
    )
