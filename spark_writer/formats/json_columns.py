"""Which top-level JSON fields may become table columns, and why the others cannot.

A JSON schema grows from what the records hold (a sample at start, then each batch with
``--evolve-schema``). A field becomes a column only when the table can hold it as one:

* a name that is not empty;
* not the name of a ``--kafka-metadata`` column (``kafka_offset``...), which holds where the
  record came from, never the record's own field;
* not a name that differs only in case from a column (or another new field): Spark resolves
  columns case-insensitively, so ``ID`` beside ``id`` would be a second column no query can tell apart;
* a type Spark could infer from the batch's values (a field holding only ``{}`` has none).

A field that cannot be a column is *refused*: a record giving it a value (anything but null)
cannot be stored as it was written, so it is a bad record under ``--on-bad-record``, with the
reason saying why (``json_decoding``); its other records' rows are not touched. Refusals are
decided again with every batch: a field refused for its empty objects becomes a column once a
batch gives it a value Spark can type.

Pure: Spark's types only, no session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql.types import StructType

from spark_writer.formats.decoded_batch import KAFKA_METADATA_COLUMNS

EMPTY_NAME: Final = "an empty name cannot name a column"
KAFKA_METADATA_NAME: Final = "the name of a --kafka-metadata column"
NO_TYPE: Final = "only empty objects: no column type can be inferred"


@dataclass(frozen=True)
class Growth:
    """A schema grown by new fields: the schema with those that may be columns, and why each other one may not."""

    schema: StructType
    refused: Mapping[str, str] = field(default_factory=dict)


def grow(known: StructType, new: Iterable[str], infer: Callable[[], StructType], *, kafka_metadata: bool) -> Growth:
    """`known` with the fields of `new` (names the records hold) that may be columns, in name order, typed by what
    `infer` gives (called only when some name may be a column), and the refused others."""
    taken = {name.lower(): name for name in known.fieldNames()}
    if kafka_metadata:
        taken.update({name.lower(): name for name in KAFKA_METADATA_COLUMNS})
    refused: dict[str, str] = {}
    candidates = []
    for name in sorted(set(new) - set(known.fieldNames())):
        if not name:
            refused[name] = EMPTY_NAME
        elif kafka_metadata and name in KAFKA_METADATA_COLUMNS:
            refused[name] = KAFKA_METADATA_NAME
        elif name.lower() in taken:
            refused[name] = f"differs only in case from the column {taken[name.lower()]}"
        else:
            candidates.append(name)
    schema = StructType(list(known.fields))
    inferred = infer() if candidates else StructType([])
    for name in candidates:
        if name not in inferred.fieldNames():
            refused[name] = NO_TYPE
        elif name.lower() in taken:  # another new field in another case, taken just before
            refused[name] = f"differs only in case from the column {taken[name.lower()]}"
        else:
            schema = schema.add(inferred[name])
            taken[name.lower()] = name
    return Growth(schema, refused)
