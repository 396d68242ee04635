"""The Kafka Python data source against a real broker and a real local Spark.

Every test compares the exact set of (partition, offset, key) that Spark read with
what the producer acknowledged. Synchronisation is by Spark's own primitives
(``awaitTermination`` of an availableNow query, ``processAllAvailable``), never by sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamReader
from structlog.testing import capture_logs

from spark_writer.job_failures import ExitCode, failure_of
from spark_writer.kafka.data_loss import DataLossError
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import SOURCE_NAME, parse_options
from spark_writer.kafka.range_reader import read_range
from spark_writer.kafka.source import KafkaStreamReader
from tests.fixtures.kafka_broker import (
    ADMIN_TIMEOUT_SECONDS,
    ProducedRecord,
    add_partitions,
    create_topic,
    delete_records_before,
    delete_topics,
    produce_in_transaction,
    produce_keyed,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

QUERY_TIMEOUT_SECONDS = 120
TopicFactory = Callable[..., str]
BatchSink = Callable[[DataFrame, int], None]


@dataclass
class BatchCollector:
    """foreachBatch sink keeping what every micro-batch attempt saw; can fail one batch once."""

    fail_batch_once: int | None = None
    batches: dict[int, list[ProducedRecord]] = field(default_factory=dict)
    failed_attempt: list[ProducedRecord] = field(default_factory=list)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = self.read(frame)
        if batch_id == self.fail_batch_once:
            self.fail_batch_once = None
            self.failed_attempt = rows
            raise RuntimeError(f"injected failure in batch {batch_id}")
        self.batches[batch_id] = rows

    def records(self) -> list[ProducedRecord]:
        return sorted(record for rows in self.batches.values() for record in rows)

    def read(self, frame: DataFrame) -> list[ProducedRecord]:
        """The batch's records."""
        return [ProducedRecord(row.partition, row.offset, row.key) for row in frame.collect()]


def kafka_stream(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataStreamReader:
    reader = spark.readStream.format(SOURCE_NAME).option("kafka.bootstrap.servers", bootstrap)
    for key, value in {"subscribe": topic, "startingOffsets": "earliest", **options}.items():
        reader = reader.option(key, value)
    return reader


def start(
    reader: DataStreamReader,
    sink: BatchSink,
    checkpoint: Path,
    available_now: bool,
) -> StreamingQuery:
    writer = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    return (writer.trigger(availableNow=True) if available_now else writer).start()


def run_available_now(reader: DataStreamReader, sink: BatchSink, checkpoint: Path) -> None:
    query = start(reader, sink, checkpoint, available_now=True)
    finished = query.awaitTermination(QUERY_TIMEOUT_SECONDS)
    if not finished:
        query.stop()
        pytest.fail(f"availableNow query did not finish within {QUERY_TIMEOUT_SECONDS}s")


def spread(partitions: int, count: int, prefix: str) -> list[tuple[int, bytes]]:
    return [(index % partitions, f"{prefix}-{index}".encode()) for index in range(count)]


def assert_exactly(read: list[ProducedRecord], expected: Iterable[ProducedRecord]) -> None:
    expected_sorted = sorted(expected)
    assert len(read) == len(set(read)), "duplicates were read"
    assert read == expected_sorted


def test_available_now_reads_every_record_once_in_capped_batches(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=3)
    skewed = [(0, b"p0-%d" % i) for i in range(60)] + [(1, b"p1-%d" % i) for i in range(30)]
    produced = produce_keyed(kafka_bootstrap, topic, [*skewed, *((2, b"p2-%d" % i) for i in range(10))])
    sink = BatchCollector()

    run_available_now(kafka_stream(spark, kafka_bootstrap, topic, maxOffsetsPerTrigger="25"), sink, tmp_path)

    # Every share is at least one record here, so no batch exceeds the cap.
    assert all(len(rows) <= 25 for rows in sink.batches.values())
    read_so_far: list[ProducedRecord] = []
    for _, rows in sorted(sink.batches.items()):
        waiting = {r.partition for r in produced if r not in read_so_far}
        assert {r.partition for r in rows} == waiting, "a partition with a backlog got nothing"
        read_so_far += rows
    assert_exactly(sink.records(), produced)


def test_rows_carry_topic_value_timestamp_and_headers(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, [(0, b"k")], value=b"payload")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=None, value=None, partition=0, headers=[("trace", b"abc"), ("empty", None)])
    assert producer.flush(ADMIN_TIMEOUT_SECONDS) == 0
    rows: list[Any] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        rows.extend(frame.orderBy("offset").collect())

    run_available_now(kafka_stream(spark, kafka_bootstrap, topic), collect, tmp_path)

    plain, with_headers = rows
    assert (plain.key, plain.value, plain.topic, plain.partition, plain.offset) == (
        b"k",
        b"payload",
        topic,
        0,
        0,
    )
    assert plain.timestamp is not None
    assert plain.timestampType == 0
    assert plain.headers is None
    assert (with_headers.key, with_headers.value) == (None, None)
    assert [(h.key, h.value) for h in with_headers.headers] == [("trace", b"abc"), ("empty", None)]


