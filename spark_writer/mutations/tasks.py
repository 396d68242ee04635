"""An upsert or change stream's batch in Spark: its records shuffled so that one task owns each key, each task's
surviving rows written as data files and the keys it touched as key files.

Two stages, one Spark job (a sink.parquet_writer.BatchTasks):

1. each task of the source tags each record with its key's text (`SHUFFLE_KEY`; null for a record that does not
   decode: those all go to one task, whose decoding finds them bad again), decoding its value and message key with
   the MutationDecoder of stage 2. The Kafka source of `--source python` reads the records tagged
   (keyed_source: its Python already holds each record batch); a batch without the column (Spark's Kafka source, a
   decoding built again since the stream started) is tagged in an Arrow UDF: only the values and message keys
   cross to Python;
2. the records are repartitioned by that text (Spark's hash partitioning: every record of a key goes to the same
   task), and each task decodes them, reduces them (reduction: the last record of each key in Kafka order wins),
   and writes the winners that upsert as data files and every winner's key as key files, each under its table
   (routed by the key: the route column is one of its columns), named per task attempt as data files are.

What is shuffled is the Kafka records themselves, not decoded rows, so that no value crosses Spark's types on the
way; decoding is a pure function of the record, so both stages read a record the same way. A batch run again reads
the same records and gives the same winners: the same rows and keys, in files of other names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import StringType

from spark_writer.formats.record_decoding import RecordDecoding
from spark_writer.mutations.decoding import MutationDecoder
from spark_writer.mutations.reduction import LastWins
from spark_writer.sink.parquet_writer import (
    WRITTEN_FILES_STRUCT,
    DataFileTarget,
    TaskFiles,
    TaskWriter,
    task_label,
    task_results,
)

# The column stage 1 adds: the text of the record's key.
SHUFFLE_KEY: Final = "_sink_key"
KEY_FILE_TAG: Final = "keys"


def keyed_task_writer(target: DataFileTarget, decoder: MutationDecoder) -> TaskWriter:
    """Stage 2's mapInArrow function: one task's records (every record of its keys) reduced, the surviving rows
    written as data files and the keys touched as key files; yields WRITTEN_FILES_SCHEMA rows. `target` decodes
    with `decoder`."""
    key = decoder.mutations.key
    key_schema = pa.schema([target.schema.field(name) for name in key])
    keys_target = dataclasses.replace(
        target, schema=key_schema, partition_fields=(), decoding=None, file_tag=KEY_FILE_TAG
    )

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assert target.decoding is not None, "an upsert or change stream decodes in its tasks"
        label = task_label()
        data_files, key_files = TaskFiles(target, label), TaskFiles(keys_target, label)
        task = target.decoding.start()
        reduction = LastWins(key)
        try:
            for batch in batches:
                kafka = batch.drop_columns([SHUFFLE_KEY]) if SHUFFLE_KEY in batch.schema.names else batch
                reduction.add(task.rows(kafka))
            summary = task.finish()
            reduced = reduction.result(decoder.output_schema)
            data_files.write(reduced.rows.select(target.schema.names).cast(target.schema), None)
            # Every key touched is routed here once: its tallies are the task's (the data files' repeat them).
            key_files.write(reduced.keys.cast(key_schema), None)
            written, keys_written = data_files.close(), key_files.close()
        except BaseException:
            data_files.abort()
            key_files.abort()
            raise
        yield task_results(written, summary, key_files, keys_written)

    return write


def keyed_tasks(frame: DataFrame, target: DataFileTarget) -> DataFrame:
    """The BatchTasks of an upsert or change stream (the module's two stages), for a target whose decoding is a
    MutationDecoder's (MutationParser's); a `SHUFFLE_KEY` column of `frame` holds the key texts of that decoder."""
    decoding = target.decoding
    assert isinstance(decoding, RecordDecoding) and isinstance(decoding.decoder, MutationDecoder)
    decoder = decoding.decoder
    owned = frame if SHUFFLE_KEY in frame.columns else frame.withColumn(SHUFFLE_KEY, key_column(frame, decoder))
    owned = owned.repartition(frame.sparkSession.sparkContext.defaultParallelism, SHUFFLE_KEY)
    return owned.mapInArrow(keyed_task_writer(target, decoder), WRITTEN_FILES_STRUCT)


def key_column(frame: DataFrame, decoder: MutationDecoder) -> Column:
    """The key text of each record of `frame` (Kafka records), computed in stage 1 by `decoder`."""

    def key_texts(value: pa.Array, key: pa.Array) -> pa.Array:
        return decoder.key_texts(value, key)

    # An Arrow UDF: only the values and message keys go to Python, and only the keys' texts come back. Its kind is
    # read from the type hints, as pyspark prefers; its stubs know only the older form, with the kind given.
    key_udf = arrow_udf(key_texts, StringType())  # type: ignore[call-overload]
    column: Column = key_udf(frame["value"], frame["key"])
    return column
