"""Kafka as a PySpark streaming source, without Spark's Kafka connector jar: the Spark side.

Why: Spark's own Kafka source needs its connector jar (and Maven to fetch it),
which this project must not depend on. ``spark.readStream.format("sink_coordinator_kafka")``
is a Python Data Source (``pyspark.sql.datasource``) on confluent-kafka, in parts:

* ``kafka_options``: the options, parsed and validated (and the defaults);
* ``kafka_offsets``: the offset arithmetic, pure (offsets JSON, starting offsets,
  the per-trigger cap, ranges), and ``kafka_data_loss``: the failOnDataLoss policy;
* ``kafka_metadata``: the driver's look-ups (partitions, offsets) with retries;
* ``kafka_range_reader``: an executor reading one range, into ``kafka_arrow``'s batches;
* this module: the DataSource and its stream reader, which Spark drives.

What the reader guarantees Spark:

* Offsets are plain JSON ``{topic: {partition: next_offset}}``. The reader hands
  them to Spark from ``initialOffset``/``latestOffset`` and Spark keeps them in its
  checkpoint; the reader itself stores nothing. A micro-batch is therefore fully
  described by its (start, end) offsets, and Spark can re-run an unfinished batch
  after a crash and get exactly the same records - the basis of exactly-once.
* Batch 0 has no stored start in Spark's checkpoint, and Spark asks
  ``initialOffset`` again each time it plans, runs or re-runs it. The starting
  offsets (``earliest``/``latest`` turned into numbers) are therefore resolved
  once, and batch 0's end offsets carry them under ``$start``: Spark writes them to
  ``offsets/0`` before the batch runs, so a re-run reads exactly the same records
  (and ``failOnDataLoss`` applies to them).
* Every micro-batch reads explicit ranges ``[start, end)``, one Spark task per
  topic-partition, committed records only.
* Every batch's end offsets say which life of each topic they are offsets of
  (``$incarnations``: its topic id, or its log starts): a topic deleted and created
  again between two batches is data loss (``failOnDataLoss``), and its new life is
  read from its start, in the batch planned and in any re-run of it.
* Partitions added to a subscribed topic are discovered on every trigger and read
  from their start.

Where it differs from Spark's Kafka source (``format("kafka")``), on purpose:

* ``startingOffsets`` defaults to ``earliest`` (``kafka_options.DEFAULT_STARTING_OFFSETS``,
  shared with the sink-writer job); Spark's streaming default is ``latest``.
* ``maxOffsetsPerTrigger`` is split as Spark splits it, in proportion to the
  backlogs with at least one record per waiting partition, but the records Spark's
  rounding leaves under the cap are handed out too, so a batch holds exactly the cap
  (``kafka_offsets.spread_max_rows`` says how the two compare).
* Records are always read at ``read_committed`` (Spark's default is
  ``read_uncommitted``) and always carry the ``headers`` column (Spark: with
  ``includeHeaders=true``). A range is never split into several tasks (Spark's
  ``minPartitions``), and only ``subscribe`` names topics: the Spark options that
  would ask for these are refused (``kafka_options.UNSUPPORTED_OPTIONS``), not ignored.
* Batch 0's end offsets hold ``$start`` where Spark keeps its starting offsets in
  ``sources/0/0``: a checkpoint of one source cannot be resumed by the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
import structlog
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_writer.kafka.data_loss import LogBounds, apply_data_loss_policy, find_lost_partitions, report_data_loss
from spark_writer.kafka.metadata import KafkaMetadata
from spark_writer.kafka.offsets import (
    OffsetRange,
    Offsets,
    batch_start_offsets,
    cap_to_target,
    from_new_lives,
    incarnations_from_json,
    incarnations_of,
    initial_offsets_json,
    offsets_from_json,
    offsets_to_json,
    plan_end_offsets,
    plan_ranges,
    planned_end_json,
    replaced_topics,
    resolve_starting_offsets,
)
from spark_writer.kafka.options import SOURCE_NAME, KafkaSourceOptions, parse_options
from spark_writer.kafka.planner_end import end_quietly_when_spark_closes
from spark_writer.kafka.range_reader import read_range
from spark_writer.worker_logging import configure_worker_logging

# The source's rows, as Spark's Kafka source gives them with includeHeaders=true (kafka.arrow builds their batches).
KAFKA_SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
    ]
)

log = structlog.get_logger(__name__)


def max_rows_of(limit: ReadLimit) -> int | None:
    """Row cap of a Spark read limit; None means read everything available."""
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    if not isinstance(limit, ReadAllAvailable):
        log.warning("kafka_read_limit_ignored", limit=repr(limit))
    return None


class KafkaInputPartition(InputPartition):
    """One Spark task: one topic-partition's offset range."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)

    @property
    def offset_range(self) -> OffsetRange:
        assert isinstance(self.value, OffsetRange)
        return self.value


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; reads them on executors.

    The planning methods run in one long-lived Python process on the driver and
    share a lazily created AdminClient. The reader object is also pickled to the
    executors for ``read``, so the client is dropped when pickling.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._metadata: KafkaMetadata | None = None
        self._available_now_target: Offsets | None = None
        self._last_seen_latest: Offsets | None = None
        self._starting: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_metadata"] = None
        return state

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self._options)
        return self._metadata

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's API)
        """The starting offsets, resolved once per reader (Spark asks again when it runs batch 0).

        Only the answer Spark plans batch 0 with counts: ``latestOffset`` copies it
        into batch 0's end offsets, which Spark writes to its offset log before the
        batch runs, and ``partitions`` reads batch 0 from there. A restart (a new
        reader resolving again) therefore re-runs batch 0 from the same offsets.
        """
        if self._starting is None:
            keys = self.metadata.partitions(self._options.topics)
            earliest, latest = self.metadata.earliest(keys), self.metadata.latest(keys)
            self._starting = resolve_starting_offsets(self._options.starting_offsets, earliest, latest)
            log.info("kafka_initial_offsets", offsets=offsets_to_json(self._starting))
        return initial_offsets_json(self._starting)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 (Spark's API)
        if self._options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark's API)
        keys = self.metadata.partitions(self._options.topics)
        self._available_now_target = self.metadata.latest(keys)
        log.info("kafka_available_now_target", offsets=offsets_to_json(self._available_now_target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802 (Spark's API)
        start_offsets = batch_start_offsets(start)
        keys = self.metadata.partitions(self._options.topics, known={key.topic for key in start_offsets})
        latest = self.metadata.latest(keys)
        earliest = self.metadata.earliest(latest)
        topic_ids = self.metadata.topic_ids({key.topic for key in latest})
        replaced = replaced_topics(incarnations_from_json(start), incarnations_of(topic_ids, earliest))
        for topic in replaced:
            report_data_loss(
                f"Kafka data loss: topic {topic!r} was deleted and created again since the last batch was planned: "
                "the records its earlier life held after the offsets read were never read; its new life is read "
                "from its start",
                self._options.fail_on_data_loss,
            )
        now = incarnations_of(topic_ids, earliest, replaced)
        start_offsets = from_new_lives(start_offsets, replaced, latest, now)
        self._last_seen_latest = latest
        self._check_no_lost_partitions(start_offsets, latest)
        if self._available_now_target is not None:
            latest = cap_to_target(latest, self._available_now_target, start_offsets)
        end = plan_end_offsets(start_offsets, earliest, latest, max_rows_of(limit))
        return planned_end_json(start, end, now)

    def _check_no_lost_partitions(self, start: Offsets, latest: Offsets) -> None:
        for problem in find_lost_partitions(start, latest):
            report_data_loss(f"Kafka data loss: {problem}", self._options.fail_on_data_loss)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 (Spark's API)
        return None if self._last_seen_latest is None else offsets_to_json(self._last_seen_latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        ranges = plan_ranges(batch_start_offsets(start, end), offsets_from_json(end))
        earliest = self.metadata.earliest(r.key for r in ranges)
        planned = []
        for offset_range in ranges:
            bounds = LogBounds(earliest[offset_range.key]) if offset_range.key in earliest else None
            kept = apply_data_loss_policy(offset_range, bounds, self._options.fail_on_data_loss)
            if kept is not None:
                planned.append(KafkaInputPartition(kept))
        log.debug("kafka_batch_planned", ranges=[str(p.offset_range) for p in planned])
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition), f"unexpected partition {partition!r}"
        return read_range(partition.offset_range, self._options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        self._metadata = None


class KafkaDataSource(DataSource):
    """``spark.readStream.format("sink_coordinator_kafka")``: Kafka records, Spark Kafka source columns."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802 (Spark's API)
        # Spark plans the stream in a Python process of its own, not forked from the worker daemon: it gets the
        # job's log level here (a no-op where the process configured logging itself, as a driver does).
        configure_worker_logging()
        end_quietly_when_spark_closes()
        return self.kafka_reader(parse_options(self.options))

    def kafka_reader(self, options: KafkaSourceOptions) -> KafkaStreamReader:
        """The stream reader of these options (a subclass may read more per record: mutations.keyed_source)."""
        return KafkaStreamReader(options)