def test_starting_offsets_json_with_explicit_earliest_and_latest(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=3)
    produced = produce_keyed(kafka_bootstrap, topic, spread(3, 30, "j"))
    starting = json.dumps({topic: {"0": 4, "1": -2, "2": -1}})
    sink = BatchCollector()

    run_available_now(kafka_stream(spark, kafka_bootstrap, topic, startingOffsets=starting), sink, tmp_path)

    expected = [r for r in produced if (r.partition == 0 and r.offset >= 4) or r.partition == 1]
    assert_exactly(sink.records(), expected)


def test_starting_offsets_latest_reads_only_new_records(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=2)
    produce_keyed(kafka_bootstrap, topic, spread(2, 10, "old"))
    sink = BatchCollector()
    query = start(
        kafka_stream(spark, kafka_bootstrap, topic, startingOffsets="latest"),
        sink,
        tmp_path,
        available_now=False,
    )
    try:
        query.processAllAvailable()
        assert sink.records() == []
        new = produce_keyed(kafka_bootstrap, topic, spread(2, 6, "new"))
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly(sink.records(), new)


def test_partition_added_mid_stream_is_read_from_its_start(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=1)
    produced = produce_keyed(kafka_bootstrap, topic, spread(1, 5, "before"))
    sink = BatchCollector()
    query = start(kafka_stream(spark, kafka_bootstrap, topic), sink, tmp_path, available_now=False)
    try:
        query.processAllAvailable()
        assert_exactly(sink.records(), produced)
        add_partitions(kafka_bootstrap, topic, total=3)
        produced += produce_keyed(kafka_bootstrap, topic, spread(3, 12, "after"))
        query.processAllAvailable()
    finally:
        query.stop()
    assert {r.partition for r in produced} == {0, 1, 2}
    assert_exactly(sink.records(), produced)


def test_restart_from_checkpoint_replays_failed_batch_and_continues(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=2)
    produced = produce_keyed(kafka_bootstrap, topic, spread(2, 40, "first"))
    reader = kafka_stream(spark, kafka_bootstrap, topic, maxOffsetsPerTrigger="10")
    crashing = BatchCollector(fail_batch_once=2)

    with pytest.raises(StreamingQueryException, match="injected failure in batch 2"):
        run_available_now(reader, crashing, tmp_path)
    assert sorted(crashing.batches) == [0, 1]

    produced += produce_keyed(kafka_bootstrap, topic, spread(2, 30, "second"))
    resumed = BatchCollector()
    run_available_now(reader, resumed, tmp_path)

    assert min(resumed.batches) == 2, "the failed batch must be re-run under the same id"
    assert sorted(resumed.batches[2]) == sorted(crashing.failed_attempt), "replay must read the same records"
    everything = sorted(crashing.records() + resumed.records())
    assert_exactly(everything, produced)


def test_fail_on_data_loss_fails_then_skips_deleted_records(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=1)
    first = produce_keyed(kafka_bootstrap, topic, spread(1, 10, "kept"))
    sink = BatchCollector()
    run_available_now(kafka_stream(spark, kafka_bootstrap, topic), sink, tmp_path)
    assert_exactly(sink.records(), first)

    unread = produce_keyed(kafka_bootstrap, topic, spread(1, 10, "unread"))
    delete_records_before(kafka_bootstrap, topic, partition=0, offset=15)

    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), BatchCollector(), tmp_path)
    message = str(failure.value)
    for expected in (
        repr(topic),
        "partition 0",
        "[10, 20)",
        "earliest available offset is 15",
        "failOnDataLoss",
    ):
        assert expected in message
    # What sink-writer makes of it (the planner's Python exception inside Spark's report): one line, bad data.
    ended = failure_of(failure.value)
    assert ended.exit_code is ExitCode.BAD_DATA
    assert "earliest available offset is 15" in ended.cause and "--no-fail-on-data-loss" in ended.cause

    skipping = BatchCollector()
    run_available_now(kafka_stream(spark, kafka_bootstrap, topic, failOnDataLoss="false"), skipping, tmp_path)
    assert_exactly(skipping.records(), [r for r in unread if r.offset >= 15])


