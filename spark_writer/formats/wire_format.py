"""Confluent's wire format, read a batch at a time: magic byte 0, a 4-byte big-endian schema id, then the payload.

(Protobuf payloads start with the message indexes, which ``protobuf_schemas`` reads.)
The header of every record of a batch is checked and read in Arrow and numpy,
without a Python object per record. A value that cannot be a framed record (a
tombstone, fewer than 5 bytes, another magic byte) gets its reason; it never
reaches a decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAGIC_BYTE: Final = b"\x00"
HEADER_BYTES: Final = 5
TOMBSTONE: Final = "tombstone: the record has no value"
NOT_FRAMED: Final = "not in the Confluent wire format"


@dataclass(frozen=True)
class Frames:
    """The records of a batch that are framed (their index in the batch, schema id and payload), and why the others
    are not."""

    indices: pa.Array  # int64: where each framed record is in the batch
    schema_ids: np.ndarray  # int64, one per framed record
    payloads: pa.Array  # binary: the bytes after the header, one per framed record
    unframed: dict[int, str]  # index in the batch -> reason


def _header_reason(value: bytes | None) -> str:
    if value is None:
        return TOMBSTONE
    if len(value) < HEADER_BYTES:
        return f"{NOT_FRAMED}: {len(value)} byte(s), fewer than its {HEADER_BYTES}-byte header"
    return f"{NOT_FRAMED}: magic byte {value[0]:#04x}, not 0x00 (schema ids as GUIDs, magic byte 0x01, are not read)"


def split_frames(values: pa.Array) -> Frames:
    """The header of every value read; a record whose value is absent or not framed is left out, with its reason."""
    framed_mask = pc.fill_null(
        pc.and_(
            pc.greater_equal(pc.binary_length(values), HEADER_BYTES),
            pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(MAGIC_BYTE, values.type)),
        ),
        False,
    )
    indices = pc.indices_nonzero(framed_mask).cast(pa.int64())
    unframed = {
        int(index): _header_reason(values[int(index)].as_py())
        for index in pc.indices_nonzero(pc.invert(framed_mask)).to_pylist()
    }
    framed = values.filter(framed_mask)
    # An explicit end: binary_slice without one fails on some arrays (pyarrow 26: "Negative buffer resize").
    end = max(HEADER_BYTES, pc.max(pc.binary_length(framed)).as_py() or 0)
    return Frames(indices, _schema_ids(framed), pc.binary_slice(framed, HEADER_BYTES, end), unframed)


def _schema_ids(framed: pa.Array) -> np.ndarray:
    """Bytes 1-4 of each value (all at least 5 bytes long) as big-endian unsigned integers."""
    if len(framed) == 0:
        return np.zeros(0, np.int64)
    width = np.int64 if pa.types.is_large_binary(framed.type) else np.int32
    offsets = np.frombuffer(framed.buffers()[1], width)[framed.offset : framed.offset + len(framed)].astype(np.int64)
    data = np.frombuffer(framed.buffers()[2], np.uint8)
    ids = np.zeros(len(framed), np.int64)
    for byte in range(1, HEADER_BYTES):
        ids = (ids << 8) | data[offsets + byte]
    return ids
