"""failOnDataLoss: what the Kafka source does when records it must read are gone.

Records go missing when retention or delete-records removed them before they were
read, when a log ends below a planned range (truncated, or the topic created
again), or when a partition no longer exists. The policy is one rule, applied
wherever the loss is seen (planning a batch, planning its tasks, reading a range):
with ``failOnDataLoss=true`` the batch fails with a ``DataLossError`` that names
the topic, partition, offsets and the option to set; otherwise what is gone is
skipped, and each skip is logged (``kafka_data_loss_skipped``), nothing else.

Pure but for that log line: no broker, no Spark (tests/unit/test_writer_imports.py checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from spark_writer.kafka.offsets import OffsetRange, PartitionKey

log = structlog.get_logger(__name__)

FAIL_ON_DATA_LOSS_HINT: Final = (
    "Set the option failOnDataLoss=false (sink-writer: --no-fail-on-data-loss) to skip what is gone instead of failing"
)


class DataLossError(RuntimeError):
    """Records that a batch must read are gone from Kafka (and failOnDataLoss is true)."""


@dataclass(frozen=True)
class LogBounds:
    """What an existing partition's log holds now: records from ``low`` on, up to ``high`` (None: not looked up)."""

    low: int
    high: int | None = None


def find_lost_partitions(start: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]) -> list[str]:
    """Describe partitions that vanished or whose log end moved below the start offset."""
    problems = []
    for key, offset in sorted(start.items()):
        if key not in latest:
            problems.append(f"partition {key} no longer exists (topic deleted?)")
        elif latest[key] < offset:
            problems.append(
                f"partition {key}: latest offset {latest[key]} is below the start offset {offset} "
                "(topic re-created or records truncated)"
            )
    return problems


def lost_records(offset_range: OffsetRange, bounds: LogBounds | None) -> tuple[OffsetRange | None, str | None]:
    """The part of the range that can still be read, and what cannot (None: nothing is lost).

    ``bounds`` None means the partition no longer exists.
    """
    requested = (
        f"Kafka data loss in topic {offset_range.topic!r} partition {offset_range.partition}: "
        f"offsets [{offset_range.start}, {offset_range.end}) were requested but "
    )
    if bounds is None:
        return None, requested + f"the partition no longer exists (topic deleted?); {offset_range.size} record(s) lost"
    if offset_range.start < bounds.low:
        lost = min(bounds.low, offset_range.end) - offset_range.start
        remaining = OffsetRange(offset_range.topic, offset_range.partition, bounds.low, offset_range.end)
        return (remaining if remaining.size > 0 else None), (
            requested + f"the earliest available offset is {bounds.low}; {lost} record(s) were deleted "
            "(retention or delete-records) before they were read"
        )
    if bounds.high is not None and bounds.high <= offset_range.start < offset_range.end:
        return None, (
            requested + f"the log ends at offset {bounds.high}; {offset_range.size} record(s) are gone "
            "(the log was truncated or the topic created again)"
        )
    return offset_range, None


def report_data_loss(problem: str, fail_on_data_loss: bool) -> None:
    """Fail with DataLossError saying what to do, or log what is skipped."""
    if fail_on_data_loss:
        raise DataLossError(f"{problem}. {FAIL_ON_DATA_LOSS_HINT}")
    log.warning("kafka_data_loss_skipped", message=f"{problem}; skipped (failOnDataLoss=false)")


def apply_data_loss_policy(
    offset_range: OffsetRange, bounds: LogBounds | None, fail_on_data_loss: bool
) -> OffsetRange | None:
    """The part of the range that still exists; what is gone fails the batch or is skipped with a warning."""
    kept, problem = lost_records(offset_range, bounds)
    if problem is not None:
        report_data_loss(problem, fail_on_data_loss)
    return kept
