"""An epoch's records of each key reduced to the one that wins: the last in Kafka order.

Kafka orders the records of a partition by their offsets and no others, so the rule has two steps:

1. in each topic-partition, a key's last record (the highest offset) wins over its earlier ones;
2. when a key's records span partitions (or topics) in one epoch, the winner among those last records is the one with
   the latest record timestamp, then, at equal timestamps (or none), the greatest topic name, then the greatest
   partition number. A record without a timestamp is older than any with one.

Everything the rule reads is part of the records (their topic, partition, offset and timestamp), and an epoch's
records are the same every time Spark runs its batch (the same offset ranges), so a batch run again gives the same
winners. Across epochs the later epoch wins, whatever its timestamps: the coordinator applies epochs in order.

The reduction works on Arrow tables of decoded rows that carry their op (OP_COLUMN) and their Kafka position (the
kafka_* columns), and can be fed batch by batch (`LastWins`): it keeps the last record of each key in each
partition, which is all step 2 needs. Pure: no Spark.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_writer.mutations.modes import Op

# The op of each decoded row (Op, int8).
OP_COLUMN: Final = "_sink_op"
TOPIC: Final = "kafka_topic"
PARTITION: Final = "kafka_partition"
OFFSET: Final = "kafka_offset"
TIMESTAMP: Final = "kafka_timestamp"
POSITION_COLUMNS: Final = (TOPIC, PARTITION, OFFSET, TIMESTAMP)
# Between a key's columns in its text (any text would do: two keys sharing a text only share a task).
_SEPARATOR: Final = "\x1f"
# Rows LastWins gathers at least before it reduces them.
COMPACT_ROWS: Final = 65_536


@dataclass(frozen=True)
class Reduced:
    """An epoch's (or a task's) outcome: the rows that survive (the winners that upsert, in key order, with their
    op and position columns) and every key touched (the winners' keys, upserted or deleted, in key order)."""

    rows: pa.Table
    keys: pa.Table


def key_text(rows: pa.Table, key: Sequence[str]) -> pa.Array:
    """Each row's key as one text (null where a column is null): equal keys give equal texts, which is what a batch's
    records are shuffled by, so that one task gets every record of a key."""
    columns = []
    for name in key:
        column = rows.column(name).combine_chunks()
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            column = pa.array(
                [None if value is None else base64.b64encode(value).decode() for value in column.to_pylist()],
                pa.string(),
            )
        columns.append(column.cast(pa.string()))
    return pc.binary_join_element_wise(*columns, _SEPARATOR)


def last_of_groups(rows: pa.Table, group: Sequence[str], order: Sequence[str]) -> pa.Table:
    """The last row of each group of equal `group` values, `order` deciding which is last (ascending, nulls first);
    in the order of the groups."""
    if rows.num_rows <= 1:
        return rows
    sort_keys = [(name, "ascending", "at_start") for name in (*group, *order)]
    indices = pc.sort_indices(rows, sort_keys=sort_keys)
    sorted_group = rows.select(list(group)).take(indices)
    last = np.zeros(rows.num_rows, dtype=bool)
    last[-1] = True
    for name in group:
        column = sorted_group.column(name).combine_chunks()
        differs = pc.not_equal(column.slice(0, len(column) - 1), column.slice(1))
        last[:-1] |= np.asarray(differs.to_numpy(zero_copy_only=False), dtype=bool)
    return rows.take(indices.filter(pa.array(last)))


def last_per_partition(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """Step 1: the last record (highest offset) of each key in each topic-partition."""
    return last_of_groups(rows, (*key, TOPIC, PARTITION), (OFFSET,))


def winners(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """Step 2 over step 1's rows: each key's winner, by timestamp, then topic, then partition."""
    return last_of_groups(rows, key, (TIMESTAMP, TOPIC, PARTITION))


def reduce(rows: pa.Table, key: Sequence[str]) -> Reduced:
    """The epoch's winners (the module's rule): the rows that survive, and the keys touched."""
    won = winners(last_per_partition(rows, key), key)
    return Reduced(rows=won.filter(pc.equal(won.column(OP_COLUMN), Op.UPSERT.value)), keys=won.select(list(key)))


class LastWins:
    """The reduction fed a batch of rows at a time: it keeps the last record of each key in each partition, reducing
    what came in whenever it outgrows what it kept (so that each row is sorted a bounded number of times)."""

    def __init__(self, key: Sequence[str], compact_rows: int = COMPACT_ROWS) -> None:
        self._key = tuple(key)
        self._compact_rows = compact_rows
        self._kept: list[pa.Table] = []
        self._kept_rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self._pending.append(rows)
        self._pending_rows += rows.num_rows
        if self._pending_rows >= max(self._kept_rows, self._compact_rows):
            self._compact()

    def result(self, schema: pa.Schema) -> Reduced:
        """The winners of everything added (rows of `schema`, which an empty result has)."""
        self._compact()
        return reduce(self._kept[0] if self._kept else schema.empty_table(), self._key)

    def _compact(self) -> None:
        if not self._pending:
            return
        kept = last_per_partition(pa.concat_tables([*self._kept, *self._pending]), self._key)
        self._kept, self._kept_rows = [kept], kept.num_rows
        self._pending, self._pending_rows = [], 0
