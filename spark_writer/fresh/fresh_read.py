"""A fresh read: a sink's table at its newest snapshot plus the topic's records the table does not hold yet.

Steps, in this order:

1. the sink as the coordinator knows it (GetSinkState): its tables, its key, its incarnation and generation; the read's
   table and the key its flags give are checked against them;
2. the topics' latest (last stable) offsets: the read's start. Every record the broker acknowledged before it is in
   the result (staleness 0);
3. the table's current snapshot, and the end offsets of the newest of the sink's epochs it holds (table_head);
4. the tail: per partition, the records from those end offsets up to the latest (tail), read as the Kafka source
   reads a range, decoded, reduced and routed as the sink does (tail_rows), and merged with the table's rows.

The table may have committed past the latest offsets in between (2 and 3): where a second look-up shows the log
reaching the table's end, the table's end offsets win (nothing is read twice, nothing taken for lost). The result's
Arrow schema metadata says where it ends in every partition (`sink-coordinator.kafka.end-offsets`, as snapshots say
it) and the snapshot it read the table at. Everything runs here, in this process: pyiceberg reads the table while
confluent-kafka reads the tail's partitions, each in a thread of its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import pyarrow as pa
import structlog
import typer
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
from coordinator_service.contract.views import SinkState
from spark_writer.formats.decoded_batch import KAFKA_METADATA_COLUMNS
from spark_writer.formats.json_decoding import json_decoder
from spark_writer.formats.record_decoding import RAW_COLUMNS, RecordDecoding
from spark_writer.fresh.sink_flags import SinkSource
from spark_writer.fresh.table_head import SNAPSHOT_ID_METADATA, TableHead, table_head
from spark_writer.fresh.tail import check_topics, read_end_offsets, tail_ranges, with_table_ahead
from spark_writer.fresh.tail_rows import TailDecoding, fresh_rows
from spark_writer.job_decoding import dead_letter_target, json_values, registry_schemas, tombstone_keys
from spark_writer.job_flags import coordinator_address
from spark_writer.job_settings import RecordFormat
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA
from spark_writer.kafka.metadata import KafkaMetadata
from spark_writer.kafka.offsets import OffsetRange, Offsets, offsets_to_json, resolve_starting_offsets
from spark_writer.kafka.options import KafkaSourceOptions, parse_options
from spark_writer.kafka.range_reader import read_range
from spark_writer.mutations.decoding import MutationDecoder, mutation_decoding
from spark_writer.routing.split import TaskRouting
from spark_writer.sink.sink_arguments import check_names
from spark_writer.spark_arrow_types import spark_arrow_schema

log = structlog.get_logger(__name__)

# Threads reading the table and the tail's partitions at once.
MAX_READERS: Final = 8


class SinkMismatchError(ValueError):
    """The flags given are not the sink's as the coordinator knows it (its tables, its key)."""


def checked_arguments(
    sink: object, coordinator: object, catalog: object, table: object, writer_token: object, retry_seconds: object
) -> str:
    """The coordinator's address, once every argument but the writer's flags passes its check (ValueError naming
    it otherwise): the names their policies, the address its form, the catalog a pyiceberg one."""
    for name, value, optional in (
        ("sink", sink, False),
        ("coordinator", coordinator, False),
        ("table", table, True),
        ("writer_token", writer_token, True),
    ):
        if not (isinstance(value, str) or (optional and value is None)):
            raise ValueError(f"{name}: {value!r} is not a text")
    assert isinstance(sink, str) and isinstance(coordinator, str) and (table is None or isinstance(table, str))
    check_names(sink, table)
    if isinstance(retry_seconds, bool) or not isinstance(retry_seconds, int | float) or not 0 < retry_seconds <= 86_400:
        raise ValueError(f"coordinator_retry_seconds must be above 0 and at most 86400 seconds, got {retry_seconds!r}")
    if not isinstance(catalog, Catalog):
        raise ValueError(f"catalog: {type(catalog).__name__} is not a pyiceberg catalog (pyiceberg.catalog.Catalog)")
    try:
        return coordinator_address(coordinator)
    except typer.BadParameter as error:
        raise ValueError(f"coordinator: {error.message}") from None


def checked_sink(state: SinkState, table: str, key: Sequence[str]) -> SinkIdentity:
    """Whose markers the sink's snapshots carry, once the table and key are the sink's (SinkMismatchError)."""
    if state.incarnation is None:
        raise SinkMismatchError(
            f"the coordinator does not say sink {state.sink}'s incarnation, which its snapshots carry: it predates "
            "fresh reads. Upgrade it"
        )
    tables = [each.table for each in state.tables] or [state.table]
    if table not in tables:
        raise SinkMismatchError(f"sink {state.sink} writes the table(s) {tables}, not {table!r}")
    if tuple(key) != state.key_columns:
        raise SinkMismatchError(
            f"the coordinator recorded sink {state.sink} with the key {list(state.key_columns)}, the flags give "
            f"{list(key)} (--mode and --key): give the sink's own"
        )
    return SinkIdentity(state.sink, state.incarnation, state.generation)


