"""What a stream's records mean: appended rows, new versions of their keys, or changes with an operation; the flags
that say so, checked before Spark starts, and the table schema a keyed stream writes.

* ``append`` (the default): every record is a new row.
* ``upsert`` (``--key``): every record is the whole new row of its key; a tombstone (a null value) deletes its key,
  read from the Kafka message key.
* ``cdc`` (``--key`` and ``--op-field F`` or ``--cdc-envelope debezium``): every record is a change whose operation,
  mapped by ``--op-map`` to upsert or delete, says what becomes of its key; a tombstone deletes its key too.

The key's columns become the table's identifier fields, which Iceberg requires to be required primitive columns,
not float or double: the checks here refuse any other key before anything is written. Pure: no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from coordinator_service.contract.key_columns import key_columns_problem


class MutationMode(StrEnum):
    APPEND = "append"
    UPSERT = "upsert"
    CDC = "cdc"


class Op(IntEnum):
    """What a record does to its key, as the op column holds it."""

    DELETE = 0
    UPSERT = 1


class Envelope(StrEnum):
    """A change record's envelope: where its row and its operation are."""

    # before, after, op (and source, ts_ms, ...): the row is `after`, or `before` for a delete.
    DEBEZIUM = "debezium"


# Debezium's operations (c create, r read in a snapshot, u update, d delete) and the I/U/D of many other tools.
DEFAULT_OP_MAP: Final[Mapping[str, Op]] = MappingProxyType(
    {"c": Op.UPSERT, "r": Op.UPSERT, "u": Op.UPSERT, "d": Op.DELETE, "I": Op.UPSERT, "U": Op.UPSERT, "D": Op.DELETE}
)


def default_op_map() -> dict[str, Op]:
    """A copy of DEFAULT_OP_MAP (a mapping a Spark task can be shipped with)."""
    return dict(DEFAULT_OP_MAP)


def parse_op_map(text: str) -> dict[str, Op]:
    """'c=upsert,u=upsert,d=delete' -> {value: Op}; ValueError saying what is wrong. Values are case-sensitive and
    hold no ',' or '='; the map replaces the default one."""
    mapping: dict[str, Op] = {}
    for pair in text.split(","):
        value, equals, op = pair.partition("=")
        if not equals or not value:
            raise ValueError(f"{pair!r} is not VALUE=upsert or VALUE=delete")
        if op not in ("upsert", "delete"):
            raise ValueError(f"{value!r} maps to {op!r}: an operation is upsert or delete")
        if value in mapping:
            raise ValueError(f"{value!r} is mapped twice")
        mapping[value] = Op.UPSERT if op == "upsert" else Op.DELETE
    return mapping


def describe_op_map(mapping: Mapping[str, Op]) -> str:
    return ",".join(f"{value}={op.name.lower()}" for value, op in mapping.items())


def mapped_ops(text: pa.Array, op_map: Mapping[str, Op], what: str) -> tuple[pa.Array, pa.Array]:
    """Each record's op (int8; null where it is not mapped) and why it does not fit (null where it does)."""
    values = pa.array(list(op_map), pa.string())
    ops = pa.array([op.value for op in op_map.values()], pa.int8())
    found = pc.index_in(text.cast(pa.string()), value_set=values)
    mapped = ops.take(found)
    shown = pc.binary_join_element_wise(f"{what} '", pc.utf8_slice_codeunits(text.cast(pa.string()), 0, 50), "'", "")
    reasons = pc.if_else(
        pc.is_null(text),
        pa.scalar(f"{what} is null: every change says what it does", pa.string()),
        pc.binary_join_element_wise(shown, f" is not in --op-map ({describe_op_map(op_map)})", ""),
    )
    return mapped, pc.if_else(pc.is_null(mapped), reasons, pa.scalar(None, pa.string()))


