"""Everything the coordinator does to Iceberg tables, through pyiceberg.

The gateway: tables loaded and remembered, created and evolved, pre-commit
metadata from Parquet footers (data_file_entries.py holds the rules), the
idempotent marker-carrying append (markers.py: what a snapshot says), the
ancestry walk that finds what a sink already committed, and the fence. Where a
file may lie is file_paths.py; whether a schema fits, schema_fit.py. All
functions are blocking: the engine runs them in worker threads (catalog_calls).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.conversions import to_bytes
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
)
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    data_file_statistics_from_parquet_metadata,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import CreateTableTransaction, StagedTable, Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.typedef import EMPTY_DICT

from coordinator_service.contract import partition_syntax
from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables import key_files, table_origin
from coordinator_service.tables.data_file_entries import FileRules, RulesKey, entry_data_file, primitive
from coordinator_service.tables.file_paths import check_inside_location
from coordinator_service.tables.format import TableIdentity
from coordinator_service.tables.key_files import DescribedKeyFiles
from coordinator_service.tables.keyed_tables import check_table_key, keyed_schema, new_keyed_table_properties
from coordinator_service.tables.markers import (
    FENCE_REASON,
    FENCE_SINK,
    FENCE_SINK_ID,
    MARKER_COMMIT_ID,
    MARKER_EPOCH,
    Marker,
    SinkIdentity,
)
from coordinator_service.tables.precommit_files import FileChecks, FileFacts
from coordinator_service.tables.pyiceberg_internals import MetadataOnceTransaction, iceberg_schema, partition_values
from coordinator_service.tables.schema_fit import FitKey, check_writer_schema, schema_misfit
from coordinator_service.tables.table_origin import CREATED, ORIGIN

log = structlog.get_logger(__name__)

# Where a new table's metadata is built in memory, to be checked before anything is created.
_CHECK_LOCATION = "memory://sink-coordinator/check"


# Table schema versions whose file-description rules are kept (the oldest is dropped first).
_FILE_RULES_KEPT = 256


@dataclass(frozen=True)
class DescribedFiles:
    """A pre-commit's files of one table, validated: their manifest entries, and when the oldest was written (Unix
    seconds; where storage does not tell, when it was checked), from which its claim's deadline counts."""

    entries: list[DataFileEntry]
    written_at: float | None


def parse_partition_field(text: str) -> tuple[str, Transform[Any, Any]]:
    """'region', 'day(ts)', 'truncate(4, name)' -> (source column, transform); the syntax is partition_syntax's."""
    spec = partition_syntax.parse_partition_field(text)
    if spec.transform == "truncate":
        return spec.source, TruncateTransform(int(str(spec.width)))
    transforms: dict[str, Transform[Any, Any]] = {
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
    }
    return spec.source, transforms[spec.transform]


