"""Where a micro-batch ended in Kafka, as the epoch properties the coordinator puts on its snapshots.

The end offsets come from the batch's line of Spark's offset log, one JSON value per
source (``{"topic": {"0": 42}}`` for this project's source and for Spark's own Kafka
source; keys starting with ``$`` are the source's own bookkeeping, not topics). The
latest record timestamp of each topic-partition is what the batch's tasks read
(``latest_timestamps``); the valid-through time is the least of them over every
partition of the end offsets, and none when one of them had no records in the batch
(coordinator_service.contract.source_positions says what the properties mean).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from coordinator_service.contract.source_positions import END_OFFSETS, VALID_THROUGH_MS

# The coordinator keeps at most 64 KiB of properties per epoch: offsets of thousands of partitions are left out.
MAX_END_OFFSETS_CHARS: Final = 24 * 1024

TopicPartition = tuple[str, int]


def end_offsets(source_lines: Sequence[str]) -> dict[str, dict[str, int]]:
    """The batch's end offsets over every Kafka source, topic -> partition -> offset; sources of other kinds (and
    "-", a source with no offset yet) contribute nothing."""
    merged: dict[str, dict[str, int]] = {}
    for line in source_lines:
        try:
            offsets = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(offsets, dict):
            continue
        for topic, partitions in offsets.items():
            if topic.startswith("$") or not isinstance(partitions, dict):
                continue
            kept = {
                str(partition): offset
                for partition, offset in partitions.items()
                if str(partition).isdigit() and isinstance(offset, int) and offset >= 0
            }
            merged.setdefault(topic, {}).update(kept)
    return merged


def latest_timestamps(records: pa.RecordBatch | pa.Table) -> dict[TopicPartition, int]:
    """The largest record timestamp (ms) of each topic-partition among Kafka records (records without one count
    for nothing; records without the columns, for instance a selection of them, tell nothing)."""
    if records.num_rows == 0 or not {"topic", "partition", "timestamp"} <= set(records.schema.names):
        return {}
    timestamps = pc.divide(records.column("timestamp").cast(pa.int64()), 1000)
    grouped = (
        pa.table({"topic": records.column("topic"), "partition": records.column("partition"), "ms": timestamps})
        .group_by(["topic", "partition"])
        .aggregate([("ms", "max")])
    )
    return {
        (topic, partition): latest
        for topic, partition, latest in zip(
            grouped.column("topic").to_pylist(),
            grouped.column("partition").to_pylist(),
            grouped.column("ms_max").to_pylist(),
            strict=True,
        )
        if latest is not None
    }


def merge_latest(parts: Iterable[Mapping[TopicPartition, int]]) -> dict[TopicPartition, int]:
    merged: dict[TopicPartition, int] = {}
    for part in parts:
        for key, latest in part.items():
            merged[key] = max(latest, merged.get(key, latest))
    return merged


def valid_through_ms(offsets: Mapping[str, Mapping[str, int]], latest: Mapping[TopicPartition, int]) -> int | None:
    partitions = [(topic, int(partition)) for topic, parts in offsets.items() for partition in parts]
    if not partitions or any(partition not in latest for partition in partitions):
        return None
    return min(latest[partition] for partition in partitions)


def position_properties(source_lines: Sequence[str], latest: Mapping[TopicPartition, int] | None) -> dict[str, str]:
    """The epoch properties saying where the batch ended; `latest` None: the tasks did not see the records."""
    offsets = end_offsets(source_lines)
    if not offsets:
        return {}
    properties = {}
    encoded = json.dumps(offsets, separators=(",", ":"), sort_keys=True)
    if len(encoded) <= MAX_END_OFFSETS_CHARS:
        properties[END_OFFSETS] = encoded
    through = None if latest is None else valid_through_ms(offsets, latest)
    if through is not None:
        properties[VALID_THROUGH_MS] = str(through)
    return properties
