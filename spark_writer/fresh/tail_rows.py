"""The tail's Kafka records as the rows the sink will write, and the table's rows with them.

The sink's own steps, in its order, each the function the writer's tasks run:

1. decoding: the sink's RecordDecoding (kafka_records, mutations.decoding) turns each batch of Kafka records into
   rows; a record that does not fit fails the read (--on-bad-record fail, as it fails the sink's batch), becomes
   nulls (null), or is left out (dead-letter: the sink's dead letters are its own to send, a reader sends none);
2. an upsert or change stream's reduction (mutations.reduction.LastWins): the last record of each key wins;
3. fan-out (routing.split): only the rows routed to the table read; records no route takes fail the read under
   --unrouted fail, as they fail the sink's batch.

Appended rows are added to the table's; a keyed table's rows of the keys the tail touched are replaced by the tail's
winners (a deleted key's removed). Across the tail's records of one key in several partitions, the reduction's rule
decides as if the tail were one epoch (mutations.reduction: by timestamp); the sink decides the same unless those
records fall into different epochs, where the later epoch wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from spark_writer.formats.record_decoding import RAW_COLUMNS, RecordDecoding
from spark_writer.mutations.decoding import MutationDecoder
from spark_writer.mutations.reduction import LastWins
from spark_writer.routing.routes import UnroutedRecordsError
from spark_writer.routing.split import TaskRouting, record_origin, split_by_route


@dataclass(frozen=True)
class TailDecoding:
    """How the sink turns records into a table's rows: its decoding (None: raw records), the columns it writes, and
    its routes (None: no fan-out) to the `table` read."""

    decoding: RecordDecoding | None
    written: pa.Schema
    routing: TaskRouting | None
    table: str

    @property
    def key(self) -> tuple[str, ...]:
        decoder = None if self.decoding is None else self.decoding.decoder
        return decoder.mutations.key if isinstance(decoder, MutationDecoder) else ()

    def decoded(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
        """Step 1, batch by batch."""
        if self.decoding is None:
            for batch in batches:
                yield pa.Table.from_batches([batch.select(list(RAW_COLUMNS))])
            return
        task = self.decoding.start(send_dead_letters=False)
        for batch in batches:
            yield task.rows(batch)
        task.finish()

    def routed(self, rows: pa.Table) -> pa.Table:
        """Step 3: the rows routed to the table read."""
        if self.routing is None:
            return rows
        split = split_by_route(rows, self.routing)
        if split.unrouted:
            first = split.unrouted[0]
            origin = record_origin(rows, first.first_row, None) or "the tail"
            raise UnroutedRecordsError(
                f"{sum(each.records for each in split.unrouted)} record(s) whose route column "
                f"{self.routing.routes.column!r} no route takes ({first.description}, first at {origin}): the sink "
                "fails its batch on them (--unrouted fail), so the table will not hold them or anything after them"
            )
        return split.tables.get(self.table, rows.schema.empty_table())


def fresh_rows(table_rows: pa.Table, batches: Iterable[pa.RecordBatch], tail: TailDecoding) -> pa.Table:
    """The table's rows with the tail's (the module's rule)."""
    key = tail.key
    if not key:
        appended = [tail.routed(rows) for rows in tail.decoded(batches)]
        return _with_rows(table_rows, appended, tail.written)
    reduction = LastWins(key)
    for rows in tail.decoded(batches):
        reduction.add(rows)
    assert tail.decoding is not None
    reduced = reduction.result(tail.decoding.decoder.output_schema)
    kept = _without_keys(table_rows, tail.routed(reduced.keys), key)
    return _with_rows(kept, [tail.routed(reduced.rows)], tail.written)


def _without_keys(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    """`rows` but those of `keys`."""
    if keys.num_rows == 0 or rows.num_rows == 0:
        return rows
    key_schema = pa.schema([rows.schema.field(name) for name in key])
    return rows.join(keys.select(list(key)).cast(key_schema), keys=list(key), join_type="left anti")


def _with_rows(rows: pa.Table, added: Sequence[pa.Table], written: pa.Schema) -> pa.Table:
    """`rows` and the `added` rows of the sink's `written` columns, in one schema: a column the tail adds (the table
    evolves when it is committed) is null in the table's rows."""
    parts = [each.select(written.names).cast(written) for each in added if each.num_rows]
    if not parts:
        return rows
    return pa.concat_tables([rows, *parts], promote_options="permissive")