@dataclass(frozen=True)
class Mutations:
    """What the stream's records mean (the module's docstring) and the sink's key; an append stream has no key."""

    mode: MutationMode = MutationMode.APPEND
    key: tuple[str, ...] = ()
    op_field: str | None = None
    op_map: Mapping[str, Op] = field(default_factory=default_op_map)
    envelope: Envelope | None = None

    def __post_init__(self) -> None:
        """ValueError for flags that do not go together, naming them."""
        if self.mode is MutationMode.APPEND:
            given = [
                flag
                for flag, value in (
                    ("--key", self.key),
                    ("--op-field", self.op_field),
                    ("--op-map", dict(self.op_map) != dict(DEFAULT_OP_MAP)),
                    ("--cdc-envelope", self.envelope),
                )
                if value
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: only with --mode upsert or cdc")
            return
        if not self.key:
            raise ValueError(f"--mode {self.mode} needs --key COLUMN[,COLUMN...]: the columns of each row's key")
        problem = key_columns_problem(self.key)
        if problem is not None:
            raise ValueError(f"--key: {problem}")
        if self.mode is MutationMode.UPSERT:
            if self.op_field is not None or self.envelope is not None or dict(self.op_map) != dict(DEFAULT_OP_MAP):
                raise ValueError(
                    "--op-field, --op-map and --cdc-envelope are for --mode cdc: in --mode upsert every record is "
                    "the whole new row of its key, and a tombstone deletes it"
                )
            return
        if (self.op_field is None) == (self.envelope is None):
            raise ValueError(
                "--mode cdc reads each record's operation from --op-field F, or from its --cdc-envelope debezium: "
                "give one of them"
            )
        if self.op_field is not None and (not self.op_field.strip() or self.op_field in self.key):
            raise ValueError(f"--op-field {self.op_field!r} must name a column that is not a key column")
        if not self.op_map:
            raise ValueError("--op-map maps no operation")

    @property
    def keyed(self) -> bool:
        return self.mode is not MutationMode.APPEND

    def table_schema(self, schema: pa.Schema, *, declares_nullability: bool) -> pa.Schema:
        """The table's schema of the rows of `schema` (their columns, then any kafka_* ones): the key columns
        required. ValueError when a key column is missing, is not a primitive, is a float or a double, or (where
        the format declares which columns may be null: `declares_nullability`) may be null; and when the op field is
        not a text column."""
        if not self.keyed:
            return schema
        names = schema.names
        for column in self.key:
            if column not in names:
                raise ValueError(f"--key {column!r} is not a column of the table, whose columns are {names}")
            kind = schema.field(column).type
            if pa.types.is_nested(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
                raise ValueError(
                    f"--key {column!r} is {kind}: a key column is a primitive other than float or double (an "
                    "Iceberg identifier field)"
                )
            if declares_nullability and schema.field(column).nullable:
                raise ValueError(
                    f"--key {column!r} may be null in the schema: a key column is required; declare it NOT NULL"
                )
        if self.op_field is not None:
            if self.op_field not in names:
                raise ValueError(
                    f"--op-field {self.op_field!r} is not a column of the table, whose columns are {names}"
                )
            if not pa.types.is_string(schema.field(self.op_field).type):
                raise ValueError(f"--op-field {self.op_field!r} is {schema.field(self.op_field).type}, not text")
        return pa.schema([each.with_nullable(False) if each.name in self.key else each for each in schema])

    def check_route_column(self, column: str | None) -> None:
        """ValueError when a keyed stream routes by a column outside its key: a delete, whose row is only its key,
        could not be routed to the table its key's rows are in."""
        if self.keyed and column is not None and column not in self.key:
            raise ValueError(
                f"--route-by {column!r} is not a key column: an upsert or change stream routes by a column of its "
                "--key, so that every change of a key, a delete included, goes to the table its rows are in"
            )


def key_names(text: str) -> tuple[str, ...]:
    """'id' or 'region,id' -> the key's columns, in order (spaces around names dropped)."""
    return tuple(name.strip() for name in text.split(","))
