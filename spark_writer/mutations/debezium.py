"""Debezium's change envelope: `before`, `after`, `op` (and `source`, `ts_ms`, ...), the row a change leaves in
`after` and, for a delete, the row it removes in `before`.

A change's operation is mapped by the op map (c, r, u: upsert; d: delete by default); its row is `after` for an
upsert, and `before` for a delete, whose key is all that is read of it. JSON values come in Kafka Connect's two
forms, the envelope itself or, with the JSON converter's schemas, `{"schema": ..., "payload": <the envelope>}`; the
registry formats' values are the envelope (the subject's schema is Debezium's Envelope record). Pure: no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_writer.mutations.modes import Op, mapped_ops

BEFORE: Final = "before"
AFTER: Final = "after"
OP: Final = "op"
# The JSON converter's form with schemas: the envelope under `payload`.
PAYLOAD: Final = "payload"


def json_envelope_schema(row: pa.Schema) -> pa.Schema:
    """What the JSON decoder reads of a Debezium value whose rows have the fields of `row`: the envelope, at the top
    or under `payload`. The row's fields may all be null there (an image that is absent): a key column found null
    where it is read makes its record a misfit."""
    image = pa.struct([pa.field(field.name, field.type) for field in row])
    envelope = [pa.field(BEFORE, image), pa.field(AFTER, image), pa.field(OP, pa.string())]
    return pa.schema([*envelope, pa.field(PAYLOAD, pa.struct(envelope))])


def envelope_row_type(envelope: pa.DataType, described: str) -> pa.StructType:
    """The row type of a registered Debezium envelope (its `after`, which `before` must equal); ValueError saying
    what is missing from `described`."""
    if not pa.types.is_struct(envelope):
        raise ValueError(f"{described} is not a Debezium envelope: not a record")
    names = [field.name for field in envelope]
    missing = [name for name in (BEFORE, AFTER, OP) if name not in names]
    if missing:
        raise ValueError(f"{described} is not a Debezium envelope: it has no field {', '.join(missing)}")
    after = envelope.field(AFTER).type
    if not pa.types.is_struct(after) or envelope.field(BEFORE).type != after:
        raise ValueError(f"{described} is not a Debezium envelope: its before and after are not the same record")
    if not (pa.types.is_string(envelope.field(OP).type) or pa.types.is_large_string(envelope.field(OP).type)):
        raise ValueError(f"{described} is not a Debezium envelope: its op is {envelope.field(OP).type}, not text")
    assert isinstance(after, pa.StructType)
    return after


def unwrap(envelopes: pa.Table, op_map: Mapping[str, Op]) -> tuple[pa.Table, pa.Array, pa.Array]:
    """Decoded envelopes (columns before, after, op, and payload for JSON) as (the rows: after for an upsert, before
    for a delete; their ops; why a record does not fit, null where it does)."""
    before, after, op = (envelopes.column(name).combine_chunks() for name in (BEFORE, AFTER, OP))
    if PAYLOAD in envelopes.column_names:
        payload = envelopes.column(PAYLOAD).combine_chunks()
        wrapped = pc.is_valid(payload)
        before = pc.if_else(wrapped, pc.struct_field(payload, BEFORE), before)
        after = pc.if_else(wrapped, pc.struct_field(payload, AFTER), after)
        op = pc.if_else(wrapped, pc.struct_field(payload, OP), op)
    ops, reasons = mapped_ops(op, op_map, "op")
    deletes = pc.fill_null(pc.equal(ops, Op.DELETE.value), False)
    image = pc.if_else(deletes, before, after)
    missing = pc.if_else(
        deletes, pa.scalar("a delete without its before image", pa.string()), "a change without its after image"
    )
    reasons = pc.coalesce(reasons, pc.if_else(pc.is_null(image), missing, pa.scalar(None, pa.string())))
    fields = image.type
    rows = pa.Table.from_arrays(image.flatten(), schema=pa.schema([field.with_nullable(True) for field in fields]))
    return rows, ops, reasons
