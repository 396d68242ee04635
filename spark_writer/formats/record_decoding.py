"""What the sink's tasks (and a fresh read, spark_writer.fresh) make of a batch of Kafka records: table rows, by a
decoder, and what becomes of the records that do not fit (fail, null, dead-letter), the same for every format.

Every decoder (``json_decoding.JsonDecoder``, ``registry_decoding.RegistryDecoder``, an upsert or change stream's
``mutations.decoding.MutationDecoder``) gives a ``DecodedBatch``; ``RecordDecoding`` holds a decoder with the policy
and is shipped with each task, whose ``RecordDecodingTask`` counts what it read. A raw sink decodes nothing: it writes
the Kafka columns of ``RAW_COLUMNS``. Pure: no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Protocol

import pyarrow as pa
import structlog

from spark_writer.formats.dead_letters import DeadLetterProducer, DeadLetterTarget
from spark_writer.formats.decoded_batch import REASON_COLUMN, DecodedBatch
from spark_writer.kafka.positions import TopicPartition, latest_timestamps, merge_latest

log = structlog.get_logger(__name__)

# What `--format raw` writes of each record: the Kafka columns as they are (key and value as bytes).
RAW_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp")


class BadRecordPolicy(StrEnum):
    """What happens to a record that does not fit the schema."""

    FAIL = "fail"  # the batch fails, naming topic, partition, offset and why
    NULL = "null"  # written with null columns, counted
    DEAD_LETTER = "dead-letter"  # sent to a dead-letter topic instead of the table, counted


class BadRecordError(ValueError):
    """A record does not fit the schema and the policy is to fail."""


# The epoch properties (PreCommit) with the number of records of the batch that did not fit the schema, what
# became of them (the policy: null, dead-letter), and the Kafka records the batch read: the verifier holds the rows
# of an epoch's files to the records read less those sent to the dead-letter topic.
BAD_RECORDS_PROPERTY: Final = "sink-coordinator.bad-records"
ON_BAD_RECORD_PROPERTY: Final = "sink-coordinator.on-bad-record"
RECORDS_READ_PROPERTY: Final = "sink-coordinator.records-read"
ON_BAD_RECORD_HINT: Final = (
    "Fix the record or the schema, or run with --on-bad-record null (written as nulls, counted) "
    "or --on-bad-record dead-letter --dead-letter-topic T"
)


class BatchDecoder(Protocol):
    """Kafka record batches into table rows (json_decoding.JsonDecoder, registry_decoding.RegistryDecoder)."""

    @property
    def output_schema(self) -> pa.Schema: ...

    @property
    def schema_name(self) -> str:
        """What the records must fit, for messages: "the JSON schema"."""
        ...

    def decode(self, kafka: pa.RecordBatch) -> DecodedBatch: ...


@dataclass(frozen=True)
class DecodingSummary:
    """What a task's decoding saw besides the rows: records that did not fit, the latest record timestamp (ms)
    of each Kafka topic-partition it read, and how many Kafka records it read."""

    bad_records: int = 0
    latest_timestamps: Mapping[tuple[str, int], int] = field(default_factory=dict)
    records_read: int = 0


@dataclass(frozen=True)
class RecordDecoding:
    """Kafka values into table rows on the executors, and what becomes of the records that do not fit.

    Shipped with each task; `start` gives the task its own state (counts, a dead-letter producer).
    """

    decoder: BatchDecoder
    policy: BadRecordPolicy = BadRecordPolicy.FAIL
    dead_letters: DeadLetterTarget | None = None

    def __post_init__(self) -> None:
        if (self.policy is BadRecordPolicy.DEAD_LETTER) != (self.dead_letters is not None):
            raise ValueError("a dead-letter topic is needed with on_bad_record=dead-letter, and only then")

    def start(self, *, send_dead_letters: bool = True) -> RecordDecodingTask:
        """A task's decoding; without `send_dead_letters` (a reader's, not the sink's: spark_writer.fresh) the records
        the dead-letter policy takes are left out of the rows and sent nowhere."""
        return RecordDecodingTask(self, send_dead_letters=send_dead_letters)


class RecordDecodingTask:
    """One task's decoding: rows batch by batch, then `finish` (dead letters acknowledged, records counted)."""

    def __init__(self, decoding: RecordDecoding, *, send_dead_letters: bool = True) -> None:
        self._decoding = decoding
        self._dead_letters = (
            DeadLetterProducer(decoding.dead_letters)
            if decoding.dead_letters is not None and send_dead_letters
            else None
        )
        self.bad_records = 0
        self.records_read = 0
        self._latest: list[dict[TopicPartition, int]] = []

    def rows(self, batch: pa.RecordBatch) -> pa.Table:
        """The table rows of one batch of Kafka records; BadRecordError for a record that does not fit under FAIL."""
        self._latest.append(latest_timestamps(batch))
        self.records_read += batch.num_rows
        decoded = self._decoding.decoder.decode(batch)
        misfits = decoded.misfits.num_rows
        if not misfits:
            return decoded.rows
        self.bad_records += misfits
        policy = self._decoding.policy
        if policy is BadRecordPolicy.FAIL:
            first = decoded.misfits.slice(0, 1).to_pylist()[0]
            raise BadRecordError(
                f"a Kafka record does not fit {self._decoding.decoder.schema_name}: topic {first['topic']} "
                f"partition {first['partition']} offset {first['offset']}: {first[REASON_COLUMN]}. {ON_BAD_RECORD_HINT}"
            )
        if policy is BadRecordPolicy.NULL:
            return pa.concat_tables([decoded.rows, decoded.misfit_rows])
        if self._dead_letters is not None:
            self._dead_letters.send(decoded.misfits, REASON_COLUMN)
        return decoded.rows

    def finish(self) -> DecodingSummary:
        """After the last batch: once every dead letter is acknowledged, the records that did not fit and the
        latest timestamps read."""
        if self._dead_letters is not None:
            self._dead_letters.flush()
        return DecodingSummary(self.bad_records, merge_latest(self._latest), self.records_read)


def bad_record_properties(bad_records: int, policy: BadRecordPolicy, schema_name: str) -> dict[str, str]:
    """A batch's epoch properties: the count of its records that did not fit (logged when there were some), and the
    policy that decided what became of them."""
    if bad_records:
        log.warning(f"records that do not fit {schema_name}", bad_records=bad_records, on_bad_record=policy.value)
    return {BAD_RECORDS_PROPERTY: str(bad_records), ON_BAD_RECORD_PROPERTY: policy.value}
