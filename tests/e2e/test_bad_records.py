"""Records that do not fit the JSON schema: the job fails the batch (the default), writes nulls and counts them,
or sends them to a dead-letter topic; never silently."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pyiceberg.catalog import Catalog
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from spark_writer.formats.record_decoding import (
    BAD_RECORDS_PROPERTY,
    ON_BAD_RECORD_PROPERTY,
    RECORDS_READ_PROPERTY,
    BadRecordPolicy,
)
from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.kafka.offsets import OffsetRange
from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_reader import read_range
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import produce_records
from tests.fixtures.pipeline import QUERY_TIMEOUT_SECONDS, table_arrow
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
SCHEMA = "order_id BIGINT, amount DOUBLE, created_at TIMESTAMP"
GOOD = [json.dumps({"order_id": i, "amount": 1.5, "created_at": "2025-03-01T10:00:00Z"}) for i in range(3)]
BAD: dict[int, tuple[str | None, str]] = {  # offset in partition 0 (after the good ones) -> (value, reason)
    3: ('{"order_id": 3, "amount": "abc"}', "fields whose value does not fit the schema: amount (double)"),
    4: ('{"order_id": 4, "created_at": "yesterday"}', "fields whose value does not fit the schema: created_at"),
    5: ("not json at all", "not valid JSON"),
    6: ('[{"order_id": 6}]', "a JSON value that is not an object"),
    7: (None, "tombstone: the record has no value"),
}


def produce_good_and_bad(bootstrap: str, topic: str) -> None:
    values = [*GOOD, *(value for value, _ in BAD.values())]
    produce_records(
        bootstrap, topic, [(0, str(i).encode(), None if v is None else v.encode()) for i, v in enumerate(values)]
    )


def run(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    parse: ParseSettings,
    sink: str,
) -> None:
    running = start_job(
        spark,
        KafkaSettings(bootstrap, (topic,)),
        parse,
        SinkSettings(
            sink=sink,
            table=f"shop.{sink.replace('-', '_')}",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            available_now=True,
        ),
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)


def epoch_properties(coordinator: CoordinatorProcess, sink: str, epoch: int) -> dict[str, str]:
    answer = httpx.get(f"{coordinator.http_url}/api/v1/sinks/{sink}/epochs/{epoch}")
    answer.raise_for_status()
    properties: dict[str, str] = answer.json()["properties"]
    return properties


def test_a_bad_record_fails_the_batch_naming_where_it_is_by_default(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, [(0, b"0", GOOD[0].encode()), (0, b"1", b'{"order_id": 1, "amount": "x"}')])

    with pytest.raises(StreamingQueryException) as failure:
        run(spark, kafka_bootstrap, topic, coordinator, tmp_path, ParseSettings(schema_ddl=SCHEMA), "orders-bad-fail")

    message = str(failure.value)
    for expected in (f"topic {topic} partition 0 offset 1", "amount (double)", "--on-bad-record"):
        assert expected in message


def test_bad_records_as_nulls_are_counted(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=1)
    produce_good_and_bad(kafka_bootstrap, topic)
    parse = ParseSettings(schema_ddl=SCHEMA, kafka_metadata=True, on_bad_record=BadRecordPolicy.NULL)

    run(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse, "orders-bad-null")

    rows = table_arrow(catalog, "shop.orders_bad_null", ("kafka_offset", "order_id")).to_pylist()
    assert sorted(row["kafka_offset"] for row in rows) == list(range(8))
    properties = epoch_properties(coordinator, "orders-bad-null", 0)
    assert (properties[BAD_RECORDS_PROPERTY], properties[RECORDS_READ_PROPERTY]) == (str(len(BAD)), "8")
    # The verifier holds the epoch's rows to the records read: under the null policy, every one of them.
    assert_verified(coordinator.database_url, catalog, "orders-bad-null", kafka_bootstrap)


def test_bad_records_go_to_the_dead_letter_topic_with_where_and_why(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic, dead_letter_topic = kafka_topic(partitions=1), kafka_topic(partitions=1)
    produce_good_and_bad(kafka_bootstrap, topic)
    parse = ParseSettings(
        schema_ddl=SCHEMA,
        kafka_metadata=True,
        on_bad_record=BadRecordPolicy.DEAD_LETTER,
        dead_letter_topic=dead_letter_topic,
    )

    run(spark, kafka_bootstrap, topic, coordinator, tmp_path, parse, "orders-bad-dlq")

    rows = table_arrow(catalog, "shop.orders_bad_dlq", ("kafka_offset", "order_id")).to_pylist()
    assert sorted((row["kafka_offset"], row["order_id"]) for row in rows) == [(0, 0), (1, 1), (2, 2)]
    properties = epoch_properties(coordinator, "orders-bad-dlq", 0)
    assert (properties[BAD_RECORDS_PROPERTY], properties[ON_BAD_RECORD_PROPERTY]) == (str(len(BAD)), "dead-letter")
    # The records sent to the dead-letter topic are the only ones of those read that are in no row.
    assert_verified(coordinator.database_url, catalog, "orders-bad-dlq", kafka_bootstrap)
    options = parse_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": dead_letter_topic})
    letters = [
        row
        for batch in read_range(OffsetRange(dead_letter_topic, 0, 0, len(BAD)), options)
        for row in batch.to_pylist()
    ]
    by_offset: dict[int, tuple[bytes | None, bytes | None, dict[str, str]]] = {}
    for letter in letters:
        headers = {header["key"]: header["value"].decode() for header in letter["headers"]}
        assert (headers["sink-coordinator.source-topic"], headers["sink-coordinator.source-partition"]) == (topic, "0")
        assert headers["sink-coordinator.sink"] == "orders-bad-dlq"
        by_offset[int(headers["sink-coordinator.source-offset"])] = (letter["key"], letter["value"], headers)
    assert sorted(by_offset) == sorted(BAD)
    for offset, (value, reason) in BAD.items():
        key, raw, headers = by_offset[offset]
        assert (key, raw) == (str(offset).encode(), None if value is None else value.encode())
        assert reason in headers["sink-coordinator.reason"]
