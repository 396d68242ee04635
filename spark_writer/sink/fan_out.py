"""The driver's side of fan-out: a sink's route tables made sure of with the coordinator, and each batch's files
of every table.

A task can write a table's files only under that table's location, which the coordinator answers when it
makes sure of the table (EnsureTables: created from the data's schema when missing, given its new columns when
present, made one of the sink's tables, fenced by the writer term). So the locations must be known before the
tasks run:

* at start, the tables of the static routes are ensured; in dynamic mode, the tables the sink already has
  (GetSinkState), so that a restarted writer knows them all again;
* per batch, the tasks write every known table's rows and report the tables they had rows for without a
  location (dynamic mode: a table met for the first time). Only when there are some, the driver ensures them
  and runs the batch's write again, restricted to those tables' rows (the second pass). A batch that meets no
  new table, the steady state, costs one Spark job as without routes; a distinct pass ahead of every batch
  would cost a second job in each. The second pass reads the batch again (from Spark's cache when the
  transform persisted it, else from the source: the same offsets, the same records); only its files are
  taken, the first pass having counted the batch's records. A decoding's side effects run again in it: a
  batch that meets a new table sends its dead letters twice (their delivery is at least once anyway).

Invariants: every file of a batch goes in its one PreCommit, named with its table ("" for the sink's own, so
a sink without routes is unchanged on the wire); a batch that fails here (records no route takes under
Unrouted.FAIL, a refused EnsureTables, a table met only by the second pass) deletes every file it wrote, which
no pre-commit names, and changes nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

import grpc
import pyarrow as pa
import structlog
from pyspark.sql import DataFrame, Row

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError, TableSpec
from spark_writer.arrow_schema import serialize_schema
from spark_writer.routing.routes import Routes, UnroutedRecordsError
from spark_writer.routing.split import TaskRouting
from spark_writer.sink.parquet_writer import BatchTasks, DataFileTarget, append_tasks, delete_files
from spark_writer.sink.storage import Storage

log = structlog.get_logger(__name__)

# Tables one EnsureTables call names at most (the coordinator's limit).
MAX_TABLES_PER_ENSURE: Final = 1000
# Unrouted values a failing batch's message describes (the most frequent first).
MAX_VALUES_IN_MESSAGE: Final = 10


class FanOutUnsupportedError(RuntimeError):
    """The coordinator does not implement fan-out (EnsureTables)."""


class BatchChangedError(RuntimeError):
    """A batch's second pass routed rows the first did not see: the batch is not the same when read again."""