class IcebergGateway:
    """The Iceberg side of the commit protocol, over one pyiceberg catalog (named apart from pyiceberg's own
    `IcebergTables`, the SQL catalog's table model).

    Table metadata is cached per table for `cache_seconds` (0: no cache), and replaced by the
    result of every commit this process makes. Users of a cached table must tolerate staleness:
    the pre-commit validates again on a fresh table before it refuses a file, and the committer's
    append asserts the branch head it walked, so a stale base fails the commit instead of
    appending twice (see docs/architecture.md, "The table-metadata cache").
    """

    def __init__(self, catalog: Catalog, cache_seconds: float = 0.0, orphan_grace_seconds: float = math.inf) -> None:
        self.catalog = catalog
        self.cache_seconds = cache_seconds
        self.file_checks = FileChecks(orphan_grace_seconds)
        self._cache: dict[str, tuple[float, Table]] = {}
        self._file_rules: dict[RulesKey, FileRules] = {}

    def cached(self, identifier: str) -> tuple[Table, bool]:
        """The table from the cache if it is young enough, else freshly loaded; and whether it came from the cache."""
        entry = self._cache.get(identifier)
        if entry is not None and time.monotonic() - entry[0] < self.cache_seconds:
            return entry[1], True
        return self.load(identifier), False

    def remember(self, identifier: str, table: Table) -> None:
        if self.cache_seconds > 0:
            self._cache[identifier] = (time.monotonic(), table)

    def forget(self, identifier: str) -> None:
        self._cache.pop(identifier, None)

    def last_known(self, identifier: str) -> Table | None:
        """The table as this process last loaded or committed it, however old; no catalog call."""
        entry = self._cache.get(identifier)
        return None if entry is None else entry[1]

    @property
    def catalog_name(self) -> str:
        return str(self.catalog.name)

    @property
    def nested_namespaces(self) -> bool:
        """Whether the catalog holds nested namespaces (lake.shop.orders): the SQL, Hive and Glue catalogs do not."""
        return not isinstance(self.catalog, MetastoreCatalog)

    def exists(self, identifier: str) -> bool:
        return bool(self.catalog.table_exists(identifier))

    def drop(self, identifier: str) -> None:
        self.catalog.drop_table(identifier)
        self.forget(identifier)

    def identity(self, table: Table) -> TableIdentity:
        return TableIdentity(table.metadata.table_uuid, str(table.location()))

    def snapshot_count(self, table: Table) -> int:
        return len(table.metadata.snapshots)

    def require_takeable(self, identifier: str) -> None:
        table_origin.require_takeable(self, identifier)

    def read_key_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        facts: Mapping[str, FileFacts],
        directory: str = "",
    ) -> DescribedKeyFiles:
        return key_files.read_key_files(self, identifier, uris, writer_id, facts, directory)

    def load(self, identifier: str) -> Table:
        """The table as the catalog has it now (and remembered in the cache)."""
        try:
            table = self.catalog.load_table(parse_table_identifier(identifier))
        except NoSuchTableError as error:
            self.forget(identifier)
            raise InvalidArgument(
                f"table {identifier} does not exist in catalog {self.catalog_name}: create it, or register "
                "the writer with the table's schema so that the coordinator creates it"
            ) from error
        self.remember(identifier, table)
        return table

    def ensure_table(
        self,
        identifier: str,
        schema: pa.Schema | None,
        partition_by: Sequence[str],
        written_by: Sequence[str] = (),
        key: Sequence[str] = (),
    ) -> str:
        """Create the table when missing (given a schema), add new columns when present; return its location. The
        name went through the name policy, or the log records it from before the policy (the protocol's to say).

        A present table's schema must take the writer's files (InvalidArgument, nothing changed, naming the other
        sinks that write it, `written_by`): the same check the pre-commit makes of each file, before Spark writes
        one. Given a `key` (the columns of an upsert or change stream's key), the table is keyed
        (coordinator_service.tables.keyed_tables): created as format v2 with those identifier fields, or refused
        when present with another key."""
        parts = parse_table_identifier(identifier)
        fields = [parse_partition_field(text) for text in partition_by]
        try:
            table = self.catalog.load_table(parts)
        except NoSuchTableError:
            if schema is None:
                raise InvalidArgument(
                    f"table {quote(identifier)} does not exist in catalog {self.catalog_name} and the writer sent no "
                    "schema to create it: create the table, or send arrow_schema"
                ) from None
            table = self._create_table(parts, schema, fields, key)
        else:
            if key:
                check_table_key(table, key)
            if schema is not None:
                check_writer_schema(table, identifier, schema, written_by)
                self._add_missing_columns(table, schema)
        self.forget(identifier)  # the schema may have just changed
        return str(table.location())

    def _create_table(
        self,
        parts: tuple[str, ...],
        arrow_schema: pa.Schema,
        fields: list[tuple[str, Transform[Any, Any]]],
        key: Sequence[str],
    ) -> Table:
        schema = keyed_schema(arrow_schema, key) if key else arrow_schema
        self._check_new_table(parts, schema, fields)
        namespace = parts[:-1]
        try:
            self.catalog.create_namespace(namespace)
        except Exception:
            # Another registration created it first: the SQL catalog says so with its database's unique-key
            # error rather than NamespaceAlreadyExistsError when both checked before either inserted.
            if not self.catalog.namespace_exists(namespace):
                raise
        try:
            properties = {ORIGIN: CREATED, **(new_keyed_table_properties() if key else {})}
            with self.catalog.create_table_transaction(parts, schema=schema, properties=properties) as transaction:
                _describe_new_table(transaction, fields)
            log.info("created iceberg table", table=".".join(parts), partition_by=[str(f) for f in fields])
        except Exception:
            if not self.catalog.table_exists(parts):  # likewise for the table
                raise
        return self.catalog.load_table(parts)

    def _check_new_table(
        self, parts: tuple[str, ...], schema: pa.Schema | Schema, fields: list[tuple[str, Transform[Any, Any]]]
    ) -> None:
        """Build the new table's metadata in memory, as _create_table does, so that a schema or a partitioning
        pyiceberg refuses is refused before the namespace or the table is created."""
        names = schema.names if isinstance(schema, pa.Schema) else schema.column_names
        missing = [source for source, _ in fields if source not in names]
        if missing:
            raise InvalidArgument(
                f"partition columns {quote(', '.join(missing))} are not in arrow_schema, whose columns are "
                f"{quote(', '.join(names))}"
            )
        try:
            metadata = new_table_metadata(
                schema=schema if isinstance(schema, Schema) else iceberg_schema(schema),
                partition_spec=UNPARTITIONED_PARTITION_SPEC,
                sort_order=UNSORTED_SORT_ORDER,
                location=_CHECK_LOCATION,
                properties={},
            )
            staged = StagedTable(parts, metadata, f"{_CHECK_LOCATION}/metadata.json", PyArrowFileIO(), self.catalog)
            _describe_new_table(CreateTableTransaction(staged), fields)
        except ValueError as error:
            raise InvalidArgument(
                f"table {quote('.'.join(parts))} cannot be created from the writer's arrow_schema and "
                f"partition_by: {cause(error)}"
            ) from error

    def _add_missing_columns(self, table: Table, schema: pa.Schema) -> None:
        known = set(table.schema().column_names)
        new = [name for name in schema.names if name not in known]
        if not new:
            return
        try:
            with table.update_schema() as update:
                update.union_by_name(schema)
        except ValueError as error:  # raised before the commit: nothing changed
            raise InvalidArgument(
                f"table {quote('.'.join(table.name()))} cannot add the columns {quote(', '.join(new))}: {cause(error)}"
            ) from error
        log.info("added columns to iceberg table", table=".".join(table.name()), columns=new)

    def read_data_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        evolve_schema: bool,
        facts: Mapping[str, FileFacts] = EMPTY_DICT,
        directory: str = "",
    ) -> DescribedFiles:
        """Validate the files (canonical URIs) of a pre-commit and build their manifest entries.

        The entries come from the Parquet footers (the ones the writer sent in `facts`, else read from storage);
        the data pages are not read; `directory` (or "") holds every file, listed once to check them. Raises
        InvalidArgument naming the first bad file. A cached table may lag behind a change another writer made
        (a new column): a file refused on it, or an evolution that conflicts, is tried once more on the table
        freshly loaded.
        """
        table, from_cache = self.cached(identifier)
        if not from_cache:
            return self._read_data_files(table, uris, writer_id, evolve_schema, facts, directory)
        try:
            return self._read_data_files(table, uris, writer_id, evolve_schema, facts, directory)
        except (InvalidArgument, CommitFailedException):
            return self._read_data_files(self.load(identifier), uris, writer_id, evolve_schema, facts, directory)

    def _read_data_files(
        self,
        table: Table,
        uris: Sequence[str],
        writer_id: int,
        evolve_schema: bool,
        facts: Mapping[str, FileFacts],
        directory: str,
    ) -> DescribedFiles:
        # Only under the table's data directory: a writer never names the table's metadata files, or another
        # table's, since the coordinator deletes the files of an epoch it aborts (file_deletion).
        data = table.location_provider().data_path
        for uri in uris:
            check_inside_location(uri, data, within="the table's data directory")
        if directory:
            check_inside_location(directory, str(table.location()), subject="files_directory")
        checked_at = time.time()
        files = self.file_checks.check(table.io, uris, facts, directory)
        if evolve_schema:
            table = self._evolve_for(table, [file.footer.schema.to_arrow_schema() for file in files])
        return DescribedFiles(
            entries=[
                self._entry_from_footer(table.metadata, file.path, file.footer, file.size, writer_id) for file in files
            ],
            written_at=min((file.written_at(checked_at) for file in files), default=None),
        )

    def _rules(self, metadata: TableMetadata) -> FileRules:
        key = FileRules.key_of(metadata)
        rules = self._file_rules.get(key)
        if rules is None:
            if len(self._file_rules) >= _FILE_RULES_KEPT:
                self._file_rules.pop(next(iter(self._file_rules)), None)
            rules = self._file_rules[key] = FileRules.of(key, metadata)
        return rules

    def _evolve_for(self, table: Table, schemas: Iterable[pa.Schema]) -> Table:
        known = set(table.schema().column_names)
        for schema in schemas:
            if any(name not in known for name in schema.names):
                self._add_missing_columns(table, schema)
                table = self.load(".".join(table.name()))
                known = set(table.schema().column_names)
        return table

    def _entry_from_footer(
        self, metadata: TableMetadata, path: str, footer: pq.FileMetaData, size: int, writer_id: int
    ) -> DataFileEntry:
        rules = self._rules(metadata)
        misfit = schema_misfit(FitKey(rules.key, footer.schema.to_arrow_schema().serialize().to_pybytes(), rules))
        if misfit is not None:
            raise InvalidArgument(f"data file {quote(path)} does not fit the schema of the table: {misfit}")
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer,
            stats_columns=rules.statistics_plan,
            parquet_column_mapping=rules.column_mapping,
        )
        spec, partition_type = rules.spec, rules.partition_type
        try:
            partition = statistics.partition(spec, rules.schema)
        except ValueError as error:
            raise InvalidArgument(
                f"data file {quote(path)} cannot be placed in one partition of {spec}: {cause(error)}; "
                "write one file per partition"
            ) from error
        serialized = statistics.to_serialized_dict()
        return DataFileEntry(
            path=path,
            writer_id=writer_id,
            record_count=int(serialized["record_count"]),
            file_size_in_bytes=size,
            spec_id=spec.spec_id,
            partition=tuple(
                None if value is None else to_bytes(primitive(field.field_type), value)
                for field, value in zip(partition_type.fields, partition_values(partition), strict=True)
            ),
            column_sizes=dict(serialized["column_sizes"]),
            value_counts=dict(serialized["value_counts"]),
            null_value_counts=dict(serialized["null_value_counts"]),
            nan_value_counts=dict(serialized["nan_value_counts"]),
            lower_bounds=dict(serialized["lower_bounds"]),
            upper_bounds=dict(serialized["upper_bounds"]),
            split_offsets=None if serialized["split_offsets"] is None else tuple(serialized["split_offsets"]),
        )

    def sink_markers(
        self, identifier: str, sink: SinkIdentity, down_to_epoch: int, table: Table | None = None
    ) -> list[Marker]:
        """The sink's own markers on the current branch, oldest first, back to the first below `down_to_epoch`,
        or to a marker of its name that is not its own (an earlier incarnation or generation, whose epoch
        numbers mean nothing now): the walk stops there.

        On `table` when given (the committer's cached table), else on the table loaded now."""
        table = table if table is not None else self.load(identifier)
        markers: list[Marker] = []
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            owned = None if snapshot.summary is None else sink.owns(snapshot.summary)
            if owned is None:
                continue
            if not owned:
                break
            assert snapshot.summary is not None
            epoch = int(str(snapshot.summary.get(MARKER_EPOCH)))
            markers.append(Marker(epoch=epoch, snapshot_id=snapshot.snapshot_id))
            if epoch < down_to_epoch:
                break
        markers.reverse()
        return markers

    def append(
        self,
        identifier: str,
        sink: SinkIdentity,
        epoch: int,
        commit_id: str,
        entries: Sequence[DataFileEntry],
        table: Table | None = None,
        properties: Mapping[str, str] = EMPTY_DICT,
        summary: Mapping[str, str] = EMPTY_DICT,
    ) -> int:
        """Append the entries as one snapshot carrying the sink's marker and `summary`; return its id.

        `properties` are table properties the commit makes sure of (maintenance: manifest merging, old
        metadata files removed); with manifest merging on, the append merges the table's manifests once
        enough have accumulated (pyiceberg's merge append), else it is a fast append.
        pyiceberg's own retry of a conflicting commit would re-apply the append
        without looking at the markers, so it is turned off here: the caller's
        retry re-runs the ancestry check first. Given `table` (the one whose
        ancestry the caller walked), the append builds on it, and the commit
        asserts that the branch head is still that table's: a stale table fails
        with CommitFailedException rather than append on an unseen history.
        The committed table replaces the cached one; any failure drops it.
        """
        try:
            snapshot_id, committed = self._append(
                identifier, {**summary, **sink.marker(epoch, commit_id)}, entries, table, properties
            )
        except BaseException:
            self.forget(identifier)
            raise
        self.remember(identifier, committed)
        return snapshot_id

    def _append(
        self,
        identifier: str,
        markers: dict[str, str],
        entries: Sequence[DataFileEntry],
        table: Table | None,
        properties: Mapping[str, str],
    ) -> tuple[int, Table]:
        # A copy: the cached table object is shared with other threads and must not change under them.
        table = without_retries(
            table if table is not None else self.catalog.load_table(parse_table_identifier(identifier))
        )
        transaction = commit_transaction(table, properties)
        update = transaction.update_snapshot(snapshot_properties=markers)
        merge = transaction.table_metadata.properties.get(TableProperties.MANIFEST_MERGE_ENABLED) == "true"
        with update.merge_append() if merge else update.fast_append() as append:
            for entry in entries:
                append.append_data_file(entry_data_file(table.metadata, entry))
        committed = transaction.commit_transaction()
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        assert snapshot.summary is not None
        assert snapshot.summary.get(MARKER_COMMIT_ID) == markers[MARKER_COMMIT_ID]
        return int(snapshot.snapshot_id), committed

    def fence(self, identifier: str, sink: SinkIdentity, reason: str) -> int:
        """Commit a snapshot that changes no row and carries the sink's fence (no marker: marker walks pass over it),
        on the table loaded now; return its id. Any append built on the branch head before it fails its
        requirement instead of landing: an operator's abort or reset fences the sink's tables under the commit
        lock before it aborts anything whose files may then be deleted (docs/architecture.md, "The fence")."""
        try:
            table = without_retries(self.load(identifier))
            transaction = MetadataOnceTransaction(table)
            fence = {FENCE_SINK: sink.name, FENCE_SINK_ID: sink.incarnation, FENCE_REASON: reason[:500]}
            with transaction.update_snapshot(snapshot_properties=fence).fast_append():
                pass  # no file: the new head is the fence
            committed = transaction.commit_transaction()
        except BaseException:
            self.forget(identifier)
            raise
        self.remember(identifier, committed)
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        return int(snapshot.snapshot_id)


