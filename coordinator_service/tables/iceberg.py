"""Everything the coordinator does to Iceberg tables, through pyiceberg.

Pre-commit metadata from Parquet footers, the idempotent marker-carrying
append, the ancestry walk that finds what a sink already committed, and the
deletion of files that no snapshot references. All functions are blocking:
the protocol runs them in worker threads.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import posixpath
import stat
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    ValidationError,
)
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    StatisticsCollector,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CreateTableTransaction, StagedTable, Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import update_table_metadata
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.typedef import EMPTY_DICT, Record, TableVersion
from pyiceberg.types import PrimitiveType, StructType

from coordinator_service.contract import partition_syntax
from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables.keyed_tables import check_table_key, keyed_schema, new_keyed_table_properties
from coordinator_service.tables.precommit_files import FileChecks, FileFacts
from coordinator_service.tables.pyiceberg_internals import check_file_schema, evolved_schema, partition_values
from coordinator_service.tables.table_origin import CREATED, ORIGIN

# A table as loaded from the catalog. The engine holds it and hands it to this package's functions; it names no
# pyiceberg type itself (tests/unit/test_package_layers.py).
LoadedTable: TypeAlias = Table

log = structlog.get_logger(__name__)

MARKER_SINK = "sink-coordinator.sink"
MARKER_EPOCH = "sink-coordinator.epoch"
MARKER_COMMIT_ID = "sink-coordinator.commit-id"
# Absent on snapshots written before generations existed: those count as generation 0.
MARKER_GENERATION = "sink-coordinator.generation"
# The sink row's incarnation (a UUID); absent on snapshots written before incarnations existed.
MARKER_SINK_ID = "sink-coordinator.sink-id"
# A fence snapshot (no row changed) an operator's abort or reset committed, by which sink and why.
FENCE_SINK = "sink-coordinator.fence"
FENCE_SINK_ID = "sink-coordinator.fence.sink-id"
FENCE_REASON = "sink-coordinator.fence.reason"

# Table schema versions whose file-description rules are kept (the oldest is dropped first).
_FILE_RULES_KEPT = 256

# Where a new table's metadata is built in memory, to be checked before anything is created.
_CHECK_LOCATION = "memory://sink-coordinator/check"


@dataclass(frozen=True)
class SinkIdentity:
    """Which markers are a sink's own: its name, incarnation and generation (see sink_markers)."""

    name: str
    incarnation: str
    generation: int
    # Markers without an incarnation (written before incarnations existed) count as this sink's.
    legacy_markers: bool = False

    def owns(self, summary: Mapping[str, str]) -> bool | None:
        """True: this sink's marker; False: the marker of an earlier incarnation or generation of its
        name (nothing older is its own); None: not a marker of this name."""
        if summary.get(MARKER_SINK) != self.name:
            return None
        incarnation = summary.get(MARKER_SINK_ID)
        if incarnation is None and not self.legacy_markers:
            return False
        if incarnation is not None and incarnation != self.incarnation:
            return False
        return int(str(summary.get(MARKER_GENERATION, "0"))) == self.generation

    def marker(self, epoch: int, commit_id: str) -> dict[str, str]:
        return {
            MARKER_SINK: self.name,
            MARKER_SINK_ID: self.incarnation,
            MARKER_EPOCH: str(epoch),
            MARKER_COMMIT_ID: commit_id,
            MARKER_GENERATION: str(self.generation),
        }


@dataclass(frozen=True)
class DescribedFiles:
    """A pre-commit's files of one table, validated: their manifest entries, and when the oldest was written (Unix
    seconds; where storage does not tell, when it was checked), from which its claim's deadline counts."""

    entries: list[DataFileEntry]
    written_at: float | None


@dataclass(frozen=True)
class Marker:
    """A snapshot the coordinator wrote for a sink: every epoch up to `epoch` is in it or below it."""

    epoch: int
    snapshot_id: int


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


def decode_arrow_schema(serialized: bytes) -> pa.Schema:
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(serialized))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as error:
        raise InvalidArgument(
            f"arrow_schema is not an Arrow IPC-serialized schema ({cause(error)}); send schema.serialize()"
        ) from error
    for name in _field_names(schema):
        if "\x00" in name:
            raise InvalidArgument(f"arrow_schema: the field name {quote(name)} contains a NUL character")
    return schema


