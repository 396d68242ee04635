"""The failOnDataLoss policy of the Kafka source (spark_writer.kafka.data_loss): no broker, no JVM."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from spark_writer.kafka.data_loss import (
    DataLossError,
    LogBounds,
    apply_data_loss_policy,
    find_lost_partitions,
    lost_records,
)
from spark_writer.kafka.offsets import OffsetRange, PartitionKey

A0, A1 = PartitionKey("a", 0), PartitionKey("a", 1)


def test_vanished_and_regressed_partitions_are_described() -> None:
    assert find_lost_partitions({A0: 5, A1: 9}, {A1: 2}) == [
        "partition a-0 no longer exists (topic deleted?)",
        "partition a-1: latest offset 2 is below the start offset 9 (topic re-created or records truncated)",
    ]
    assert find_lost_partitions({A0: 5}, {A0: 5, A1: 0}) == []


def test_data_loss_policy_passes_intact_ranges() -> None:
    intact = OffsetRange("a", 0, 20, 30)
    assert apply_data_loss_policy(intact, LogBounds(20), fail_on_data_loss=True) is intact
    assert apply_data_loss_policy(intact, LogBounds(0, 25), fail_on_data_loss=True) is intact


def test_data_loss_policy_fails_with_a_clear_message() -> None:
    with pytest.raises(DataLossError) as raised:
        apply_data_loss_policy(OffsetRange("orders", 3, 10, 30), LogBounds(15), fail_on_data_loss=True)
    message = str(raised.value)
    assert "'orders' partition 3" in message
    assert "[10, 30)" in message
    assert "earliest available offset is 15" in message
    assert "5 record(s)" in message
    assert "failOnDataLoss=false" in message


def test_data_loss_policy_skips_to_earliest_when_allowed() -> None:
    with capture_logs() as logs:
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(15), False) == OffsetRange("a", 0, 15, 30)
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(30), False) is None
        assert apply_data_loss_policy(OffsetRange("a", 0, 10, 30), LogBounds(99), False) is None
        assert apply_data_loss_policy(OffsetRange("a", 0, 20, 30), LogBounds(15), False) == OffsetRange("a", 0, 20, 30)
    assert [line["event"] for line in logs] == ["kafka_data_loss_skipped"] * 3, "only what was skipped is logged"


@pytest.mark.parametrize(
    ("bounds", "kept", "described"),
    [
        (None, None, "[10, 30) were requested but the partition no longer exists (topic deleted?); 20 record(s)"),
        (LogBounds(0, 10), None, "[10, 30) were requested but the log ends at offset 10; 20 record(s) are gone"),
        (LogBounds(0, 4), None, "the log ends at offset 4"),
        (LogBounds(0, 12), OffsetRange("a", 0, 10, 30), None),  # readable up to 12: read it, look again then
    ],
)
def test_lost_records_of_a_missing_or_truncated_log(
    bounds: LogBounds | None, kept: OffsetRange | None, described: str | None
) -> None:
    remaining, problem = lost_records(OffsetRange("a", 0, 10, 30), bounds)
    assert remaining == kept
    if described is None:
        assert problem is None
    else:
        assert problem is not None and described in problem
