"""Where an epoch ended in Kafka, as its writer tells it and as the table's snapshots then say it.

A writer may send two epoch properties with a pre-commit (the Spark writer sends both):

- ``kafka.end-offsets``: JSON ``{"topic": {"partition": offset}}``, the next offset to
  read in each topic-partition once the epoch is done (the form of Spark's Kafka
  ``startingOffsets``, so a query can restart from it);
- ``kafka.valid-through-ms``: milliseconds since the epoch, the least over the epoch's
  partitions of the largest record timestamp read in it; absent when a partition
  had no records (Iceberg Kafka Connect's valid-through timestamp: every record up
  to that time, in every partition, is in the table).

The coordinator refuses malformed values (nothing is persisted), and every
snapshot it appends carries the values of its newest epoch under the names
below (``sink-coordinator.`` beside the markers), so that any Iceberg reader can
tell how far the table goes. A snapshot whose newest epoch lacks one lacks it too.
Standard library only: writers import the names from here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

END_OFFSETS: Final = "kafka.end-offsets"
VALID_THROUGH_MS: Final = "kafka.valid-through-ms"
SNAPSHOT_END_OFFSETS: Final = f"sink-coordinator.{END_OFFSETS}"
SNAPSHOT_VALID_THROUGH_MS: Final = f"sink-coordinator.{VALID_THROUGH_MS}"
_SNAPSHOT_NAMES: Final = {END_OFFSETS: SNAPSHOT_END_OFFSETS, VALID_THROUGH_MS: SNAPSHOT_VALID_THROUGH_MS}


def check_positions(properties: Mapping[str, str]) -> None:
    """ValueError saying what is wrong with an epoch's position properties, if anything."""
    if END_OFFSETS in properties:
        _check_end_offsets(properties[END_OFFSETS])
    if VALID_THROUGH_MS in properties:
        value = properties[VALID_THROUGH_MS]
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"property {VALID_THROUGH_MS} must be milliseconds since the epoch (>= 0), got {value!r}")


def snapshot_positions(properties: Mapping[str, str]) -> dict[str, str]:
    """The snapshot summary properties of an epoch with these properties (checked by check_positions)."""
    return {snapshot: properties[name] for name, snapshot in _SNAPSHOT_NAMES.items() if name in properties}


def _check_end_offsets(raw: str) -> None:
    expected = f'property {END_OFFSETS} must be JSON like {{"topic": {{"0": 42}}}}'
    try:
        offsets = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(f"{expected}, got {raw[:200]!r}") from None
    if not isinstance(offsets, dict):
        raise ValueError(f"{expected}, got {raw[:200]!r}")
    for topic, partitions in offsets.items():
        if not topic or not isinstance(partitions, dict):
            raise ValueError(f"{expected}: topic {topic!r} maps to {partitions!r}")
        for partition, offset in partitions.items():
            if not (partition.isascii() and partition.isdigit()):
                raise ValueError(f"{expected}: partition {partition!r} of topic {topic!r} is not a number")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"{expected}: offset {offset!r} of {topic}-{partition} is not an offset (>= 0)")