class FanOut:
    """A fan-out sink's tables and their locations, on the driver; one per running query."""

    def __init__(
        self,
        client: CoordinatorClient,
        sink: str,
        writer_term: int,
        routes: Routes,
        own_table: str,
        own_location: str,
        partition_by: Sequence[str],
        storage: Storage,
        *,
        nested_namespaces: bool = False,
        key_columns: tuple[str, ...] = (),
        tasks: BatchTasks = append_tasks,
    ) -> None:
        self._key_columns = key_columns  # an upsert or change stream's: each table keyed by it
        self._tasks = tasks
        self.routes = routes
        self._nested_namespaces = nested_namespaces  # the catalog's (RegisterWriter's answer)
        self._client = client
        self._sink = sink
        self._writer_term = writer_term
        self._own_table = own_table
        self._partition_by = tuple(partition_by)
        self._storage = storage
        self._locations = {own_table: own_location}

    def start(self, schema: pa.Schema) -> None:
        """Ensure the tables known before the first batch: the static routes', or in dynamic mode the sink's. The
        sink's own table is among them (RegisterWriter just did the same for it), so that a coordinator without
        fan-out is found out here, before any batch."""
        if self.routes.dynamic:
            known = tuple(table.table for table in self._client.sink_state(self._sink).tables)
        else:
            known = self.routes.static_tables
        self._ensure(tuple(dict.fromkeys((self._own_table, *known))), schema)

    def task_routing(self) -> TaskRouting:
        return TaskRouting(
            self.routes, self._own_table, dict(self._locations), nested_namespaces=self._nested_namespaces
        )

    def write(self, frame: DataFrame, target: DataFileTarget, batch_id: int) -> list[Row]:
        """Write the batch's rows into their tables (a second pass for tables new to this batch); return the first
        pass's rows (files, counts, positions) and the second's files."""
        assert target.routing is not None
        self.routes.check_schema(target.schema)
        results = self._tasks(frame, target).collect()
        files = [row for row in results if row.path is not None]
        try:
            self._check_unrouted(results, batch_id)
            new = sorted({row.table for row in results if row.path is None and row.table is not None})
            if new:
                log.info("batch meets new tables", sink=self._sink, epoch=batch_id, tables=new)
                self._ensure(new, target.schema)
                routing = dataclasses.replace(self.task_routing(), only=frozenset(new))
                again = self._tasks(frame, dataclasses.replace(target, routing=routing)).collect()
                files.extend(row for row in again if row.path is not None)
                self._check_second_pass(again, batch_id)
                results.extend(row for row in again if row.path is not None)
        except BaseException:
            delete_files([row.path for row in files], self._storage)
            raise
        return results

    def files_directory(self, target: DataFileTarget, files: Sequence[Row]) -> str:
        """The batch's directory when every file lies in one table (PreCommit's files_directory), else ""."""
        tables = {row.table or self._own_table for row in files} or {self._own_table}
        if len(tables) > 1:
            return ""
        (table,) = tables
        return target.at(self._locations[table]).files_directory

    def _check_unrouted(self, results: Sequence[Row], batch_id: int) -> None:
        counted: dict[str, tuple[int, str]] = {}
        for row in results:
            if row.unrouted is not None:
                records, origin = counted.get(row.unrouted, (0, row.unrouted_origin))
                counted[row.unrouted] = (records + row.unrouted_records, origin)
        if not counted:
            return
        ranked = sorted(counted.items(), key=lambda item: -item[1][0])
        described = [
            f"{value}: {records} record(s), the first from {origin}"
            for value, (records, origin) in ranked[:MAX_VALUES_IN_MESSAGE]
        ]
        if len(ranked) > MAX_VALUES_IN_MESSAGE:
            described.append(f"and {len(ranked) - MAX_VALUES_IN_MESSAGE} more values")
        total = sum(records for records, _ in counted.values())
        raise UnroutedRecordsError(self.routes.unrouted_error(batch_id, self._own_table, described, total))

    def _check_second_pass(self, again: Sequence[Row], batch_id: int) -> None:
        unseen = sorted({row.table for row in again if row.path is None and row.table is not None})
        unrouted = sum(row.unrouted_records for row in again if row.unrouted is not None)
        if unseen or unrouted:
            raise BatchChangedError(
                f"batch {batch_id} changed when read again: its second pass met tables {unseen} and {unrouted} "
                "unrouted records that the first did not. Fan-out needs a batch to be the same every time it is "
                "read (a deterministic transform); nothing of the batch was committed"
            )

    def _ensure(self, tables: Sequence[str], schema: pa.Schema) -> None:
        """EnsureTables for `tables`, in calls of at most MAX_TABLES_PER_ENSURE; their locations are then known."""
        serialized = serialize_schema(schema)
        for start in range(0, len(tables), MAX_TABLES_PER_ENSURE):
            specs = [
                TableSpec(table, serialized, self._partition_by, self._key_columns)
                for table in tables[start : start + MAX_TABLES_PER_ENSURE]
            ]
            try:
                ensured = self._client.ensure_tables(self._sink, self._writer_term, specs)
            except CoordinatorRpcError as error:
                if error.code is grpc.StatusCode.UNIMPLEMENTED:
                    raise FanOutUnsupportedError(
                        f"the coordinator at {self._client.target} does not implement fan-out (EnsureTables): "
                        "routes need a coordinator that does; without routes this writer works with it"
                    ) from error
                raise
            self._locations.update((each.table, each.location) for each in ensured.tables)
        log.info("tables ensured", sink=self._sink, tables=list(tables))
