"""A fresh read's offset arithmetic (spark_writer.fresh.tail): which records come after the table's end offsets, in
every partition, against a reference that lists offsets one by one. No broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from spark_writer.fresh.tail import check_topics, read_end_offsets, tail_ranges, with_table_ahead
from spark_writer.kafka.data_loss import DataLossError
from spark_writer.kafka.offsets import OffsetRange, PartitionKey

A0, A1, A2, B0 = PartitionKey("a", 0), PartitionKey("a", 1), PartitionKey("a", 2), PartitionKey("b", 0)


def test_the_tail_starts_at_the_tables_end_offsets_and_ends_at_the_latest() -> None:
    assert tail_ranges({A0: 10, A1: 4}, {A0: 0, A1: 0}, {A0: 15, A1: 4}, True) == [OffsetRange("a", 0, 10, 15)]


def test_a_partition_added_after_the_snapshot_is_read_from_its_start() -> None:
    ranges = tail_ranges({A0: 10}, {A0: 0, A1: 0}, {A0: 12, A1: 5}, True)
    assert ranges == [OffsetRange("a", 0, 10, 12), OffsetRange("a", 1, 0, 5)]


def test_a_new_partition_whose_log_no_longer_starts_at_0_lost_records_as_the_sink_sees_it() -> None:
    # The Kafka source reads a new partition from offset 0: records retention deleted before it read them are lost.
    with pytest.raises(DataLossError, match=r"'a' partition 2: offsets \[0, 7\).*earliest available offset is 3"):
        tail_ranges({A0: 10}, {A0: 0, A2: 3}, {A0: 12, A2: 7}, True)
    with capture_logs():
        assert tail_ranges({A0: 10}, {A0: 0, A2: 3}, {A0: 12, A2: 7}, False) == [
            OffsetRange("a", 0, 10, 12),
            OffsetRange("a", 2, 3, 7),
        ]


def test_records_deleted_by_retention_after_the_snapshot_fail_the_read_or_are_skipped() -> None:
    with pytest.raises(DataLossError, match=r"'a' partition 0: offsets \[10, 30\).*earliest available offset is 15"):
        tail_ranges({A0: 10}, {A0: 15}, {A0: 30}, True)
    with capture_logs() as logs:
        assert tail_ranges({A0: 10}, {A0: 15}, {A0: 30}, False) == [OffsetRange("a", 0, 15, 30)]
    assert [line["event"] for line in logs] == ["kafka_data_loss_skipped"]


def test_retention_below_the_tables_end_offsets_loses_nothing() -> None:
    assert tail_ranges({A0: 20}, {A0: 15}, {A0: 30}, True) == [OffsetRange("a", 0, 20, 30)]
    assert tail_ranges({A0: 20}, {A0: 20}, {A0: 20}, True) == [], "every record is in the table: no tail"


def test_a_partition_gone_or_truncated_below_the_tables_end_is_data_loss() -> None:
    with pytest.raises(DataLossError, match="partition a-1 no longer exists"):
        tail_ranges({A0: 5, A1: 5}, {A0: 0}, {A0: 9}, True)
    with pytest.raises(DataLossError, match="latest offset 3 is below the start offset 5"):
        tail_ranges({A0: 5}, {A0: 0}, {A0: 3}, True)
    with capture_logs():
        assert tail_ranges({A0: 5, A1: 5}, {A0: 0}, {A0: 9}, False) == [OffsetRange("a", 0, 5, 9)]


def test_the_read_ends_at_the_latest_or_where_the_table_went_further() -> None:
    assert read_end_offsets({A0: 10, A1: 8}, {A0: 15, A1: 6, A2: 2}) == {A0: 15, A1: 8, A2: 2}


def test_end_offsets_of_a_topic_the_flags_do_not_name_are_refused() -> None:
    check_topics({A0: 1, B0: 2}, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"topic\(s\) \['b'\], which --topic \['a'\] does not name"):
        check_topics({A0: 1, B0: 2}, ["a"])


KEYS = st.sampled_from([A0, A1, A2, B0])
OFFSET = st.integers(0, 40)


@given(
    start=st.dictionaries(KEYS, OFFSET),
    earliest_latest=st.dictionaries(KEYS, st.tuples(OFFSET, OFFSET).map(sorted)),
)
def test_skipping_what_is_lost_the_tail_is_every_record_after_the_table_once(
    start: dict[PartitionKey, int], earliest_latest: dict[PartitionKey, list[int]]
) -> None:
    earliest = {key: bounds[0] for key, bounds in earliest_latest.items()}
    latest = {key: bounds[1] for key, bounds in earliest_latest.items()}
    with capture_logs():
        ranges = tail_ranges(start, earliest, latest, fail_on_data_loss=False)
    read = [(r.key, offset) for r in ranges for offset in range(r.start, r.end)]
    # The reference: each record the log holds now, not in the table (below its end offset; a new partition: none).
    expected = [
        (key, offset)
        for key in sorted(latest)
        for offset in range(earliest[key], latest[key])
        if offset >= start.get(key, 0)
    ]
    assert read == expected
    ends = read_end_offsets(start, latest)
    assert all(offset < ends[key] for key, offset in read)
    assert all(ends[key] >= offset for key, offset in start.items()), "nothing the table holds is left outside"


def test_a_table_that_committed_past_the_reads_start_is_no_data_loss() -> None:
    """The read takes the latest offsets before it loads the table; a commit in between can end the table past them.
    A later look-up shows the log reaching the table's end: that partition's tail is empty, the read ends there."""
    latest = with_table_ahead({A0: 10, A1: 3}, {A0: 8, A1: 5}, lambda: {A0: 12, A1: 6})
    assert latest == {A0: 10, A1: 5}
    assert tail_ranges({A0: 10, A1: 3}, {A0: 0, A1: 0}, latest, True) == [OffsetRange("a", 1, 3, 5)]
    assert read_end_offsets({A0: 10, A1: 3}, latest) == {A0: 10, A1: 5}


def test_a_log_that_still_ends_below_the_table_after_a_second_look_was_truncated() -> None:
    latest = with_table_ahead({A0: 10}, {A0: 8}, lambda: {A0: 8})
    with pytest.raises(DataLossError, match="latest offset 8 is below the start offset 10"):
        tail_ranges({A0: 10}, {A0: 0}, latest, True)


def test_the_log_is_looked_up_again_only_where_the_table_is_ahead() -> None:
    def never() -> dict[PartitionKey, int]:
        raise AssertionError("looked up again for nothing")

    assert with_table_ahead({A0: 5}, {A0: 5, A1: 2}, never) == {A0: 5, A1: 2}