def _field_names(fields: Iterable[pa.Field]) -> Iterator[str]:
    """The names of the fields and of every field nested in them (struct fields, list items, map keys and values)."""
    for column in fields:
        yield column.name
        kind = column.type
        if pa.types.is_struct(kind):
            yield from _field_names(kind.fields)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            yield from _field_names([kind.value_field])
        elif pa.types.is_map(kind):
            yield from _field_names([kind.key_field, kind.item_field])


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
        self._file_checks = FileChecks(orphan_grace_seconds)
        self._cache: dict[str, tuple[float, Table]] = {}
        self._file_rules: dict[_RulesKey, _FileRules] = {}

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
                _check_writer_schema(table, identifier, schema, written_by)
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
                schema=Catalog._convert_schema_if_needed(schema),
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
        files = self._file_checks.check(table.io, uris, facts, directory)
        if evolve_schema:
            table = self._evolve_for(table, [file.footer.schema.to_arrow_schema() for file in files])
        return DescribedFiles(
            entries=[
                self._entry_from_footer(table.metadata, file.path, file.footer, file.size, writer_id) for file in files
            ],
            written_at=min((file.written_at(checked_at) for file in files), default=None),
        )

    def _rules(self, metadata: TableMetadata) -> _FileRules:
        key = _FileRules.key_of(metadata)
        rules = self._file_rules.get(key)
        if rules is None:
            if len(self._file_rules) >= _FILE_RULES_KEPT:
                self._file_rules.pop(next(iter(self._file_rules)), None)
            rules = self._file_rules[key] = _FileRules.of(key, metadata)
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
        misfit = _schema_misfit(_FitKey(rules.key, footer.schema.to_arrow_schema().serialize().to_pybytes(), rules))
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
                None if value is None else to_bytes(_primitive(field.field_type), value)
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
        transaction = MetadataOnceTransaction(table)
        wanted = dict(properties)
        if table.metadata.name_mapping() is None:
            wanted[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
        changed = {key: value for key, value in wanted.items() if table.metadata.properties.get(key) != value}
        if changed:
            transaction.set_properties(changed)
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


class MetadataOnceTransaction(Transaction):
    """pyiceberg's transaction, computing the metadata it stands for once per change instead of at every read.

    pyiceberg's ``table_metadata`` applies the transaction's updates and deep-copies the whole table metadata each
    time it is read: about 15 times in one append, each copy growing with the table's snapshot list (an append of
    one file on a 60-snapshot table spent 68 ms of its 110 ms, profiled, in those copies). The metadata is a frozen
    model that pyiceberg replaces rather than changes, so the one copy computed for the current base and updates
    (each change makes new objects of them) serves every read until they change.
    """

    _computed: tuple[TableMetadata, tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        computed = self._computed
        if computed is None or computed[0] is not base or computed[1] is not updates:
            computed = self._computed = (base, updates, update_table_metadata(base, updates))
        return computed[2]


def without_retries(table: Table) -> Table:
    """A copy of the table whose commits pyiceberg does not retry by itself: its retry re-applies the change to
    whatever the table has become, where the coordinator must look again (markers, plans) on a fresh load."""
    table = copy.copy(table)
    table.metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
    )
    return table


def canonical_uri(path: str) -> str:
    """The one spelling of a data file path the log keeps: a URI, file:// for local paths, normalized."""
    if not path:
        raise InvalidArgument("a data file path is empty")
    if "\x00" in path:
        raise InvalidArgument(f"data file path {quote(path)} contains a NUL character")
    parsed = urlparse(path)
    if ".." in parsed.path.split("/"):
        raise InvalidArgument(f"data file path {quote(path)} contains '..': send the normalized path")
    if not posixpath.isabs(parsed.path):
        raise InvalidArgument(f"data file path {quote(path)} is relative: send an absolute path or URI")
    scheme = parsed.scheme or "file"
    return f"{scheme}://{parsed.netloc}{posixpath.normpath(parsed.path)}"


def misplaced(uri: str, directories: Sequence[str]) -> str | None:
    """Why the canonical `uri` is not a file under one of `directories` (URIs), or None when it is one: on the same
    storage, below the directory, and on a local file system reached through no symbolic link (its real path is
    under the directory's real path, at the same place, and it is not a link itself). What pre-commits accept and
    what deletions require (coordinator_service.engine.file_deletion)."""
    parsed = urlparse(uri)
    for directory in directories:
        root = urlparse(canonical_uri(directory))
        if (parsed.scheme, parsed.netloc) != (root.scheme, root.netloc):
            continue
        if not parsed.path.startswith(root.path.rstrip("/") + "/"):
            continue
        if parsed.scheme == "file" and _linked(parsed.path, root.path):
            return f"is reached through a symbolic link (its real path is {os.path.realpath(parsed.path)}) under"
        return None
    return "lies outside"


def _linked(path: str, root: str) -> bool:
    """A local path that is a symbolic link, or reached through one below `root`."""
    real, real_root = os.path.realpath(path), os.path.realpath(root).rstrip("/")
    if real[len(real_root) :] != path[len(root.rstrip("/")) :] or not real.startswith(real_root + "/"):
        return True
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # missing, or a name no file can have: whether it exists is checked on its own
        return False


def check_inside_location(
    uri: str, location: str, *, subject: str = "data file", within: str = "the table location"
) -> None:
    problem = misplaced(uri, [location])
    if problem is not None:
        raise InvalidArgument(f"{subject} {quote(uri)} {problem} {within} {location}")


def _primitive(field_type: object) -> PrimitiveType:
    assert isinstance(field_type, PrimitiveType), f"partition field of type {field_type} is not primitive"
    return field_type


def entry_data_file(metadata: TableMetadata, entry: DataFileEntry) -> DataFile:
    """A pre-commit's entry as the manifest entry's data file, in the table's partition spec it was described for."""
    spec = metadata.specs()[entry.spec_id]
    partition_type = spec.partition_type(metadata.schema())
    partition = Record(
        *(
            None if value is None else from_bytes(_primitive(field.field_type), value)
            for field, value in zip(partition_type.fields, entry.partition, strict=True)
        )
    )
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=entry.path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=entry.record_count,
        file_size_in_bytes=entry.file_size_in_bytes,
        column_sizes=entry.column_sizes,
        value_counts=entry.value_counts,
        null_value_counts=entry.null_value_counts,
        nan_value_counts=entry.nan_value_counts,
        lower_bounds=entry.lower_bounds,
        upper_bounds=entry.upper_bounds,
        split_offsets=None if entry.split_offsets is None else list(entry.split_offsets),
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    data_file.spec_id = entry.spec_id  # not a field of the manifest entry: from_args drops it
    return data_file


# A table's schema, spec, format version and properties: what describing one of its files depends on.
_RulesKey = tuple[uuid.UUID, int, int, int, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class _FileRules:
    """How files of one table schema and spec are described: computed once, not per pre-committed file."""

    key: _RulesKey
    format_version: TableVersion
    schema: Schema
    spec: PartitionSpec
    partition_type: StructType
    statistics_plan: dict[int, StatisticsCollector]
    column_mapping: dict[str, int]

    @staticmethod
    def key_of(metadata: TableMetadata) -> _RulesKey:
        return (
            metadata.table_uuid,
            metadata.current_schema_id,
            metadata.default_spec_id,
            metadata.format_version,
            tuple(sorted(metadata.properties.items())),
        )

    @classmethod
    def of(cls, key: _RulesKey, metadata: TableMetadata) -> _FileRules:
        schema = metadata.schema()
        spec = metadata.spec()
        return cls(
            key=key,
            format_version=metadata.format_version,
            schema=schema,
            spec=spec,
            partition_type=spec.partition_type(schema),
            statistics_plan=compute_statistics_plan(schema, metadata.properties),
            column_mapping=parquet_path_to_id_mapping(schema),
        )


@dataclass(frozen=True)
class _FitKey:
    """A file's Arrow schema (serialized, with its field ids) against one table schema."""

    rules_key: _RulesKey
    file_schema: bytes
    rules: _FileRules = field(compare=False, hash=False, repr=False)


def _check_writer_schema(table: Table, identifier: str, schema: pa.Schema, written_by: Sequence[str]) -> None:
    """Refuse a writer's schema whose files the table would refuse, as registering leaves the table: with the new
    columns added (_add_missing_columns) when there are any. pyiceberg's union_by_name, applied in memory (its
    evolved_schema: nothing is committed), refuses a type that cannot change."""
    known = set(table.schema().column_names)
    new = [name for name in schema.names if name not in known]
    writers = ", ".join(written_by)
    whose = f", which sink {writers} writes" if len(written_by) == 1 else f", which sinks {writers} write"
    refusal = f"the writer's schema does not fit table {quote(identifier)}{whose if written_by else ''}"
    advice = "Write a table of its own, or a schema that fits this one. Nothing was changed"
    try:
        evolved = evolved_schema(table.update_schema().union_by_name(schema))
    except (ValueError, ValidationError) as error:
        adding = f"it cannot add the columns {quote(', '.join(new))}, or change one: " if new else ""
        raise InvalidArgument(f"{refusal}: {adding}{cause(error).rstrip('.')}. {advice}") from None
    try:
        check_file_schema(evolved if new else table.schema(), schema, format_version=table.format_version)
    except ValueError as error:
        raise InvalidArgument(f"{refusal}: {flat_misfit(str(error), 'the writer')}. {advice}") from None


def flat_misfit(text: str, theirs: str) -> str:
    """pyiceberg's schema mismatch on one line: its table's rows marked ❌ (a table field and `theirs`, the data's),
    or the text itself when it has no table."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 3:
            continue
        if cells[0]:
            rows.append(cells)
        elif rows:  # a cell wrapped onto the next line
            rows[-1] = [" ".join(filter(None, pair)) for pair in zip(rows[-1], cells, strict=True)]
    mismatched = [f"{table} ({theirs}: {data})" for mark, table, data in rows if mark == "❌"]
    return "mismatched fields: " + "; ".join(mismatched) if mismatched else " ".join(text.split())


@functools.lru_cache(maxsize=1024)
def _schema_misfit(key: _FitKey) -> str | None:
    """Why files of this Arrow schema do not fit the table schema, or None: the writers of a stream write
    files of the same few schemas, so the check runs once per schema, not per file."""
    file_schema = pa.ipc.read_schema(pa.py_buffer(key.file_schema))
    try:
        check_file_schema(key.rules.schema, file_schema, format_version=key.rules.format_version)
    except ValueError as error:
        return flat_misfit(str(error), "the file")
    return None
