"""The ranges of a batch of a stream of offset ranges (spark_writer.kafka.range_source), planned on the driver: what
the writer's tasks read, from the batch's offsets in Spark's offset log, planned as the source plans them
(kafka.batch_plan.planned_ranges: the same caps, topic lives and data-loss policy).

Why not the batch's own DataFrame: running it takes a Spark task and a Python worker per range for one row each
(the source's read, which imports pyarrow and pandas in each new worker), before the writer's tasks can start, and
at batch 0 a Python process of Spark's to plan the read (bench/results/latest.md, optimisation 28). The batch's
DataFrame is not run: Spark's progress counts no input rows for it (``numInputRows`` 0), and the offsets a batch
covers (``kafka.offsets.offsets_covered`` of its progress's offsets) count its records.

The ranges are a DataFrame of local rows: Spark spreads them over at most as many tasks as it has cores (its default
parallelism), each task reading its ranges one after the other.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame

from spark_writer.kafka.batch_plan import planned_ranges
from spark_writer.kafka.metadata import KafkaMetadata
from spark_writer.kafka.offsets import START_KEY
from spark_writer.kafka.options import KafkaSourceOptions
from spark_writer.kafka.range_source import RANGE_SCHEMA
from spark_writer.sink.checkpoint import NO_OFFSET, SparkCheckpoint


class BatchRanges:
    """The ranges of each batch of one query, read with `options` (the query's source's), from its checkpoint."""

    def __init__(self, options: KafkaSourceOptions, checkpoint: SparkCheckpoint) -> None:
        self._options = options
        self._checkpoint = checkpoint
        self._metadata: KafkaMetadata | None = None

    def frame(self, batch: DataFrame, batch_id: int) -> DataFrame:
        """The ranges of batch `batch_id` (whose DataFrame of ranges is `batch`), one row each.

        `batch` itself for a batch 0 whose end offsets do not hold its start (a checkpoint of a source older than
        that record): only the source knows its start then.

        Raises ValueError: the query has other sources besides the stream of ranges; DataLossError: records of the
        batch are gone and the source's options say to fail."""
        end = self._end_offsets(batch_id)
        if batch_id == 0 and START_KEY not in end:
            return batch
        start = {} if batch_id == 0 else self._end_offsets(batch_id - 1)
        if self._metadata is None:
            self._metadata = KafkaMetadata(self._options)
        ranges = planned_ranges(start, end, self._metadata, self._options.fail_on_data_loss)
        rows = [(planned.topic, planned.partition, planned.start, planned.end) for planned in ranges]
        return batch.sparkSession.createDataFrame(rows, RANGE_SCHEMA)

    def _end_offsets(self, batch_id: int) -> dict[str, Any]:
        lines = self._checkpoint.source_end_offsets(batch_id)
        if len(lines) != 1:
            raise ValueError(
                f"batch {batch_id} of the query has {len(lines)} sources in Spark's offset log: a stream of offset "
                "ranges must be its only source"
            )
        return {} if lines[0] == NO_OFFSET else dict(json.loads(lines[0]))
