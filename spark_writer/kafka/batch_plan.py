"""The offset ranges of one batch, from its start and end offsets as Spark keeps them: what the Kafka sources plan
(kafka.source's ``partitions``) and what the writer plans on the driver for a stream of ranges
(spark_writer.sink.batch_ranges), one function so that both read the same records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_writer.kafka.data_loss import LogBounds, apply_data_loss_policy
from spark_writer.kafka.metadata import KafkaMetadata
from spark_writer.kafka.offsets import OffsetRange, batch_start_offsets, offsets_from_json, plan_ranges


def planned_ranges(
    start: Mapping[str, Any], end: Mapping[str, Any], metadata: KafkaMetadata, fail_on_data_loss: bool
) -> list[OffsetRange]:
    """The ranges of the batch from `start` to `end` (batch 0: its end holds its start), each cut to what the log
    still holds now (its start read from the broker): what is gone fails the batch, or is skipped with a warning
    (`fail_on_data_loss`).

    Raises DataLossError: records of the batch are gone and `fail_on_data_loss` is set."""
    ranges = plan_ranges(batch_start_offsets(start, end), offsets_from_json(end))
    earliest = metadata.earliest(offset_range.key for offset_range in ranges)
    planned = []
    for offset_range in ranges:
        bounds = LogBounds(earliest[offset_range.key]) if offset_range.key in earliest else None
        kept = apply_data_loss_policy(offset_range, bounds, fail_on_data_loss)
        if kept is not None:
            planned.append(kept)
    return planned
