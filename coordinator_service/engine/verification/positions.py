"""The deep check, over the live rows' columns (read by tables/table_audit.py): no Kafka position twice, none outside
the committed range, no key twice in a keyed table, and, with the topic's offsets, none of them missing.

The positions are checked per topic-partition as sorted NumPy arrays of offsets: a hash aggregation over the three
columns took ten times as long on ten million rows. A sink's data files each hold one partition's records in Kafka
order, so its rows come in runs of one partition, already sorted: they are grouped by runs and sorted only when
they are not (a keyed table's rows are in key order)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from coordinator_service.engine.verification.findings import (
    FaultKind,
    Offsets,
    TableVerification,
    TopicPartition,
    first,
)
from coordinator_service.engine.verification.ranges import RangeWalk
from coordinator_service.engine.verification.topic_offsets import TopicOffsets

SHOWN = 5
SortedOffsets = npt.NDArray[np.int64]


def sorted_offsets(table: TableVerification, rows: pa.Table) -> dict[TopicPartition, SortedOffsets]:
    """Each topic-partition's offsets among `rows` (kafka_topic, kafka_partition, kafka_offset), sorted; rows without
    a position (a null) are noted and left out."""
    complete = rows.drop_null()
    if complete.num_rows < rows.num_rows:
        table.notes.append(f"{rows.num_rows - complete.num_rows} live rows have no Kafka position (a null)")
    if not complete.num_rows:
        return {}
    names, topic_numbers = _topics(complete.column("kafka_topic"))
    partitions = complete.column("kafka_partition").to_numpy()
    # One topic: its partitions are the keys. Else each (topic, partition) one number: the topic's above the
    # partition's, shifted to be at least 0.
    keys: npt.NDArray[np.integer[Any]] = partitions
    if topic_numbers is not None:
        keys = (topic_numbers.astype(np.int64) << 32) | (partitions.astype(np.int64) - _INT32_LOW)
    offsets = complete.column("kafka_offset").to_numpy()
    found: dict[TopicPartition, SortedOffsets] = {}
    for key, group in _by_key(keys, offsets):
        topic, partition = (
            (names[0], key) if topic_numbers is None else (names[key >> 32], (key & 0xFFFFFFFF) + _INT32_LOW)
        )
        ascending = group.size < 2 or bool(np.all(group[1:] >= group[:-1]))
        found[(str(topic), partition)] = group if ascending else np.sort(group)
    return found


def _topics(topics: pa.ChunkedArray) -> tuple[list[str], npt.NDArray[np.integer[Any]] | None]:
    """The topics of rows (none null): their names, and each row's topic as its index among them (None: all rows
    have the one topic). Rows read as dictionary arrays are encoded already (their dictionaries are unified); rows
    of plain strings are compared with the first, cheaper than encoding them, and encoded only when they differ."""
    if pa.types.is_dictionary(topics.type):
        encoded = pa.table({"topic": topics}).unify_dictionaries().column(0).combine_chunks()
    elif pc.all(pc.equal(topics, topics[0])).as_py():
        return [topics[0].as_py()], None
    else:
        encoded = pc.dictionary_encode(topics).combine_chunks()
    names = encoded.dictionary.to_pylist()
    return names, None if len(names) == 1 else encoded.indices.to_numpy()


# The least 32-bit partition number; kafka_partition is an int column any writer may have filled.
_INT32_LOW = -(2**31)
# Runs of one key at most, for grouping by runs: a sink's data files each hold one partition's records in order.
_MAX_RUNS = 4096


def _by_key(keys: npt.NDArray[np.integer[Any]], values: SortedOffsets) -> Iterator[tuple[int, SortedOffsets]]:
    """`values` grouped by their `keys`, each group in the order of `values`: by runs of one key when there are few
    (rows of one partition together, as a sink writes them), else by a mask per key."""
    starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    if starts.size >= _MAX_RUNS:
        for key in np.unique(keys).tolist():
            yield int(key), values[keys == key]
        return
    bounds = [0, *starts.tolist(), keys.size]
    runs: dict[int, list[SortedOffsets]] = defaultdict(list)
    for start, end in itertools.pairwise(bounds):
        runs[int(keys[start])].append(values[start:end])
    for key, parts in runs.items():
        yield key, parts[0] if len(parts) == 1 else np.concatenate(parts)


def check_positions(
    table: TableVerification, positions: Mapping[TopicPartition, SortedOffsets], walk: RangeWalk, low: Offsets | None
) -> None:
    """No position twice; with `low` and `walk.end` known, none outside the range they bound."""
    duplicates: list[tuple[str, int, int, int]] = []
    outside: list[str] = []
    outside_count = 0
    for (topic, partition), offsets in sorted(positions.items()):
        repeated = offsets[1:][offsets[1:] == offsets[:-1]]
        if repeated.size:
            values, counts = np.unique(repeated, return_counts=True)
            duplicates.extend((topic, partition, int(v), int(c) + 1) for v, c in zip(values, counts, strict=True))
        if walk.end is None or low is None or not offsets.size:
            continue
        floor, ceiling = low.get((topic, partition), 0), walk.end.get((topic, partition), 0)
        if offsets[0] < floor or offsets[-1] >= ceiling:
            wrong = offsets[(offsets < floor) | (offsets >= ceiling)]
            outside_count += wrong.size
            outside.extend(f"{topic}-{partition}@{offset}" for offset in wrong[:SHOWN].tolist())
    for topic, partition, offset, count in duplicates[:SHOWN]:
        more = f" (+{len(duplicates) - SHOWN} more positions)" if len(duplicates) > SHOWN else ""
        table.fault(
            FaultKind.DUPLICATE_POSITION,
            walk.epoch_of(topic, partition, offset),
            f"{topic}-{partition}@{offset} is in {count} live rows{more}",
        )
    if outside:
        table.fault(
            FaultKind.OUTSIDE_RANGE,
            None,
            f"{outside_count} live rows from offsets outside the committed range: {', '.join(outside[:SHOWN])}",
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
    positions: Mapping[TopicPartition, SortedOffsets],
    walk: RangeWalk,
    topic: Mapping[str, TopicOffsets],
    bad_records: Mapping[int, int],
) -> None:
    """Every offset the topics still hold in the committed range is in a live row (`topic`: by "topic-partition"),
    but as many of an epoch's as its writer counted records that did not fit (sent to a dead-letter topic)."""
    missing: dict[int | None, list[str]] = {}
    for name, held in sorted(topic.items()):
        present = positions.get((held.topic, held.partition), np.empty(0, np.int64))
        if held.before_log_start:
            table.notes.append(f"{name}: {held.before_log_start} offsets of the range are before the log start (gone)")
        absent = np.setdiff1d(np.asarray(held.offsets, np.int64), present, assume_unique=False)
        lost = 0
        for offset in absent.tolist():
            if walk.lost_by_abort(held.topic, held.partition, offset):
                lost += 1
                continue
            missing.setdefault(walk.epoch_of(held.topic, held.partition, offset), []).append(f"{name}@{offset}")
        if lost:
            table.notes.append(f"{name}: {lost} records of epochs an operator aborted are in no row (lost by design)")
    for epoch, found in sorted(missing.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        if epoch is not None and len(found) <= bad_records.get(epoch, 0):
            table.notes.append(f"epoch {epoch}: {len(found)} records in no row, counted as not fitting the schema")
            continue
        table.fault(
            FaultKind.MISSING_RECORD, epoch, f"{len(found)} records in the topic and in no live row: {first(found)}"
        )
