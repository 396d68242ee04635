"""Offset arithmetic of the Kafka source (spark_writer.kafka.offsets): pure functions, no broker, no JVM."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_writer.kafka.offsets import (
    Incarnation,
    OffsetRange,
    PartitionKey,
    batch_start_offsets,
    cap_to_target,
    incarnations_from_json,
    incarnations_of,
    initial_offsets_json,
    offsets_covered,
    offsets_from_json,
    offsets_to_json,
    plan_end_offsets,
    plan_ranges,
    planned_end_json,
    replaced_topics,
    resolve_starting_offsets,
    spread_max_rows,
)

A0, A1, A2 = PartitionKey("a", 0), PartitionKey("a", 1), PartitionKey("a", 2)
B0 = PartitionKey("b", 0)


# ------------------------------------------------------------------ startingOffsets


EARLIEST = {A0: 5, A1: 0, A2: 7}
LATEST = {A0: 50, A1: 10, A2: 70}


def test_resolve_earliest_and_latest() -> None:
    assert resolve_starting_offsets("earliest", EARLIEST, LATEST) == EARLIEST
    assert resolve_starting_offsets("latest", EARLIEST, LATEST) == LATEST


def test_resolve_json_with_special_offsets() -> None:
    spec = {"a": {0: 23, 1: -2, 2: -1}}
    assert resolve_starting_offsets(spec, EARLIEST, LATEST) == {A0: 23, A1: 0, A2: 70}


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"a": {0: 1, 1: 1}}, r"missing partitions: \['a-2'\]"), ({"a": {0: 1, 1: 1, 2: 1, 3: 1}}, "a-3")],
)
def test_resolve_json_must_name_exactly_the_partitions(spec: dict[str, dict[int, int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_starting_offsets(spec, EARLIEST, LATEST)


# ------------------------------------------------------------------ maxOffsetsPerTrigger


def test_spread_proportional_to_backlogs() -> None:
    assert spread_max_rows({A0: 100, A1: 100, A2: 100}, 30) == {A0: 10, A1: 10, A2: 10}
    # Shares 0.79, 39.47 and 19.74: rounded down (58), the two records left go to the largest remainders.
    assert spread_max_rows({A0: 2, A1: 100, A2: 50}, 60) == {A0: 1, A1: 39, A2: 20}


def test_a_batch_under_the_cap_holds_exactly_the_cap() -> None:
    # Spark rounds each share down: 4 x 3,124 = 12,496 of 12,500, and a fifth batch of 4 records follows.
    available = {A0: 24_999, A1: 25_001, A2: 24_998, B0: 25_002}
    assert sum(spread_max_rows(available, 12_500).values()) == 12_500


def test_spread_grants_everything_under_the_cap() -> None:
    available = {A0: 3, A1: 0, A2: 4}
    assert spread_max_rows(available, 100) == available
    assert spread_max_rows(available, 7) == available


def test_spread_gives_every_backlog_a_record_even_under_a_tiny_cap() -> None:
    assert spread_max_rows({A0: 10, A1: 30, A2: 20, B0: 0}, 2) == {A0: 1, A1: 1, A2: 1, B0: 0}


def test_small_cap_starves_no_partition_over_many_triggers() -> None:
    """4 partitions with a backlog, a cap of 2: every record produced is read within the triggers."""
    keys = (A0, A1, A2, B0)
    latest = {A0: 1, A1: 40, A2: 40, B0: 40}
    start = dict.fromkeys(keys, 0)
    for _ in range(50):
        for key in (A1, A2, B0):
            latest[key] += 1  # the big partitions keep growing
        start = plan_end_offsets(start, dict.fromkeys(keys, 0), latest, max_rows=2)
    assert start[A0] == latest[A0], f"partition a-0 starved: read up to {start[A0]} of {latest[A0]}"
    assert all(start[key] >= 50 for key in (A1, A2, B0))


backlogs = st.dictionaries(
    st.builds(PartitionKey, st.sampled_from("abc"), st.integers(0, 7)), st.integers(0, 10_000), max_size=24
)


@given(available=backlogs, max_rows=st.integers(1, 50_000))
def test_spread_properties(available: dict[PartitionKey, int], max_rows: int) -> None:
    granted = spread_max_rows(available, max_rows)
    assert granted.keys() == available.keys()
    assert all(0 <= granted[key] <= available[key] for key in available), "more than a partition has"
    waiting = [key for key, rows in available.items() if rows > 0]
    assert all(granted[key] >= 1 for key in waiting), "a partition with a backlog got nothing"
    total = sum(available.values())
    if total <= max_rows:
        assert granted == available
    else:
        # The cap exactly, or over it by at most the one record each starved share is rounded up to.
        assert max_rows <= sum(granted.values()) <= max_rows + len(waiting)


@given(available=backlogs, max_rows=st.integers(1, 200), triggers=st.integers(1, 5))
def test_every_backlog_drains_in_bounded_triggers(
    available: dict[PartitionKey, int], max_rows: int, triggers: int
) -> None:
    """Each trigger reads at least one record of every partition with a backlog: none waits behind the others."""
    remaining = dict(available)
    for _ in range(triggers):
        granted = spread_max_rows(remaining, max_rows)
        for key, rows in remaining.items():
            assert granted[key] >= min(1, rows)
        remaining = {key: rows - granted[key] for key, rows in remaining.items()}
    for key, rows in available.items():
        assert remaining[key] <= max(0, rows - triggers)


# ------------------------------------------------------------------ end offsets and ranges


def test_plan_end_reads_everything_without_cap() -> None:
    assert plan_end_offsets({A0: 5, A1: 3}, {A0: 0, A1: 0}, {A0: 9, A1: 3}, None) == {A0: 9, A1: 3}


def test_plan_end_respects_cap() -> None:
    end = plan_end_offsets({A0: 0, A1: 0}, {A0: 0, A1: 0}, {A0: 100, A1: 4}, 10)
    assert end == {A0: 9, A1: 1}


def test_plan_end_new_partition_starts_at_zero() -> None:
    assert plan_end_offsets({A0: 5}, {A0: 0, A1: 0}, {A0: 5, A1: 8}, None) == {A0: 5, A1: 8}
    assert plan_ranges({A0: 5}, {A0: 5, A1: 8}) == [OffsetRange("a", 1, 0, 8)]


def test_plan_end_after_deleted_records_counts_from_earliest() -> None:
    # 10 records below offset 20 were deleted: the cap applies to what still exists.
    end = plan_end_offsets({A0: 10}, {A0: 20}, {A0: 100}, 5)
    assert end == {A0: 25}
    assert plan_ranges({A0: 10}, end) == [OffsetRange("a", 0, 10, 25)]


def test_plan_end_leaves_out_vanished_partitions_and_follows_regressed_ones() -> None:
    # a-0 is gone: left out, so that the topic created again is new (read from 0) in a later batch.
    assert plan_end_offsets({A0: 5, A1: 9}, {A1: 0}, {A1: 2}, None) == {A1: 2}


def test_plan_ranges_skips_empty_and_backwards_ranges() -> None:
    ranges = plan_ranges({A0: 5, A1: 9, A2: 0}, {A0: 5, A1: 2, A2: 3, B0: 0})
    assert ranges == [OffsetRange("a", 2, 0, 3)]


def test_cap_to_target_leaves_out_partitions_born_after_it() -> None:
    assert cap_to_target({A0: 50, A1: 7, A2: 3}, {A0: 40, A1: 9}, {A0: 5}) == {A0: 40, A1: 7}


def test_cap_to_target_keeps_a_partition_read_before_that_the_target_lacks() -> None:
    # A2 was read up to 2 but the target (one incomplete answer) lacks it: it waits there, never forgotten.
    assert cap_to_target({A0: 50, A2: 9}, {A0: 40}, {A0: 5, A2: 2}) == {A0: 40, A2: 2}


# ------------------------------------------------------------------ offsets JSON


def test_offsets_json_round_trip_is_canonical() -> None:
    offsets = {B0: 1, A2: 3, A0: 7, PartitionKey("a", 10): 4}
    as_json = offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"a": {"0": 7, "2": 3, "10": 4}, "b": {"0": 1}}'
    assert offsets_from_json(json.loads(json.dumps(as_json))) == offsets


def test_batch_0_end_carries_its_start_and_later_batches_ignore_it() -> None:
    initial = initial_offsets_json({A0: 3, B0: 0})
    assert initial == {"$initial": {"a": {"0": 3}, "b": {"0": 0}}}
    end_0 = planned_end_json(initial, {A0: 8, B0: 2}, {})
    assert json.dumps(end_0) == '{"$start": {"a": {"0": 3}, "b": {"0": 0}}, "a": {"0": 8}, "b": {"0": 2}}'
    # Planning and running batch 0: its start is the one recorded in its end, whatever initialOffset says now.
    assert batch_start_offsets(initial) == {A0: 3, B0: 0}
    assert batch_start_offsets(initial_offsets_json({A0: 9, B0: 5}), end_0) == {A0: 3, B0: 0}
    # Batch 1 starts at batch 0's end; its own end carries no start.
    assert batch_start_offsets(end_0) == {A0: 8, B0: 2}
    end_1 = planned_end_json(end_0, {A0: 9, B0: 2}, {})
    assert end_1 == {"a": {"0": 9}, "b": {"0": 2}}
    assert batch_start_offsets(end_0, end_1) == {A0: 8, B0: 2}
    assert offsets_from_json(end_0) == {A0: 8, B0: 2}


def test_a_topic_created_again_is_read_from_its_new_lifes_start() -> None:
    before = incarnations_of({}, {A0: 4, A1: 0})
    end_1 = planned_end_json({"a": {"0": 8, "1": 3}}, {A0: 10, A1: 3}, before)
    assert end_1["$incarnations"] == {"a": {"logStarts": {"0": 4, "1": 0}}}
    # Retention moved a-0's log start: the same life.
    assert replaced_topics(incarnations_from_json(end_1), incarnations_of({}, {A0: 6, A1: 0})) == []
    # a-0's log start went back: a new life, read from its start in every partition.
    now = incarnations_of({}, {A0: 0, A1: 0}, new_lives=("a",))
    assert replaced_topics(incarnations_from_json(end_1), now) == ["a"]
    end_2 = planned_end_json(end_1, {A0: 20, A1: 15}, now)
    assert batch_start_offsets(end_1, end_2) == {A0: 0, A1: 0}
    assert batch_start_offsets(end_2, planned_end_json(end_2, {A0: 21, A1: 15}, now)) == {A0: 20, A1: 15}


def test_a_topic_id_tells_the_lives_apart_whatever_the_offsets() -> None:
    first = incarnations_of({"a": "id-1"}, {A0: 0})
    assert incarnations_from_json(planned_end_json({}, {A0: 10}, first)) == {"a": Incarnation("id-1")}
    assert replaced_topics(first, incarnations_of({"a": "id-1"}, {A0: 0})) == []
    again = incarnations_of({"a": "id-2"}, {A0: 3}, new_lives=("a",))
    assert replaced_topics(first, again) == ["a"]
    end = planned_end_json(planned_end_json({}, {A0: 10}, first), {A0: 40}, again)
    assert batch_start_offsets(planned_end_json({}, {A0: 10}, first), end) == {A0: 3}


def test_offsets_covered_counts_each_planned_range_as_the_batch_reads_it() -> None:
    """What a batch covers, from its start and end offsets as Spark's progress reports them (the demo's progress bar
    counts records by it, as a stream of offset ranges has no records in Spark)."""
    initial = initial_offsets_json({A0: 3, B0: 0})
    end_0 = planned_end_json(initial, {A0: 8, B0: 2}, {})
    # Batch 0: from the start its end recorded, whether Spark reports no start or initialOffset's answer.
    assert offsets_covered(None, end_0) == 7
    assert offsets_covered(initial_offsets_json({A0: 9, B0: 5}), end_0) == 7
    # A later batch; a partition new to it is read from 0; none goes back.
    assert offsets_covered(end_0, planned_end_json(end_0, {A0: 10, A1: 4, B0: 2}, {})) == 6
    assert offsets_covered({"a": {"0": 10}}, {"a": {"0": 10}}) == 0
    # A topic created again is read from its new life's start.
    before = incarnations_of({}, {A0: 4})
    end_1 = planned_end_json({"a": {"0": 8}}, {A0: 10}, before)
    now = incarnations_of({}, {A0: 0}, new_lives=("a",))
    assert offsets_covered(end_1, planned_end_json(end_1, {A0: 6}, now)) == 6
