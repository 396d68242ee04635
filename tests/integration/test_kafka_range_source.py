"""The Kafka source of offset ranges (spark_writer.kafka.range_source) against the Kafka source of records, on a real
broker and a real local Spark: the records a task reads from each range are exactly the records the other source's
batch holds, batch by batch, and a checkpoint written by either source is resumed by the other. Synchronisation is by
Spark's own primitives (``awaitTermination`` of an availableNow query), never by sleeping."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from spark_writer.kafka.offsets import offsets_covered
from spark_writer.kafka.options import SOURCE_NAME, parse_options
from spark_writer.kafka.range_source import RANGE_ARROW_SCHEMA, RANGE_SOURCE_NAME, range_records
from tests.fixtures.kafka_broker import ProducedRecord, produce_in_transaction, produce_keyed
from tests.fixtures.pipeline import order_source_options
from tests.integration.test_kafka_source import BatchCollector

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

QUERY_TIMEOUT_SECONDS = 120
TopicFactory = Callable[..., str]


@dataclass
class Batches(BatchCollector):
    """BatchCollector of either source, each batch's records sorted: a batch of ranges is read as the writer's tasks
    read it (range_records)."""

    options: dict[str, str] = field(default_factory=dict)

    def read(self, frame: DataFrame) -> list[ProducedRecord]:
        if "start_offset" not in frame.columns:
            return sorted(super().read(frame))
        ranges = frame.toArrow().cast(RANGE_ARROW_SCHEMA).to_batches()
        return sorted(
            ProducedRecord(partition, offset, key)
            for batch in range_records(ranges, parse_options(self.options))
            for partition, offset, key in zip(
                batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(),
                batch.column("key").to_pylist(),
                strict=True,
            )
        )


def run_available_now(spark: SparkSession, source: str, sink: Batches, checkpoint: Path) -> list[int]:
    """Run an availableNow query of `source` into `sink`; the offsets each batch covered, by its progress."""
    frame = spark.readStream.format(source).options(**sink.options).load()
    query = (
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_SECONDS)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"availableNow query did not finish within {QUERY_TIMEOUT_SECONDS}s"
    covered = []
    for progress in query.recentProgress:
        (source_progress,) = progress.sources
        start = None if source_progress.startOffset is None else json.loads(source_progress.startOffset)
        covered.append(offsets_covered(start, json.loads(source_progress.endOffset)))
    return covered


def produce_with_transactions(bootstrap: str, topic: str) -> list[ProducedRecord]:
    """Committed, aborted and plain records on three partitions; the committed and plain ones."""
    spread = [(index % 3, f"commit-1-{index}".encode()) for index in range(9)]
    committed = produce_in_transaction(bootstrap, topic, spread, commit=True)
    aborted = [(index % 3, f"abort-{index}".encode()) for index in range(9)]
    produce_in_transaction(bootstrap, topic, aborted, commit=False)
    committed += produce_keyed(bootstrap, topic, [(index % 2, f"plain-{index}".encode()) for index in range(20)])
    committed += produce_in_transaction(
        bootstrap, topic, [(2, f"commit-2-{index}".encode()) for index in range(7)], commit=True
    )
    return committed


def test_each_batch_of_ranges_reads_exactly_the_records_source_batch(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=3)
    produced = produce_with_transactions(kafka_bootstrap, topic)
    options = order_source_options(kafka_bootstrap, topic, 11)
    records, ranges = Batches(options=options), Batches(options=options)

    records_covered = run_available_now(spark, SOURCE_NAME, records, tmp_path / "records")
    ranges_covered = run_available_now(spark, RANGE_SOURCE_NAME, ranges, tmp_path / "ranges")

    assert len(records.batches) > 3, "the cap should split the topic into several batches"
    assert ranges.batches == records.batches
    assert ranges.records() == sorted(produced)
    # The offsets a batch covers count its records, and the transactions' markers and aborted records among them.
    assert ranges_covered == records_covered
    assert sum(ranges_covered) > len(produced)
    batches = [rows for _, rows in sorted(ranges.batches.items())]
    assert all(covered >= len(rows) for covered, rows in zip(ranges_covered, batches, strict=True))


@pytest.mark.parametrize(("first", "then"), [(SOURCE_NAME, RANGE_SOURCE_NAME), (RANGE_SOURCE_NAME, SOURCE_NAME)])
def test_a_checkpoint_of_one_source_is_resumed_by_the_other(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path, first: str, then: str
) -> None:
    """An upgraded job (or one whose settings now let its tasks read ranges) goes on from its checkpoint: the batch
    that failed is read again whole, under its id, and every record is read once."""
    topic = kafka_topic(partitions=2)
    produced = produce_keyed(kafka_bootstrap, topic, [(index % 2, f"first-{index}".encode()) for index in range(40)])
    options = order_source_options(kafka_bootstrap, topic, 10)
    crashing = Batches(fail_batch_once=2, options=options)

    with pytest.raises(StreamingQueryException, match="injected failure in batch 2"):
        run_available_now(spark, first, crashing, tmp_path)
    assert sorted(crashing.batches) == [0, 1]

    produced += produce_keyed(kafka_bootstrap, topic, [(index % 2, f"second-{index}".encode()) for index in range(30)])
    resumed = Batches(options=options)
    run_available_now(spark, then, resumed, tmp_path)

    assert min(resumed.batches) == 2, "the failed batch must be re-run under the same id"
    assert resumed.batches[2] == crashing.failed_attempt, "the re-run must read the same records"
    everything = sorted(crashing.records() + resumed.records())
    assert len(everything) == len(set(everything)), "a record was read twice"
    assert everything == sorted(produced)
