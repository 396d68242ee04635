"""A JSON schema that grows with the batches (JsonBatchParser with evolve): what may become a column, and what
becomes of a record whose new field the table cannot take."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_writer.formats.decoded_batch import REASON_COLUMN
from spark_writer.formats.record_decoding import BadRecordError, BadRecordPolicy
from spark_writer.kafka.source import KAFKA_SCHEMA
from spark_writer.sink.kafka_records import JsonBatchParser, schema_from_ddl

KAFKA_TIME = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
# Each a record a table with the column `id` (and the kafka_* columns) cannot take as it is.
UNTAKEABLE = {
    '{"id": 1, "meta": {}}': "meta",
    '{"id": 2, "": 5}': "''",
    '{"id": 3, "kafka_offset": 7}': "kafka_offset",
    '{"id": 4, "ID": 9}': "ID",
}
GOOD = '{"id": 5, "note": "x"}'


def kafka_records(spark: SparkSession, values: list[str]) -> DataFrame:
    rows = [(None, value.encode(), "events", 0, offset, KAFKA_TIME, 0, []) for offset, value in enumerate(values)]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def decoded(parser: JsonBatchParser, records: DataFrame) -> tuple[pa.Table, int]:
    batch = parser.prepare(records)
    task = batch.decoding.start()
    rows = pa.concat_tables([task.rows(each) for each in batch.frame.toArrow().to_batches()])
    parser.batch_properties(task.bad_records)
    return rows, task.bad_records


def test_a_record_whose_new_field_the_table_cannot_take_is_a_bad_record(spark: SparkSession) -> None:
    values = [*UNTAKEABLE, GOOD]
    parser = JsonBatchParser(schema_from_ddl("id BIGINT"), kafka_metadata=True, on_bad_record=BadRecordPolicy.NULL)

    rows, bad = decoded(parser, kafka_records(spark, values))

    assert parser.schema.fieldNames() == ["id", "note"]  # only the field a column can hold was learned
    assert bad == len(UNTAKEABLE)
    by_offset = {row["kafka_offset"]: row for row in rows.to_pylist()}
    assert sorted(by_offset) == [0, 1, 2, 3, 4]
    assert by_offset[2]["id"] == 3  # the kafka_offset column is the record's offset, never its field
    assert (by_offset[4]["id"], by_offset[4]["note"]) == (5, "x")


def test_under_fail_the_batch_fails_naming_the_field(spark: SparkSession) -> None:
    for value, field in UNTAKEABLE.items():
        parser = JsonBatchParser(schema_from_ddl("id BIGINT"), kafka_metadata=True)
        with pytest.raises(BadRecordError, match=field):
            decoded(parser, kafka_records(spark, [GOOD, value]))
        assert parser.schema.fieldNames() == ["id", "note"]


def test_a_field_learned_later_makes_its_records_fit(spark: SparkSession) -> None:
    parser = JsonBatchParser(schema_from_ddl("id BIGINT"), on_bad_record=BadRecordPolicy.NULL)
    _, bad = decoded(parser, kafka_records(spark, ['{"id": 1, "meta": {}}']))
    assert bad == 1
    rows, bad = decoded(parser, kafka_records(spark, [json.dumps({"id": 2, "meta": {"a": 1}})]))
    assert bad == 0
    assert rows.to_pylist() == [{"id": 2, "meta": {"a": 1}}]


def test_the_reason_says_why(spark: SparkSession) -> None:
    parser = JsonBatchParser(schema_from_ddl("id BIGINT"), kafka_metadata=True, on_bad_record=BadRecordPolicy.NULL)
    batch = parser.prepare(kafka_records(spark, list(UNTAKEABLE)))
    (records,) = batch.frame.toArrow().combine_chunks().to_batches()
    decoded_batch = batch.decoding.decoder.decode(records)
    assert [row[REASON_COLUMN] for row in decoded_batch.misfits.to_pylist()] == [
        "fields the table cannot take: meta (only empty objects: no column type can be inferred)",
        "fields the table cannot take: '' (an empty name cannot name a column)",
        "fields the table cannot take: kafka_offset (the name of a --kafka-metadata column)",
        "fields the table cannot take: ID (differs only in case from the column id)",
    ]
