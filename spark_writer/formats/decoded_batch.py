"""A batch of Kafka records as table rows, whatever decoded them: the rows that fit, and the records that do not.

Every decoder (``json_decoding.JsonDecoder``, ``registry_decoding.RegistryDecoder``)
gives a ``DecodedBatch``, so that the policies for records that do not fit (fail,
null, dead-letter: ``kafka_records.RecordDecodingTask``) apply to every format
alike. A misfit keeps its Kafka columns (topic, partition, offset, key, value,
headers) and the reason, which names what did not fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UTC: Final = "UTC"
REASON_COLUMN: Final = "_bad_record_reason"
# The optional columns telling where each record came from: table column -> Kafka source column.
KAFKA_METADATA_COLUMNS: Final = {
    "kafka_topic": "topic",
    "kafka_partition": "partition",
    "kafka_offset": "offset",
    "kafka_timestamp": "timestamp",
}
KAFKA_METADATA_FIELDS: Final = (
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
    pa.field("kafka_timestamp", pa.timestamp("us", tz=UTC)),
)


@dataclass(frozen=True)
class DecodedBatch:
    """One batch of Kafka records as table rows: those that fit, and those that do not."""

    rows: pa.Table  # the records that fit, in the decoder's output schema
    misfit_rows: pa.Table  # the records that do not: what fits of them, null elsewhere (the output schema)
    misfits: pa.Table  # the Kafka columns of the records that do not fit, and REASON_COLUMN


def metadata_columns(kafka: pa.RecordBatch | pa.Table, indices: pa.Array | None = None) -> list[pa.Array]:
    """The kafka_* columns of the records at `indices` (all when None), in KAFKA_METADATA_FIELDS' types."""
    columns = []
    for target in KAFKA_METADATA_FIELDS:
        column = kafka.column(KAFKA_METADATA_COLUMNS[target.name])
        if indices is not None:
            column = column.take(indices)
        columns.append(pc.cast(column, target.type))
    return columns


def split_by_reasons(kafka: pa.RecordBatch, rows: pa.Table, reasons: pa.Array) -> DecodedBatch:
    """`rows` (one per record of `kafka`, in its order) split by `reasons` (null: the record fits)."""
    if reasons.null_count == len(reasons):  # the usual batch: every record fits
        return DecodedBatch(rows, rows.schema.empty_table(), _misfits(kafka, pa.array([], pa.int64()), reasons))
    fits = pc.is_null(reasons)
    misfit_indices = pa.array(np.flatnonzero(~np.asarray(fits.to_numpy(zero_copy_only=False))), pa.int64())
    return DecodedBatch(rows.filter(fits), rows.take(misfit_indices), _misfits(kafka, misfit_indices, reasons))


def _misfits(kafka: pa.RecordBatch, indices: pa.Array, reasons: pa.Array) -> pa.Table:
    sources = pa.Table.from_batches([kafka]).take(indices)
    return sources.append_column(REASON_COLUMN, reasons.take(indices).cast(pa.string()))