def json_row_schema(table_schema: pa.Schema, kafka_metadata: bool) -> pa.Schema:
    """The JSON values' fields as the sink decodes them now: the table's columns but the kafka_* ones it adds, in
    Spark's Arrow form (spark_arrow_types), as the sink's decoder holds them."""
    added = set(KAFKA_METADATA_COLUMNS) if kafka_metadata else set()
    return spark_arrow_schema(pa.schema([each for each in table_schema if each.name not in added]))


def tail_decoding(source: SinkSource, state: SinkState, table: str, table_schema: pa.Schema) -> TailDecoding:
    """How the sink turns the tail's records into the rows of `table`: the decoding its parser (job_records) starts
    with, built by the same functions (job_decoding)."""
    kafka, parse = source.kafka, source.parse
    routing = None
    if source.routes is not None:
        # Only the table read has a location here: the rows routed to any other table are left out.
        routing = TaskRouting(source.routes, state.table, {table: ""})
    if parse.record_format is RecordFormat.RAW:
        written = pa.schema([KAFKA_ARROW_SCHEMA.field(name) for name in RAW_COLUMNS])
        return TailDecoding(None, written, routing, table)
    if parse.record_format.registry_format is not None:
        decoding = registry_schemas(kafka, parse, state.sink).decoding
    else:
        decoder = json_decoder(
            json_values(parse, json_row_schema(table_schema, parse.kafka_metadata)),
            kafka_metadata=parse.kafka_metadata and not parse.mutations.keyed,
            time_zone=parse.json_time_zone,
        )
        decoding = RecordDecoding(decoder, parse.on_bad_record, dead_letter_target(kafka, parse, state.sink))
    if parse.mutations.keyed:
        keys = tombstone_keys(kafka, parse)
        decoding = mutation_decoding(decoding, parse.mutations, keep_positions=parse.kafka_metadata, registry_keys=keys)
        mutation_decoder = decoding.decoder
        assert isinstance(mutation_decoder, MutationDecoder)
        written = mutation_decoder.table_schema
    else:
        written = decoding.decoder.output_schema
    if not parse.evolve_schema:
        # The sink keeps the columns it started with, which the table has: a newer version's fields are not written.
        written = pa.schema([each for each in written if each.name in table_schema.names])
    return TailDecoding(decoding, written, routing, table)


def start_offsets(options: KafkaSourceOptions, earliest: Offsets, latest: Offsets, sink: str) -> Offsets:
    """Where the sink started, for a table that holds none of its epochs yet: its --starting-offsets."""
    if options.starting_offsets == "latest":
        raise ValueError(
            f"sink {sink} has committed nothing to the table yet and started at --starting-offsets latest: where it "
            "started is in its checkpoint, not in the table. Read again once its first epoch is committed"
        )
    return resolve_starting_offsets(options.starting_offsets, earliest, latest)


def read_both(
    head: TableHead, ranges: Sequence[OffsetRange], options: KafkaSourceOptions
) -> tuple[pa.Table, list[pa.RecordBatch]]:
    """The table's rows and the tail's records, read at once: pyiceberg's scan and each partition's consumer wait
    on storage and the broker, not on this interpreter."""
    with ThreadPoolExecutor(max_workers=min(MAX_READERS, 1 + len(ranges)), thread_name_prefix="fresh-read") as pool:
        table_rows = pool.submit(head.rows)
        tails = [pool.submit(lambda each: list(read_range(each, options)), each) for each in ranges]
        return table_rows.result(), [batch for tail in tails for batch in tail.result()]


def fresh_table(
    source: SinkSource, catalog: Catalog, client: CoordinatorClient, sink: str, table: str | None
) -> pa.Table:
    """The module's steps; the rows with the read's end offsets and snapshot in their schema's metadata."""
    began = time.monotonic()
    state = client.sink_state(sink)
    read_table = table or state.table
    identity = checked_sink(state, read_table, source.parse.mutations.key)
    options = parse_options(source.kafka.source_options())
    metadata = KafkaMetadata(options)
    earliest, latest = metadata.log_bounds(options.topics)
    head = table_head(catalog.load_table(read_table), identity)
    if head.end_offsets is None:
        start = start_offsets(options, earliest, latest, sink)
    else:
        check_topics(head.end_offsets, options.topics)
        start = head.end_offsets
    latest = with_table_ahead(start, latest, lambda: metadata.log_bounds(options.topics)[1])
    ranges = tail_ranges(start, earliest, latest, options.fail_on_data_loss)
    table_rows, records = read_both(head, ranges, options)
    decoding = tail_decoding(source, state, read_table, table_rows.schema)
    rows = fresh_rows(table_rows, records, decoding)
    ends = offsets_to_json(read_end_offsets(start, latest))
    log.info(
        "fresh read",
        sink=sink,
        table=read_table,
        snapshot_id=head.snapshot_id,
        epoch=head.epoch,
        table_rows=table_rows.num_rows,
        tail_records=sum(each.size for each in ranges),
        rows=rows.num_rows,
        seconds=round(time.monotonic() - began, 3),
    )
    described = {SNAPSHOT_END_OFFSETS: json.dumps(ends, separators=(",", ":"), sort_keys=True)}
    if head.snapshot_id is not None:
        described[SNAPSHOT_ID_METADATA] = str(head.snapshot_id)
    return rows.replace_schema_metadata(described)