def _describe_new_table(transaction: Transaction, fields: list[tuple[str, Transform[Any, Any]]]) -> None:
    """A new table's partitioning and name mapping, on its creation transaction."""
    if fields:
        with transaction.update_spec() as spec:
            for source, transform in fields:
                spec.add_field(source, transform)
    name_mapping = transaction.table_metadata.schema().name_mapping
    transaction.set_properties({TableProperties.DEFAULT_NAME_MAPPING: name_mapping.model_dump_json()})


def without_retries(table: Table) -> Table:
    """A copy of the table whose commits pyiceberg does not retry by itself: its retry re-applies the change to
    whatever the table has become, where the coordinator must look again (markers, plans) on a fresh load."""
    table = copy.copy(table)
    table.metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
    )
    return table


def commit_transaction(table: Table, properties: Mapping[str, str]) -> MetadataOnceTransaction:
    """A transaction on the table that makes sure of `properties` (those a sink's commits keep: maintenance) and of a
    name mapping (files written by name, not by field id, read right): every commit of files opens one."""
    transaction = MetadataOnceTransaction(table)
    wanted = dict(properties)
    if table.metadata.name_mapping() is None:
        wanted[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
    changed = {key: value for key, value in wanted.items() if table.metadata.properties.get(key) != value}
    if changed:
        transaction.set_properties(changed)
    return transaction
