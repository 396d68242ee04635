"""The flags of upsert and change streams (spark_writer.mutations.modes and the job's command line): each refused with
one line before Spark starts, and what the job starts with when they fit."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.contract.key_columns import key_columns_problem
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.mutations.modes import (
    DEFAULT_OP_MAP,
    Envelope,
    MutationMode,
    Mutations,
    Op,
    describe_op_map,
    key_names,
    parse_op_map,
)
from tests.fixtures.writer_cli import Started

SCHEMA = ["--schema", "id BIGINT NOT NULL, region STRING NOT NULL, op STRING, v DOUBLE"]
UPSERT = ["--mode", "upsert", "--key", "id", *SCHEMA]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mode", "merge"], "'merge' is not one of 'append', 'upsert', 'cdc'"),
        (["--key", "id"], "--key: only with --mode upsert or cdc"),
        (["--op-field", "op"], "--op-field: only with --mode upsert or cdc"),
        (["--cdc-envelope", "debezium"], "--cdc-envelope: only with --mode upsert or cdc"),
        (["--op-map", "c=upsert"], "--op-map: only with --mode upsert or cdc"),
        (["--mode", "upsert", *SCHEMA], "--mode upsert needs --key COLUMN[,COLUMN...]"),
        (["--mode", "upsert", "--key", "id"], "--mode upsert with --format json needs --schema, its --key columns NOT"),
        (["--mode", "upsert", "--key", "id,id", *SCHEMA], "--key: the key 'id, id' names a column twice"),
        (["--mode", "upsert", "--key", "id,", *SCHEMA], "--key: key column name '' is empty"),
        (["--mode", "upsert", "--key", ",".join(f"c{i}" for i in range(33)), *SCHEMA], "a key of 33 columns exceeds"),
        ([*UPSERT, "--op-field", "op"], "--op-field, --op-map and --cdc-envelope are for --mode cdc"),
        (["--mode", "cdc", "--key", "id", *SCHEMA], "--mode cdc reads each record's operation from --op-field F"),
        (
            ["--mode", "cdc", "--key", "id", "--op-field", "op", "--cdc-envelope", "debezium", *SCHEMA],
            "--mode cdc reads each record's operation from --op-field F, or from its --cdc-envelope debezium",
        ),
        (["--mode", "cdc", "--key", "id", "--op-field", "id", *SCHEMA], "--op-field 'id' must name a column that is"),
        (["--mode", "cdc", "--cdc-envelope", "avro", "--key", "id"], "'avro' is not one of 'debezium'"),
        (["--op-map", "c=insert"], "Invalid value for '--op-map': 'c' maps to 'insert': an operation is upsert or"),
        (["--op-map", "c"], "Invalid value for '--op-map': 'c' is not VALUE=upsert or VALUE=delete"),
        (["--op-map", "=upsert"], "Invalid value for '--op-map': '=upsert' is not VALUE=upsert or VALUE=delete"),
        (["--op-map", "c=upsert,c=delete"], "Invalid value for '--op-map': 'c' is mapped twice"),
        ([*UPSERT, "--on-bad-record", "null"], "--mode upsert: --on-bad-record null would write a record that does"),
        (["--mode", "upsert", "--key", "id", "--format", "raw"], "--mode upsert decodes its records: --format json"),
        (
            [*UPSERT, "--route-by", "region", "--route", "eu=db.eu"],
            "--route-by 'region' is not a key column: an upsert or change stream routes by a column of its --key",
        ),
    ],
)
def test_bad_mutation_flags_are_refused_before_spark_starts(started: Started, flags: list[str], message: str) -> None:
    result = started.invoke(*flags)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not started.calls


def test_a_change_stream_starts_with_its_key_op_field_and_map(started: Started) -> None:
    result = started.invoke(
        "--mode", "cdc", "--key", "region, id", "--op-field", "op", "--op-map", "I=upsert,D=delete", *SCHEMA,
        "--route-by", "region", "--route", "eu=db.eu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert started.parse.mutations == Mutations(
        MutationMode.CDC, ("region", "id"), "op", {"I": Op.UPSERT, "D": Op.DELETE}
    )


def test_an_append_stream_is_the_default(started: Started) -> None:
    assert started.invoke().exit_code == 0
    assert started.parse.mutations == Mutations()
    assert not started.parse.mutations.keyed


def test_debezium_takes_the_default_op_map(started: Started) -> None:
    result = started.invoke("--mode", "cdc", "--key", "id", "--cdc-envelope", "debezium", *SCHEMA)
    assert result.exit_code == 0, result.output
    assert started.parse.mutations.envelope is Envelope.DEBEZIUM
    assert dict(started.parse.mutations.op_map) == dict(DEFAULT_OP_MAP)


AVRO = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
}
KEY = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}


@pytest.mark.parametrize(
    ("flags", "registered", "message"),
    [
        (["--key", "order_id"], ("value", "key"), "--key 'order_id' is not a column of the table"),
        (["--key", "amount"], ("value", "key"), "--key 'amount' is double: a key column is a primitive other than"),
        (["--key", "id"], ("value",), "subject orders-key is not in the schema registry"),
        (
            ["--key", "id", "--decode-key"],
            ("value", "key"),
            "reads the message keys of its tombstones, not as a column",
        ),
        (
            ["--key", "id", "--mode", "cdc", "--cdc-envelope", "debezium"],
            ("value", "key"),
            "is not a Debezium envelope",
        ),
    ],
)
def test_a_registry_subject_that_cannot_hold_the_key_is_refused_before_spark_starts(
    started: Started, flags: list[str], registered: tuple[str, ...], message: str
) -> None:
    url = f"mock://{uuid.uuid4().hex}"
    client = registry_client(RegistrySettings.of(url))
    for kind in registered:
        client.register_schema(f"orders-{kind}", Schema(json.dumps(AVRO if kind == "value" else KEY), "AVRO"))
    result = started.invoke("--format", "avro", "--schema-registry-url", url, "--mode", "upsert", *flags)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not started.calls


def test_a_registry_subject_that_holds_the_key_starts(started: Started) -> None:
    url = f"mock://{uuid.uuid4().hex}"
    client = registry_client(RegistrySettings.of(url))
    client.register_schema("orders-value", Schema(json.dumps(AVRO), "AVRO"))
    client.register_schema("ids", Schema(json.dumps(KEY), "AVRO"))
    result = started.invoke(
        "--format", "avro", "--schema-registry-url", url, "--mode", "upsert", "--key", "id", "--key-subject", "ids"
    )
    assert result.exit_code == 0, result.output


@given(st.lists(st.text(max_size=6), max_size=40))
def test_any_key_is_refused_exactly_as_the_coordinator_refuses_it(names: list[str]) -> None:
    """The writer's rule for a key's names is the coordinator's (contract.key_columns): a key one side takes, the
    other takes, and the same ones are refused."""
    key = tuple(names)
    problem = key_columns_problem(key)
    if problem is None and key:
        assert Mutations(MutationMode.UPSERT, key).key == key
    else:
        with pytest.raises(ValueError, match="--key"):
            Mutations(MutationMode.UPSERT, key)


@given(st.text(max_size=60))
def test_any_op_map_text_is_parsed_or_refused_with_a_value_error(text: str) -> None:
    try:
        mapping = parse_op_map(text)
    except ValueError:
        return
    assert mapping and all(value and "," not in value and "=" not in value for value in mapping)
    assert parse_op_map(describe_op_map(mapping)) == mapping


@given(st.dictionaries(st.text(st.characters(exclude_characters=",="), min_size=1), st.sampled_from(list(Op))))
def test_every_op_map_round_trips_through_its_text(mapping: dict[str, Op]) -> None:
    if mapping:
        assert parse_op_map(describe_op_map(mapping)) == mapping


def test_key_names_keep_their_order_and_drop_spaces() -> None:
    assert key_names(" region , id") == ("region", "id")
