"""The torture harness's upsert mode (tests/torture/upserts.py) without Kafka: which records it takes as read, how it
names what a broker holds, what it draws for a keyed stream, and its flag."""

from __future__ import annotations

import random

import pytest

from tests.fixtures.upsert_streams import Change, ChangeStream, model, upsert_record
from tests.torture.__main__ import parse_args
from tests.torture.checks import Expected, Findings
from tests.torture.fault_kinds.kafka_records import plan_bad_records
from tests.torture.fault_kinds.kind import RunShape
from tests.torture.report import replay_command
from tests.torture.upserts import UpsertStream, with_region

PARTITIONS = 2


def landed(stream: UpsertStream, changes: list[Change]) -> None:
    """The changes as a broker would have placed them: each partition's offsets in production order."""
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    for label, change in enumerate(changes):
        partition, key, value = upsert_record(change, PARTITIONS, with_region)
        stream.record(label, change, (partition, next_offset[partition]), (key, value))
        next_offset[partition] += 1


@pytest.mark.parametrize("seed", range(5))
def test_the_records_of_a_deleted_topic_read_are_the_prefix_of_each_partition_the_table_holds(seed: int) -> None:
    """Of the records a batch may have read before its topic was deleted, each partition's first `cut` were read: the
    model of that cut is found whatever it is, and a table no cut explains is still compared against the closest."""
    rng = random.Random(seed)
    stream = UpsertStream.of(keys=20, seed=seed, delete_share=0.3)
    changes = stream.stream.take(200)
    landed(stream, changes)
    maybe = {label for label in range(len(changes)) if stream.positions[label][1] >= 40}  # from offset 40 on
    cuts = {partition: rng.randint(40, 100) for partition in range(PARTITIONS)}
    read = [label for label in range(len(changes)) if stream.positions[label][1] < cuts[stream.positions[label][0]]]
    table = model([changes[label] for label in read])
    found = Findings()

    taken = stream._read(Expected(set(), set(range(len(changes))), set(), maybe), table, found)

    assert model([changes[label] for label in taken]) == table
    assert found.anomalies == [] and "deleted_topic_read" in found.facts


def test_what_the_broker_holds_is_named_by_label_tombstones_of_one_key_by_their_position() -> None:
    stream = UpsertStream(ChangeStream(keys=1, seed=0))
    changes = [Change(7, (7, "a", 0), created=True), Change(7, None, False), Change(7, (7, "b", 2), True)]
    changes.append(Change(7, None, False))
    landed(stream, changes)
    held = {
        stream.positions[label]: upsert_record(change, PARTITIONS, with_region)[1:]
        for label, change in enumerate(changes)
    }
    held[(1, 99)] = (b'{"id": 8}', None)  # a record the stream never produced

    assert stream.labels(held) == {
        **{stream.positions[label]: str(label).encode() for label in range(4)},
        (1, 99): None,
    }


def test_a_keyed_streams_bad_records_never_draw_the_null_policy_the_writer_refuses() -> None:
    keyed = [plan_bad_records(random.Random(seed), RunShape(8, 5.0, keyed=True)) for seed in range(200)]
    plain = [plan_bad_records(random.Random(seed), RunShape(8, 5.0)) for seed in range(200)]
    assert {(plan["policy"], plan["then"]) for plan in keyed} == {
        ("fail", "dead-letter"),
        ("dead-letter", "dead-letter"),
    }
    assert "null" in {plan["policy"] for plan in plain} | {plan["then"] for plan in plain}


def test_the_mode_flag_takes_append_or_upsert_and_the_replay_command_keeps_it() -> None:
    assert parse_args([]).mode == "append"
    args = parse_args(replay_command(17, ("driver_kill", "maintenance_kill"), 2, upsert=True).split()[3:])
    assert (args.mode, args.seed, args.pool, args.faults_per_run) == (
        "upsert",
        17,
        ("driver_kill", "maintenance_kill"),
        2,
    )
    for hostile in ("UPSERT", "cdc", "", "upsert;rm", "append,upsert"):
        with pytest.raises(SystemExit):
            parse_args(["--mode", hostile])