def test_records_deleted_after_planning_are_detected_while_reading(
    kafka_bootstrap: str, kafka_topic: TopicFactory
) -> None:
    topic = kafka_topic(partitions=1)
    produced = produce_keyed(kafka_bootstrap, topic, spread(1, 10, "r"))
    delete_records_before(kafka_bootstrap, topic, partition=0, offset=6)
    planned_before_deletion = OffsetRange(topic, 0, 2, 10)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "subscribe": topic,
        "kafkaConsumer.pollTimeoutMs": "20000",
    }

    with pytest.raises(DataLossError, match="earliest available offset is 6"):
        list(read_range(planned_before_deletion, parse_options(options)))

    batches = list(read_range(planned_before_deletion, parse_options({**options, "failOnDataLoss": "false"})))
    read = [
        ProducedRecord(0, offset, key)
        for b in batches
        for offset, key in zip(b["offset"].to_pylist(), b["key"].to_pylist(), strict=True)
    ]
    assert_exactly(read, [r for r in produced if r.offset >= 6])


def test_aborted_and_open_transactions_are_not_read(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=2)
    committed = produce_in_transaction(kafka_bootstrap, topic, spread(2, 6, "commit-1"), commit=True)
    aborted = produce_in_transaction(kafka_bootstrap, topic, spread(2, 6, "abort"), commit=False)
    committed += produce_in_transaction(kafka_bootstrap, topic, spread(2, 6, "commit-2"), commit=True)
    committed += produce_keyed(kafka_bootstrap, topic, spread(2, 4, "plain"))
    open_transaction = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"open-{topic}"})
    open_transaction.init_transactions(ADMIN_TIMEOUT_SECONDS)
    open_transaction.begin_transaction()
    for partition, key in spread(2, 4, "pending"):
        open_transaction.produce(topic, key=key, value=b"tx", partition=partition)
    assert open_transaction.flush(ADMIN_TIMEOUT_SECONDS) == 0
    reader = kafka_stream(spark, kafka_bootstrap, topic, maxOffsetsPerTrigger="7")
    sink = BatchCollector()

    run_available_now(reader, sink, tmp_path)

    assert len(aborted) == 6
    assert not {r.key for r in aborted} & {r.key for r in sink.records()}
    assert_exactly(sink.records(), committed)

    open_transaction.commit_transaction(ADMIN_TIMEOUT_SECONDS)
    after_commit = BatchCollector()
    run_available_now(reader, after_commit, tmp_path)
    assert sorted(r.key for r in after_commit.records()) == sorted(key for _, key in spread(2, 4, "pending"))


def test_latest_start_is_resolved_once_for_planning_running_and_rerunning_batch_0(
    kafka_bootstrap: str, kafka_topic: TopicFactory
) -> None:
    """The reader driven as Spark drives it: initialOffset when batch 0 is planned, again when it runs and when
    it runs again after a crash. Records that arrive in between must neither be skipped nor read twice."""
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, spread(1, 3, "before"))
    options = parse_options(
        {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "startingOffsets": "latest"}
    )
    reader = KafkaStreamReader(options)

    planned_start = reader.initialOffset()
    arrived = produce_keyed(kafka_bootstrap, topic, spread(1, 5, "during-planning"))
    end = reader.latestOffset(planned_start, reader.getDefaultReadLimit())
    produce_keyed(kafka_bootstrap, topic, spread(1, 5, "after-planning"))
    ran = reader.partitions(reader.initialOffset(), end)
    rerun_after_crash = KafkaStreamReader(options)  # a new driver: nothing kept in memory
    reran = rerun_after_crash.partitions(rerun_after_crash.initialOffset(), end)

    # Resolved when batch 0 was first planned (as Spark's own Kafka source does): offset 3.
    batch_0 = [OffsetRange(topic, 0, 3, 8)]
    assert [record.offset for record in arrived] == [3, 4, 5, 6, 7]
    assert [p.offset_range for p in ran] == batch_0, f"batch 0 was planned as [3, 8) but ran {ran}"
    assert [p.offset_range for p in reran] == batch_0, f"the re-run of batch 0 read {reran}"


def test_rerun_of_batch_0_after_retention_applies_fail_on_data_loss(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, spread(1, 10, "r"))
    crashing = BatchCollector(fail_batch_once=0)
    with pytest.raises(StreamingQueryException, match="injected failure in batch 0"):
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), crashing, tmp_path)
    assert len(crashing.failed_attempt) == 10
    delete_records_before(kafka_bootstrap, topic, partition=0, offset=5)

    with pytest.raises(StreamingQueryException, match=r"\[0, 10\).*earliest available offset is 5"):
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), BatchCollector(), tmp_path)


