"""Reading one planned offset range on an executor: exactly its committed records, as Arrow batches.

Invariants:

* A range ``[start, end)`` is read with ``assign`` + seek at ``read_committed``
  isolation: no consumer group is joined, no offset is ever committed (Spark's
  checkpoint holds the offsets), so reading the same range again reads the same records.
* Aborted transactions and transaction markers leave holes in the offset sequence,
  so a range ends when the consumer's position reaches ``end``, not after
  ``end - start`` messages; no record at or past ``end`` is returned.
* When the log cannot deliver the rest of the range (records deleted below the
  position, a log that ends below it, a partition that no longer exists), the
  data-loss policy decides at once, rather than after the poll timeout.
"""

from __future__ import annotations

import bisect
import operator
import time
import uuid
from collections.abc import Iterator
from typing import Final

import pyarrow as pa
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from spark_writer.kafka.arrow import ArrowBatchBuilder
from spark_writer.kafka.data_loss import LogBounds, apply_data_loss_policy
from spark_writer.kafka.metadata import METADATA_TIMEOUT_SECONDS
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import SOURCE_NAME, KafkaSourceOptions

log = structlog.get_logger(__name__)

CONSUME_BATCH_SIZE: Final = 1_000
CONSUME_WAIT_SECONDS: Final = 0.5
# How long a range reader waits without a record before it looks at the partition's log itself.
LOG_CHECK_INTERVAL_SECONDS: Final = 1.0


def consumer_config(options: KafkaSourceOptions) -> dict[str, str | bool]:
    return {
        "group.id": f"{SOURCE_NAME}-{uuid.uuid4().hex}",  # never joined nor committed to
        **options.kafka_config,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }


def read_range(offset_range: OffsetRange, options: KafkaSourceOptions) -> Iterator[pa.RecordBatch]:
    """Arrow batches with the committed records of ``offset_range`` (may be empty)."""
    consumer = Consumer(consumer_config(options))
    try:
        builder = ArrowBatchBuilder(offset_range.topic, offset_range.partition)
        for messages in RangeReader(consumer, offset_range, options).messages():
            yield from builder.add(messages)
        if len(builder):
            yield builder.build()
    finally:
        consumer.close()


class RangeReader:
    """Reads exactly the committed records of one OffsetRange with an assigned consumer."""

    def __init__(self, consumer: Consumer, offset_range: OffsetRange, options: KafkaSourceOptions) -> None:
        self._consumer = consumer
        self._range = offset_range
        self._options = options
        self._position = offset_range.start
        self._checked_at = 0.0

    def messages(self) -> Iterator[list[Message]]:
        """The range's records, in offset order, as lists (those of one consume() call)."""
        self._seek(self._position)
        last_progress = time.monotonic()
        while self._position < self._range.end:
            # No more than the range still needs: consume() waits its whole timeout for a batch it cannot fill,
            # and at the end of a topic (a stream's every batch) the range's last records would wait 0.5 s.
            wanted = min(CONSUME_BATCH_SIZE, self._range.end - self._position)
            batch = self._consumer.consume(num_messages=wanted, timeout=CONSUME_WAIT_SECONDS)
            before = self._position
            accepted = self._accept(batch)
            if accepted:
                yield accepted
            now = time.monotonic()
            if self._position > before:
                last_progress = now
            elif now - max(last_progress, self._checked_at) >= LOG_CHECK_INTERVAL_SECONDS:
                # No record and no error for a while: a deleted partition, for one, says nothing.
                self._check_log()
            if self._position < self._range.end and self._position == before:
                self._check_stalled(last_progress)

    def _seek(self, offset: int) -> None:
        self._consumer.assign([TopicPartition(self._range.topic, self._range.partition, offset)])

    def _accept(self, batch: list[Message]) -> list[Message]:
        """The messages of a consume() call that the range still needs, in order, the position moved past them; the
        errors among them handled where they stand (an error may move the position: a seek, data loss)."""
        accepted: list[Message] = []
        start = 0
        for index in [index for index, message in enumerate(batch) if message.error() is not None]:
            accepted += self._in_range(batch[start:index])
            if self._position >= self._range.end:
                return accepted
            error = batch[index].error()
            assert error is not None
            self._handle_error(error, batch[index])
            start = index + 1
            if self._position >= self._range.end:
                return accepted
        accepted += self._in_range(batch[start:])
        return accepted

    def _in_range(self, messages: list[Message]) -> list[Message]:
        """Of these records (no error among them), those at or past the position and before the range's end; the
        position moved past them, or to the end once a record at or past it was seen."""
        offsets = [int(message.offset() or 0) for message in messages]
        if not all(map(operator.lt, offsets, offsets[1:])):
            return self._in_range_one_by_one(messages, offsets)
        first = bisect.bisect_left(offsets, self._position)
        past = bisect.bisect_left(offsets, self._range.end)
        if past < len(offsets):
            self._position = self._range.end
        elif past > first:
            self._position = offsets[past - 1] + 1
        return messages[first:past]

    def _in_range_one_by_one(self, messages: list[Message], offsets: list[int]) -> list[Message]:
        """_in_range of records whose offsets do not rise (a consumer never gives such, but the range is exact)."""
        taken = []
        for message, offset in zip(messages, offsets, strict=True):
            if offset >= self._range.end:
                self._position = self._range.end
                break
            if offset >= self._position:
                self._position = offset + 1
                taken.append(message)
        return taken

    def _handle_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            # End of the readable log: every committed record before it has been delivered.
            log_end = int(message.offset() or 0)
            self._position = max(self._position, min(log_end, self._range.end))
            if log_end < self._range.end:
                self._check_log()  # the log ends below the planned range
        elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            if not self._check_log():
                self._seek(self._position)
        else:
            raise KafkaException(error)

    def _check_log(self) -> bool:
        """Apply the data-loss policy to what the log can no longer deliver; True if the position moved."""
        self._checked_at = time.monotonic()
        known, bounds = self._log_bounds()
        if not known:
            return False
        remaining = OffsetRange(self._range.topic, self._range.partition, self._position, self._range.end)
        kept = apply_data_loss_policy(remaining, bounds, self._options.fail_on_data_loss)
        if kept == remaining:
            return False
        self._position = self._range.end if kept is None else kept.start
        if kept is not None:
            self._seek(kept.start)
        return True

    def _log_bounds(self) -> tuple[bool, LogBounds | None]:
        """(known, bounds): bounds None when the partition is gone; not known when the broker cannot tell now."""
        topic, partition = self._range.topic, self._range.partition
        try:
            cluster = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_SECONDS)
            metadata = cluster.topics.get(topic)
            if metadata is None or (
                metadata.error is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            ):
                return True, None
            if metadata.error is not None:
                return False, None
            if partition not in metadata.partitions:
                return True, None
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_SECONDS, cached=False
            )
        except KafkaException as error:
            log.debug("kafka_log_bounds_unknown", topic=topic, partition=partition, error=str(error))
            return False, None
        return True, LogBounds(int(low), int(high))

    def _check_stalled(self, last_progress: float) -> None:
        waited_ms = (time.monotonic() - last_progress) * 1000
        if waited_ms > self._options.poll_timeout_ms:
            raise TimeoutError(
                f"no progress reading {self._range.topic}-{self._range.partition} at offset {self._position} "
                f"(range [{self._range.start}, {self._range.end})) for {waited_ms:.0f} ms; "
                "raise kafkaConsumer.pollTimeoutMs if the cluster is just slow"
            )
