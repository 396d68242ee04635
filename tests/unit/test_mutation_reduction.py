"""The per-epoch reduction of an upsert or change stream (spark_writer.mutations.reduction) against a plain model of
its rule: a key's last record in each partition, then the latest-stamped of those (then topic, then partition)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from spark_writer.mutations.modes import Op
from spark_writer.mutations.reduction import OP_COLUMN, LastWins, reduce

EPOCH_START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
SCHEMA = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("value", pa.string()),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field(OP_COLUMN, pa.int8()),
    ]
)
KEY = ("tenant", "id")


@dataclass(frozen=True)
class Record:
    tenant: str
    id: int
    op: Op
    value: str
    topic: str
    partition: int
    timestamp: int | None  # seconds after EPOCH_START; None: the record has none


RECORDS = st.builds(
    Record,
    tenant=st.sampled_from(["a", "b"]),
    id=st.integers(min_value=0, max_value=4),
    op=st.sampled_from(list(Op)),
    value=st.text(max_size=3),
    topic=st.sampled_from(["t1", "t2"]),
    partition=st.integers(min_value=0, max_value=2),
    timestamp=st.none() | st.integers(min_value=0, max_value=3),
)


def as_rows(records: list[Record]) -> list[dict[str, Any]]:
    """The records in Kafka order within each partition: each partition's offsets count up in list order."""
    offsets: dict[tuple[str, int], int] = {}
    rows = []
    for record in records:
        offset = offsets[(record.topic, record.partition)] = offsets.get((record.topic, record.partition), -1) + 1
        rows.append(
            {
                "tenant": record.tenant,
                "id": record.id,
                "value": record.value,
                "kafka_topic": record.topic,
                "kafka_partition": record.partition,
                "kafka_offset": offset,
                "kafka_timestamp": None
                if record.timestamp is None
                else EPOCH_START + dt.timedelta(seconds=record.timestamp),
                OP_COLUMN: record.op.value,
            }
        )
    return rows


def model(records: list[Record]) -> tuple[dict[tuple[str, int], str], set[tuple[str, int]]]:
    """The rule, plainly: a later record of a key in the same partition replaces the earlier; across partitions the
    latest timestamp (none is oldest) wins, then the greater topic, then the greater partition."""
    last_in_partition: dict[tuple[str, int], dict[tuple[str, int], Record]] = {}
    for record in records:  # list order is offset order within each partition
        last_in_partition.setdefault((record.tenant, record.id), {})[(record.topic, record.partition)] = record
    surviving = {}
    for key, lasts in last_in_partition.items():
        winner = max(
            lasts.values(),
            key=lambda r: (r.timestamp is not None, r.timestamp or 0, r.topic, r.partition),
        )
        if winner.op is Op.UPSERT:
            surviving[key] = winner.value
    return surviving, set(last_in_partition)


def outcome(rows: pa.Table, keys: pa.Table) -> tuple[dict[tuple[str, int], str], set[tuple[str, int]]]:
    surviving = {(row["tenant"], row["id"]): row["value"] for row in rows.to_pylist()}
    assert len(surviving) == rows.num_rows  # one row per key
    touched = [(row["tenant"], row["id"]) for row in keys.to_pylist()]
    assert len(set(touched)) == len(touched)
    return surviving, set(touched)


@given(st.lists(RECORDS, max_size=40))
def test_the_reduction_is_the_rule(records: list[Record]) -> None:
    reduced = reduce(pa.Table.from_pylist(as_rows(records), SCHEMA), KEY)
    assert outcome(reduced.rows, reduced.keys) == model(records)
    assert reduced.keys.column_names == list(KEY)


@given(st.lists(RECORDS, max_size=40), st.lists(st.integers(min_value=1, max_value=7), min_size=1))
def test_fed_in_any_chunks_and_any_order_of_batches_it_gives_the_same(records: list[Record], sizes: list[int]) -> None:
    """A task receives its records in batches, shuffled from several upstream tasks: the outcome does not depend on
    how they arrive, only on their positions."""
    rows = pa.Table.from_pylist(as_rows(records), SCHEMA)
    reduction = LastWins(KEY, compact_rows=3)  # reduced again and again as the chunks come
    start, chunks = 0, []
    for size in sizes * (len(records) + 1):
        if start >= rows.num_rows:
            break
        chunks.append(rows.slice(start, size))
        start += size
    for chunk in reversed(chunks):
        reduction.add(chunk)
    reduced = reduction.result(SCHEMA)
    assert outcome(reduced.rows, reduced.keys) == model(records)


def test_within_a_partition_the_highest_offset_wins_whatever_the_timestamps() -> None:
    records = [
        Record("a", 1, Op.UPSERT, "old", "t1", 0, 3),
        Record("a", 1, Op.UPSERT, "new", "t1", 0, 0),  # a later offset with an earlier producer timestamp
    ]
    reduced = reduce(pa.Table.from_pylist(as_rows(records), SCHEMA), KEY)
    assert outcome(reduced.rows, reduced.keys) == ({("a", 1): "new"}, {("a", 1)})


def test_a_delete_that_wins_leaves_its_key_touched_and_no_row() -> None:
    records = [Record("a", 1, Op.UPSERT, "x", "t1", 0, 0), Record("a", 1, Op.DELETE, "", "t1", 1, 2)]
    reduced = reduce(pa.Table.from_pylist(as_rows(records), SCHEMA), KEY)
    assert outcome(reduced.rows, reduced.keys) == ({}, {("a", 1)})


def test_nothing_in_gives_nothing_out() -> None:
    reduced = LastWins(KEY).result(SCHEMA)
    assert (reduced.rows.num_rows, reduced.keys.num_rows) == (0, 0)
    assert reduced.rows.schema == SCHEMA
