"""The deep check, over the live rows' columns (read by tables/table_audit.py): no Kafka position twice, none outside
the committed range, no key twice in a keyed table, and, with the topic's offsets, none of them missing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from coordinator_service.engine.verification.findings import FaultKind, Offsets, TableVerification, first
from coordinator_service.engine.verification.ranges import RangeWalk
from coordinator_service.engine.verification.topic_offsets import TopicOffsets

SHOWN = 5


def check_positions(table: TableVerification, rows: pa.Table, walk: RangeWalk, low: Offsets | None) -> None:
    """`rows`: kafka_topic, kafka_partition, kafka_offset of the live rows checked; `low`, `walk.end`: the range they
    must lie in (None: not known, unchecked)."""
    duplicates = (
        rows.group_by(["kafka_topic", "kafka_partition", "kafka_offset"], use_threads=True)
        .aggregate([("kafka_offset", "count")])
        .filter(pc.field("kafka_offset_count") > 1)
        .sort_by([("kafka_topic", "ascending"), ("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
    )
    for row in duplicates.slice(0, SHOWN).to_pylist():
        topic, partition, offset = row["kafka_topic"], row["kafka_partition"], row["kafka_offset"]
        table.fault(
            FaultKind.DUPLICATE_POSITION,
            walk.epoch_of(topic, partition, offset),
            f"{topic}-{partition}@{offset} is in {row['kafka_offset_count']} live rows"
            + (f" (+{duplicates.num_rows - SHOWN} more positions)" if duplicates.num_rows > SHOWN else ""),
        )
    if walk.end is None or low is None:
        return
    outside: list[str] = []
    for (topic, partition), part in _by_partition(rows).items():
        floor, ceiling = low.get((topic, partition), 0), walk.end.get((topic, partition), 0)
        offsets = part.column("kafka_offset")
        wrong = part.filter(pc.or_(pc.less(offsets, floor), pc.greater_equal(offsets, ceiling)))
        outside.extend(f"{topic}-{partition}@{offset}" for offset in sorted(wrong.column("kafka_offset").to_pylist()))
    if outside:
        table.fault(
            FaultKind.OUTSIDE_RANGE, None, f"live rows from offsets outside the committed range: {first(outside)}"
        )


def check_keys(table: TableVerification, rows: pa.Table, key: Sequence[str]) -> None:
    """`rows`: the key columns of a keyed table's live rows."""
    counted = rows.group_by(list(key), use_threads=True).aggregate([([], "count_all")])
    twice = counted.filter(pc.field("count_all") > 1)
    if twice.num_rows:
        keys = [str({name: row[name] for name in key}) for row in twice.slice(0, SHOWN).to_pylist()]
        table.fault(FaultKind.DUPLICATE_KEY, None, f"{twice.num_rows} keys in more than one live row: {first(keys)}")


def check_missing(
    table: TableVerification,
    rows: pa.Table,
    walk: RangeWalk,
    topic: Mapping[str, TopicOffsets],
    bad_records: Mapping[int, int],
) -> None:
    """Every offset the topics still hold in the committed range is in a live row (`topic`: by "topic-partition"),
    but as many of an epoch's as its writer counted records that did not fit (sent to a dead-letter topic)."""
    present = _by_partition(rows)
    missing: dict[int | None, list[str]] = {}
    for name, held in sorted(topic.items()):
        in_table = present.get((held.topic, held.partition))
        seen = set() if in_table is None else set(in_table.column("kafka_offset").to_pylist())
        if held.before_log_start:
            table.notes.append(f"{name}: {held.before_log_start} offsets of the range are before the log start (gone)")
        for offset in sorted(set(held.offsets) - seen):
            missing.setdefault(walk.epoch_of(held.topic, held.partition, offset), []).append(f"{name}@{offset}")
    for epoch, positions in sorted(missing.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        if epoch is not None and len(positions) <= bad_records.get(epoch, 0):
            table.notes.append(f"epoch {epoch}: {len(positions)} records in no row, counted as not fitting the schema")
            continue
        table.fault(
            FaultKind.MISSING_RECORD,
            epoch,
            f"{len(positions)} records in the topic and in no live row: {first(positions)}",
        )


def _by_partition(rows: pa.Table) -> dict[tuple[str, int], pa.Table]:
    parts: dict[tuple[str, int], pa.Table] = {}
    keys = rows.select(["kafka_topic", "kafka_partition"]).group_by(["kafka_topic", "kafka_partition"]).aggregate([])
    for key in keys.to_pylist():
        topic, partition = key["kafka_topic"], key["kafka_partition"]
        mask = pc.and_(pc.equal(rows.column("kafka_topic"), topic), pc.equal(rows.column("kafka_partition"), partition))
        parts[(str(topic), int(partition))] = rows.filter(mask)
    return parts
