"""Which records a fresh read takes from Kafka: those after the table's end offsets, up to the latest offsets.

The table's end offsets are those its newest snapshot of the sink carries (`sink-coordinator.kafka.end-offsets`):
every record below them, in every partition they name, is in the table. The tail is, per partition, the records from
there up to the last stable offset seen when the read began, planned by the Kafka source's own arithmetic
(kafka.offsets) and its data-loss policy (kafka.data_loss), so that a fresh read takes what the sink's next batches
will take:

* a partition the end offsets do not name was added after the snapshot: read from its start, as the source reads it;
* records deleted (retention, delete-records) between the end offsets and the log's start are lost to the table too:
  the read fails naming them (DataLossError), or with fail_on_data_loss off skips them, as the sink would;
* a partition gone, or whose log ends below the end offsets, is data loss the same way.

Every record is in the table or in the tail, never both: the tail starts where the table ends. Pure: no broker.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from spark_writer.kafka.data_loss import LogBounds, apply_data_loss_policy, find_lost_partitions, report_data_loss
from spark_writer.kafka.offsets import OffsetRange, Offsets, PartitionKey, plan_end_offsets, plan_ranges


def tail_ranges(
    start: Mapping[PartitionKey, int],
    earliest: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The offset ranges of the records after `start` (the table's end offsets) up to `latest`, one per partition
    with records; what retention or a truncation took fails (DataLossError) or is skipped, per the policy."""
    for problem in find_lost_partitions(start, latest):
        report_data_loss(f"Kafka data loss: {problem}", fail_on_data_loss)
    ranges = plan_ranges(start, plan_end_offsets(start, earliest, latest, None))
    kept = (
        apply_data_loss_policy(each, LogBounds(earliest[each.key]) if each.key in earliest else None, fail_on_data_loss)
        for each in ranges
    )
    return [each for each in kept if each is not None]


def with_table_ahead(
    start: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    look_again: Callable[[], Mapping[PartitionKey, int]],
) -> Offsets:
    """`latest` (taken before the table was loaded), raised to the table's end offsets where the table went past them:
    a commit between the two holds records beyond the read's start, and a look-up made now shows the log reaching
    that far. Where even the later look-up ends below the table, the log was truncated, which tail_ranges reports."""
    ahead = [key for key, offset in start.items() if key in latest and latest[key] < offset]
    if not ahead:
        return dict(latest)
    later = look_again()
    raised = dict(latest)
    for key in ahead:
        if later.get(key, -1) >= start[key]:
            raised[key] = start[key]
    return raised


def read_end_offsets(start: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]) -> Offsets:
    """Where a fresh read ends in each partition: the latest offset, or the table's end where the table went further
    (it committed records past the offsets the read began with)."""
    ends = dict(start)
    for key, offset in latest.items():
        ends[key] = max(offset, start.get(key, 0))
    return ends


def check_topics(table_end: Mapping[PartitionKey, int], topics: Collection[str]) -> None:
    """ValueError when the table's end offsets name topics that `topics` (the sink's --topic) does not: the records
    of those would be missed, so the flags are not the sink's."""
    unknown = sorted({key.topic for key in table_end} - set(topics))
    if unknown:
        raise ValueError(
            f"the table's snapshot holds records of topic(s) {unknown}, which --topic {sorted(topics)} does not "
            "name: give the sink's own --topic flags"
        )
