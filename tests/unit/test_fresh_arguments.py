"""Hostile arguments of a fresh read (spark_writer.fresh): each is refused with a ValueError naming it, before any
call to the coordinator, Kafka or the catalog (nothing listens at the addresses given, and the catalog is empty)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog

from coordinator_service.contract.table_identifiers import sink_name_problem, table_identifier_problem
from spark_writer import fresh
from spark_writer.fresh.fresh_read import checked_arguments
from spark_writer.fresh.sink_flags import SinkFlags, sink_source

FLAGS: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:1", "topic": "orders"}
CATALOG = SqlCatalog("fresh", uri="sqlite:///:memory:", warehouse="file:///nonexistent")
CALL: dict[str, Any] = {"sink": "orders", "coordinator": "127.0.0.1:1", "catalog": CATALOG}


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"sink": "../etc"}, "sink"),
        ({"sink": 5}, "sink: 5 is not a text"),
        ({"table": 7}, "table: 7 is not a text"),
        ({"writer_token": b"t"}, "writer_token: b't' is not a text"),
        ({"catalog": None}, "catalog: NoneType is not a pyiceberg catalog"),
        ({"catalog": {"type": "sql"}}, "catalog: dict is not a pyiceberg catalog"),
        ({"coordinator_retry_seconds": True}, "coordinator_retry_seconds"),
        ({"coordinator_retry_seconds": 86_401}, "coordinator_retry_seconds"),
        ({"sink": ""}, "sink"),
        ({"table": "no_namespace"}, "namespace"),
        ({"table": "shop..orders"}, "shop..orders"),
        ({"coordinator": "http://127.0.0.1:50051"}, "is a URL"),
        ({"coordinator": "127.0.0.1:99999"}, "not HOST:PORT"),
        ({"coordinator_retry_seconds": 0}, "coordinator_retry_seconds"),
        ({"coordinator_retry_seconds": float("nan")}, "coordinator_retry_seconds"),
        ({"coordinator_retry_seconds": "5"}, "coordinator_retry_seconds"),
        ({"topics": ["orders"]}, "unknown flag 'topics': did you mean 'topic'?"),
        ({"schema": "id BIGINT"}, "unknown flag 'schema'"),
        ({"topic": []}, "topic"),
        ({"topic": ""}, "topic"),
        ({"topic": 7}, "topic"),
        ({"topic": ["orders", None]}, "topic"),
        ({"key": 7, "mode": "upsert"}, "key: 7 is not a non-empty text"),
        ({"route_by": "c", "route": "DE=shop.de"}, "route"),
        ({"kafka_option": ["a=b"]}, "kafka_option"),
        ({"op_map": 3}, "op_map"),
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"record_format": "xml"}, "record_format: 'xml' is not one of json, avro, protobuf, json-schema, raw"),
        ({"mode": "merge"}, "mode: 'merge' is not one of"),
        ({"mode": "upsert"}, "--key"),
        ({"mode": "upsert", "key": "id", "record_format": "raw"}, "--format json, avro"),
        ({"key": "a,,b", "mode": "upsert"}, "key"),
        ({"op_map": "x=maybe", "mode": "cdc", "key": "id", "op_field": "op"}, "maybe"),
        ({"on_bad_record": "dead-letter"}, "--dead-letter-topic is required"),
        ({"on_bad_record": "ignore"}, "on_bad_record"),
        ({"kafka_metadata": "yes"}, "kafka_metadata: 'yes' is not True or False"),
        ({"fail_on_data_loss": 0}, "fail_on_data_loss"),
        ({"json_time_zone": "Mars/Olympus"}, "unknown time zone"),
        ({"starting_offsets": "yesterday"}, "startingOffsets"),
        ({"kafka_option": {"isolation.level": "read_uncommitted"}}, "isolation.level"),
        ({"route": ["DE=shop.de"]}, "--route-by"),
        ({"route_by": "country", "route": ["DE=../x"]}, "route 'DE'"),
        ({"unrouted": "drop", "route_by": "c", "dynamic_routes": True}, "unrouted"),
        ({"subject": "orders-value"}, "only with --format avro, protobuf or json-schema"),
        ({"record_format": "avro"}, "schema registry: pass its URL"),
    ],
)
def test_a_hostile_argument_is_refused_before_anything_is_called(changed: dict[str, Any], message: str) -> None:
    began = time.monotonic()
    with pytest.raises(ValueError, match=re.escape(message)):
        fresh.read_arrow(**{**CALL, **FLAGS, **changed})
    assert time.monotonic() - began < 2, "refused at once, not after trying the coordinator"


def test_the_writers_flags_are_required() -> None:
    with pytest.raises(ValueError, match="bootstrap_servers is required: the sink's own --bootstrap-servers"):
        sink_source({"topic": "orders"})
    with pytest.raises(ValueError, match="topic is required"):
        sink_source({"bootstrap_servers": "b:9092"})


def test_every_flag_a_fresh_read_takes_is_the_writers() -> None:
    from spark_writer.job import main

    writer = set(main.__annotations__) - {"return"}
    assert set(SinkFlags.__annotations__) <= writer


@settings(max_examples=200)
@given(sink=st.text(max_size=40), table=st.one_of(st.none(), st.text(max_size=40)))
def test_names_are_refused_exactly_where_the_name_policy_refuses_them(sink: str, table: str | None) -> None:
    problem = sink_name_problem(sink) or (None if table is None else table_identifier_problem(table))
    if problem is None:
        assert checked_arguments(sink, "127.0.0.1:50051", CATALOG, table, None, 60.0) == "127.0.0.1:50051"
    else:
        with pytest.raises(ValueError, match=re.escape(problem)):
            checked_arguments(sink, "127.0.0.1:50051", CATALOG, table, None, 60.0)