def test_topic_deleted_between_planning_and_reading_follows_the_data_loss_policy(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(kafka_bootstrap, partitions=1)
    produce_keyed(kafka_bootstrap, topic, spread(1, 10, "gone"))
    with pytest.raises(StreamingQueryException, match="injected failure in batch 0"):
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), BatchCollector(fail_batch_once=0), tmp_path)
    delete_topics(kafka_bootstrap, [topic])

    # Spark re-runs batch 0 with the offsets it planned: the data-loss error, on every restart, says what to do.
    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), BatchCollector(), tmp_path)
    for expected in (f"{topic}", "partition 0", "[0, 10)", "no longer exists", "failOnDataLoss=false"):
        assert expected in str(failure.value)

    skipping = BatchCollector()
    run_available_now(kafka_stream(spark, kafka_bootstrap, topic, failOnDataLoss="false"), skipping, tmp_path)
    assert skipping.records() == []

    # The topic is created again: it is new, read from its start.
    create_topic(kafka_bootstrap, partitions=1, name=topic)
    try:
        again = produce_keyed(kafka_bootstrap, topic, spread(1, 4, "again"))
        resumed = BatchCollector()
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), resumed, tmp_path)
        assert_exactly(resumed.records(), again)
    finally:
        delete_topics(kafka_bootstrap, [topic])


def test_deleted_partition_while_reading_follows_the_data_loss_policy(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, partitions=1)
    produce_keyed(kafka_bootstrap, topic, spread(1, 5, "r"))
    delete_topics(kafka_bootstrap, [topic])
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaConsumer.pollTimeoutMs": "10000"}
    planned = OffsetRange(topic, 0, 0, 5)

    with pytest.raises(DataLossError, match=r"\[0, 5\).*no longer exists.*failOnDataLoss=false"):
        list(read_range(planned, parse_options(options)))
    with capture_logs() as logs:
        assert list(read_range(planned, parse_options({**options, "failOnDataLoss": "false"}))) == []
    skipped = [line for line in logs if line["event"] == "kafka_data_loss_skipped"]
    assert len(skipped) == 1
    assert "[0, 5)" in skipped[0]["message"]


def test_range_above_the_log_end_follows_the_data_loss_policy_without_waiting(
    kafka_bootstrap: str, kafka_topic: TopicFactory
) -> None:
    """The log ends below the planned range (truncated, or the topic re-created): no spinning until a timeout."""
    topic = kafka_topic(partitions=1)
    produced = produce_keyed(kafka_bootstrap, topic, spread(1, 5, "r"))
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaConsumer.pollTimeoutMs": "10000"}

    with pytest.raises(DataLossError, match=r"\[5, 9\).*log ends at offset 5"):
        list(read_range(OffsetRange(topic, 0, 3, 9), parse_options(options)))
    with capture_logs() as logs:
        batches = list(read_range(OffsetRange(topic, 0, 3, 9), parse_options({**options, "failOnDataLoss": "false"})))
    assert [offset for b in batches for offset in b["offset"].to_pylist()] == [r.offset for r in produced][3:]
    skipped = [line for line in logs if line["event"] == "kafka_data_loss_skipped"]
    assert len(skipped) == 1, skipped
    assert "[5, 9)" in skipped[0]["message"]
    assert not [line for line in logs if line["log_level"] in ("warning", "error") and line not in skipped]


def test_a_topic_created_again_with_more_records_than_were_read_is_read_from_its_start(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Deleted and created again between two runs, the topic grew past the offsets read: its new life is read whole
    (the broker reports no topic id: its log start, below the one read before, tells the lives apart)."""
    topic = create_topic(kafka_bootstrap, partitions=1)
    try:
        first = produce_keyed(kafka_bootstrap, topic, spread(1, 10, "first"))
        delete_records_before(kafka_bootstrap, topic, 0, 4)  # retention: the first life's log starts at 4
        read_first = BatchCollector()
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic), read_first, tmp_path)
        assert_exactly(read_first.records(), first[4:])

        delete_topics(kafka_bootstrap, [topic])
        create_topic(kafka_bootstrap, partitions=1, name=topic)
        again = produce_keyed(kafka_bootstrap, topic, spread(1, 20, "again"))

        with pytest.raises(StreamingQueryException) as failure:
            run_available_now(kafka_stream(spark, kafka_bootstrap, topic), BatchCollector(), tmp_path)
        assert "deleted and created again" in str(failure.value) and "failOnDataLoss=false" in str(failure.value)

        read_again = BatchCollector()
        run_available_now(kafka_stream(spark, kafka_bootstrap, topic, failOnDataLoss="false"), read_again, tmp_path)
        assert_exactly(read_again.records(), again)
    finally:
        delete_topics(kafka_bootstrap, [topic])
