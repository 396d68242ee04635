"""The deep check's positions (coordinator_service.engine.verification.positions.sorted_offsets): each
topic-partition's offsets among the live rows, sorted, compared with the same grouping done the plain way, whatever
the rows' order (a sink's runs of one partition in Kafka order, a keyed table's key order, anything), values (any
32-bit partition a writer may have put in the column, nulls) and reading (plain strings, or the topic as the
dictionary arrays of files read as written)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.engine.verification.findings import TableVerification
from coordinator_service.engine.verification.positions import sorted_offsets

Position = tuple[str | None, int | None, int | None]
POSITIONS = st.tuples(
    st.one_of(st.none(), st.sampled_from(["orders", "payments", "é/ü", ""])),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.integers(0, 3)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(0, 50)),
)


def rows_of(positions: list[Position], files: int = 0) -> pa.Table:
    """The rows as a table of plain strings; with `files`, as read from that many files (table_audit's reading of
    appended files): the topic a dictionary array, each file's chunk with a dictionary of its own."""
    topics, partitions, offsets = zip(*positions, strict=True) if positions else ((), (), ())
    table = pa.table(
        {
            "kafka_topic": pa.array(topics, pa.string()),
            "kafka_partition": pa.array(partitions, pa.int32()),
            "kafka_offset": pa.array(offsets, pa.int64()),
        }
    )
    if not files:
        return table
    size = -(-table.num_rows // files) or 1
    pieces = [table.slice(start, size) for start in range(0, table.num_rows, size)] or [table]
    return pa.concat_tables(
        piece.set_column(0, "kafka_topic", pc.dictionary_encode(piece.column("kafka_topic"))) for piece in pieces
    )


def reference(positions: list[Position]) -> dict[tuple[str, int], list[int]]:
    grouped: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in positions:
        if topic is not None and partition is not None and offset is not None:
            grouped.setdefault((topic, partition), []).append(offset)
    return {key: sorted(offsets) for key, offsets in grouped.items()}


def as_lists(found: dict[tuple[str, int], np.ndarray]) -> dict[tuple[str, int], list[int]]:
    return {key: offsets.tolist() for key, offsets in found.items()}


@given(
    positions=st.lists(POSITIONS, max_size=60),
    layout=st.sampled_from(["as drawn", "in runs", "sorted"]),
    files=st.sampled_from([0, 1, 3]),
)
def test_each_topic_partition_gets_its_offsets_sorted(positions: list[Position], layout: str, files: int) -> None:
    if layout == "in runs":  # a sink's files: one partition's rows together, in Kafka order
        positions = sorted(positions, key=lambda row: (str(row[0]), str(row[1]), row[2] is None, row[2] or 0))
    elif layout == "sorted":
        positions = sorted(positions, key=lambda row: (row[2] is None, row[2] or 0))
    table = TableVerification("db.t")

    found = sorted_offsets(table, rows_of(positions, files))

    assert as_lists(found) == reference(positions)
    nulls = sum(None in row for row in positions)
    assert table.notes == ([f"{nulls} live rows have no Kafka position (a null)"] if nulls else [])


def test_a_row_of_a_negative_partition_is_a_position_like_any_other() -> None:
    """A writer other than the sink may put any int in kafka_partition; the old check packed it into a key and read it
    back as an int32 NumPy scalar, which raised OverflowError for -1 (the whole verification failed)."""
    positions: list[Position] = [("t", -1, 5), ("t", 0, 6), ("t", -(2**31), 7), ("u", 2**31 - 1, 8), ("t", -1, 4)]

    assert as_lists(sorted_offsets(TableVerification("db.t"), rows_of(positions))) == reference(positions)


def test_many_short_runs_are_grouped_by_partition_all_the_same() -> None:
    """More runs than the run-wise grouping takes (rows of two partitions alternating): grouped by a mask per key."""
    positions: list[Position] = [
        ("t", partition, offset) for offset, partition in zip(range(20_000), itertools.cycle([0, 1]), strict=False)
    ]

    found = sorted_offsets(TableVerification("db.t"), rows_of(list(reversed(positions))))

    assert as_lists(found) == reference(positions)
