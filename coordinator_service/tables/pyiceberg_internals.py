"""Every use of pyiceberg's private API, each under a name that says what the coordinator needs from it.

pyiceberg's public API does not offer these (yet): checking a file's schema against a table's without committing,
a schema evolution applied in memory, a partition record's values, one metadata request for a file's size and
modification time, writing data files of a table without appending them, a `replace` snapshot, the positions a
position delete file deletes, an Arrow schema as an Iceberg one, a row delta (data and position delete files in
one snapshot: pyiceberg writes no delete file), a transaction that computes its metadata once per change and without
a deep copy, a SQL catalog that does not read again a metadata file this process holds, and manifests read without
resolving their Avro schema again for every file. Each is
pinned by a test of its own in tests/unit/test_pyiceberg_internals.py, so that an upgrade that moves one fails there, by
name, before anything else; pyproject.toml pins pyiceberg to the minor release they were checked on."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar

import pyarrow as pa
import pyiceberg.manifest
from pyarrow.fs import FileInfo
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import _SCHEMA_KEY, META_SCHEMA, AvroFile, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import ValidationException
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFile, _check_pyarrow_schema_compatible, _dataframe_to_data_files, _read_deletes
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import CommitTableResponse, StagedTable, Table, TableProperties, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import (
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.snapshot import _MergeAppendFiles, _OverwriteFiles, _SnapshotProducer
from pyiceberg.typedef import EMPTY_DICT, Identifier, Record, StructProtocol
from pyiceberg.utils.datetime import datetime_to_millis


def check_file_schema(table_schema: Schema, file_schema: pa.Schema, format_version: int) -> None:
    """Raise ValueError when files of `file_schema` cannot be appended to a table of `table_schema` (a column the
    table requires that may hold nulls, a type that does not promote): the check pyiceberg's own append makes."""
    _check_pyarrow_schema_compatible(table_schema, file_schema, format_version=format_version)  # type: ignore[arg-type]


def iceberg_schema(arrow_schema: pa.Schema) -> Schema:
    """An Arrow schema as the Iceberg schema a table created from it starts with: its fields numbered from 1 in their
    order (pyiceberg's conversion leaves them all -1 until a table is created from it)."""
    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema))


def evolved_schema(update: UpdateSchema) -> Schema:
    """The schema `update` would commit, applied in memory only (nothing is committed)."""
    return update._apply()


def partition_values(partition: Record) -> tuple[Any, ...]:
    """A partition record's values in its fields' order."""
    return tuple(partition._data)


def file_info(input_file: PyArrowFile) -> FileInfo:
    """A file's size and modification time in one metadata request (len() asks for the size alone)."""
    return input_file._file_info()


def data_files_of(metadata: TableMetadata, rows: pa.Table, io: FileIO) -> Iterable[DataFile]:
    """Write `rows` as data files of the table (its schema's field ids, its partition spec, its target file size,
    their statistics) without appending them: nothing references them until a commit does. No rows, no file
    (pyiceberg's writer divides by the row count of an unpartitioned table's rows; its append writes none for them)."""
    if rows.num_rows == 0:
        return ()
    return _dataframe_to_data_files(metadata, rows, io, write_uuid=uuid.uuid4())


def added_entry(snapshot_id: int, data_file: DataFile) -> ManifestEntry:
    """A manifest entry of a file the snapshot adds (its sequence numbers inherited from the snapshot)."""
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=snapshot_id,
        sequence_number=None,
        file_sequence_number=None,
        data_file=data_file,
    )


class _AddsPositionDeletes:
    """A snapshot that adds position delete files besides data files (into delete manifests of its own); the class
    sets `_added_delete_files` empty when it is made."""

    _added_delete_files: list[DataFile]

    def add_delete_file(self, delete_file: DataFile) -> Self:
        if delete_file.content != DataFileContent.POSITION_DELETES:
            raise ValueError(f"a snapshot adds position delete files only, not {delete_file.content}")
        self._added_delete_files.append(delete_file)
        return self


class ReplaceFiles(_AddsPositionDeletes, _OverwriteFiles):
    """A snapshot with Iceberg's `replace` operation (no row changed, so incremental readers skip it): data files and
    position delete files removed (delete_data_file takes both), data files and position delete files added (a
    partition's delete files merged into one). pyiceberg writes overwrites of data files only and its summaries do not
    know `replace`: each manifest of the parent that holds a removed file is written again with the same content (data
    or deletes), its removed entries DELETED by this snapshot and the rest EXISTING, as Java's rewrite does (a follower
    of the table's snapshots, like the key index, reads what the snapshot removed from the manifests it wrote); the
    summary counts the files added and removed, each by its own spec."""

    def __init__(
        self, operation: Operation, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]
    ) -> None:
        super().__init__(operation, transaction, io, snapshot_properties=snapshot_properties)
        self._added_delete_files = []

    def _manifests(self) -> list[ManifestFile]:
        """The parent's manifests that hold no removed file, as they are; and one manifest per content and spec for
        the rest: the added files, and the entries of every parent manifest that holds a removed file (EXISTING, or
        DELETED by this snapshot). One manifest for those, not one per parent manifest: a compaction's small files are
        spread over many manifests, and each manifest written costs a file and its Avro schema."""
        default_spec_id = self._transaction.table_metadata.default_spec_id
        entries: dict[tuple[ManifestContent, int], list[ManifestEntry]] = defaultdict(list)
        entries[(ManifestContent.DATA, default_spec_id)] = [
            added_entry(self._snapshot_id, data_file) for data_file in self._added_data_files
        ]
        for delete_file in self._added_delete_files:
            entries[(ManifestContent.DELETES, delete_file.spec_id)].append(added_entry(self._snapshot_id, delete_file))
        kept = self._parent_manifests_without_removed(entries)
        written: list[ManifestFile] = []
        for (content, spec_id), group in entries.items():
            if not group:
                continue
            writer_for = self.new_manifest_writer if content == ManifestContent.DATA else self._deletes_writer
            with writer_for(self.spec(spec_id)) as writer:
                for entry in group:
                    writer.add_entry(entry)
            written.append(writer.to_manifest_file())
        return written + kept

    def _parent_manifests_without_removed(
        self, rewritten: dict[tuple[ManifestContent, int], list[ManifestEntry]]
    ) -> list[ManifestFile]:
        """The parent's manifests that hold no removed file; the entries of the others into `rewritten`, by content
        and spec: each removed file DELETED by this snapshot, the rest EXISTING."""
        parent = (
            None
            if self._parent_snapshot_id is None
            else self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        )
        manifests: list[ManifestFile] = []
        found: set[str] = set()
        removed = {data_file.file_path for data_file in self._deleted_data_files}
        for manifest in [] if parent is None else parent.manifests(self._io):
            entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
            if not any(entry.data_file.file_path in removed for entry in entries):
                manifests.append(manifest)
                continue
            for entry in entries:
                gone = entry.data_file.file_path in removed
                if gone:
                    found.add(entry.data_file.file_path)
                rewritten[(manifest.content, manifest.partition_spec_id)].append(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.DELETED if gone else ManifestEntryStatus.EXISTING,
                        snapshot_id=self._snapshot_id if gone else entry.snapshot_id,
                        sequence_number=entry.sequence_number,
                        file_sequence_number=entry.file_sequence_number,
                        data_file=entry.data_file,
                    )
                )
        if missing := sorted(removed - found):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        return manifests

    def _deletes_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return position_delete_manifest_writer(self, spec)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        default_spec_id = self._transaction.table_metadata.default_spec_id
        added = [
            *((data_file, default_spec_id) for data_file in self._added_data_files),
            *((delete_file, delete_file.spec_id) for delete_file in self._added_delete_files),
        ]
        # pyiceberg's totals know no `replace`: computed as for an overwrite of the same files, then labelled.
        summary = collected_summary(self, added, self._deleted_data_files, Operation.OVERWRITE, snapshot_properties)
        return Summary(Operation.REPLACE, **summary.additional_properties)


def replace_files(
    table: Table,
    replaced: Sequence[DataFile],
    written: Sequence[DataFile],
    marker: dict[str, str],
    deletes_dropped: Sequence[DataFile] = (),
    deletes_added: Sequence[DataFile] = (),
) -> Table:
    """Commit one `replace` snapshot on `table` as loaded: `replaced` data files and `deletes_dropped` position delete
    files out, `written` data files and `deletes_added` position delete files in, `marker` in its summary."""
    transaction = coordinator_transaction(table)
    rewrite = ReplaceFiles(Operation.OVERWRITE, transaction, table.io, snapshot_properties=marker)
    with rewrite:
        for data_file in (*replaced, *deletes_dropped):
            rewrite.delete_data_file(data_file)
        for data_file in written:
            rewrite.append_data_file(data_file)
        for delete_file in deletes_added:
            rewrite.add_delete_file(delete_file)
    return transaction.commit_transaction()


def pyiceberg_deleted_positions(io: FileIO, delete_file: DataFile) -> dict[str, pa.ChunkedArray]:
    """The row positions a position delete file (Parquet, ORC, or a v3 deletion vector) deletes, by data file path:
    pyiceberg's own reading of it, as its scans apply it."""
    return _read_deletes(io, delete_file)


class _PositionDeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files: `deletes` in its entry of the manifest list and in its own metadata."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def position_delete_manifest_writer(producer: _SnapshotProducer[Any], spec: PartitionSpec) -> ManifestWriter:
    """A writer of one of the producer's new manifests of position delete files, of partition spec `spec`."""
    return _PositionDeleteManifestWriter(
        spec, producer.schema(), producer.new_manifest_output(), producer._snapshot_id, producer._compression
    )


class RowDelta(_AddsPositionDeletes, _MergeAppendFiles):
    """Iceberg's row delta (Java's `newRowDelta()`): data files and position delete files added in one snapshot,
    nothing removed, the table's manifests merged as its merge properties say. Each file goes to a manifest of its
    own partition spec; the delete files to manifests of content `deletes`. The operation is Java's: `append` when
    only data files are added, `delete` when only delete files, `overwrite` when both (rows replaced).

    Its commit asserts the branch head the transaction's table is at, like every pyiceberg snapshot; pyiceberg's
    retry would rebuild it on a newer head whose rows the positions were never resolved against, so the caller
    commits it on a table whose retries are off."""

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(Operation.OVERWRITE, transaction, io, snapshot_properties=snapshot_properties)
        self._added_delete_files = []

    def _manifests(self) -> list[ManifestFile]:
        added = self._added_manifests(self._added_data_files, self.new_manifest_writer)
        added += self._added_manifests(self._added_delete_files, self._new_delete_manifest_writer)
        return self._process_manifests(added + self._existing_manifests())

    def _new_delete_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return position_delete_manifest_writer(self, spec)

    def _added_manifests(
        self, files: Sequence[DataFile], writer_for: Callable[[PartitionSpec], ManifestWriter]
    ) -> list[ManifestFile]:
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for data_file in files:
            by_spec[data_file.spec_id].append(data_file)
        manifests = []
        for spec_id, spec_files in sorted(by_spec.items()):
            with writer_for(self.spec(spec_id)) as writer:
                for data_file in spec_files:
                    writer.add(added_entry(self._snapshot_id, data_file))
            manifests.append(writer.to_manifest_file())
        return manifests

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        if self._added_delete_files:
            operation = Operation.OVERWRITE if self._added_data_files else Operation.DELETE
        else:
            operation = Operation.APPEND
        added = [(added, added.spec_id) for added in (*self._added_data_files, *self._added_delete_files)]
        return collected_summary(self, added, (), operation, snapshot_properties)


def collected_summary(
    producer: _SnapshotProducer[Any],
    added: Iterable[tuple[DataFile, int]],
    removed: Iterable[DataFile],
    operation: Operation,
    snapshot_properties: Mapping[str, str],
) -> Summary:
    """A snapshot's summary: the files it adds (each with the id of the spec of the manifest it goes to) and removes
    counted, data and delete files, each partition by its spec; the totals carried on from its parent's."""
    metadata = producer._transaction.table_metadata
    limit = metadata.properties.get(
        TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT
    )
    collector = SnapshotSummaryCollector(partition_summary_limit=int(limit))
    specs, schema = metadata.specs(), metadata.schema()
    for data_file, spec_id in added:
        collector.add_file(data_file, partition_spec=specs[spec_id], schema=schema)
    for data_file in removed:
        collector.remove_file(data_file, partition_spec=specs[data_file.spec_id], schema=schema)
    parent_id = producer._parent_snapshot_id
    parent = None if parent_id is None else metadata.snapshot_by_id(parent_id)
    return update_snapshot_summaries(
        summary=Summary(operation=operation, **collector.build(), **snapshot_properties),
        previous_summary=None if parent is None else parent.summary,
    )


def updated_metadata(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """pyiceberg's `update_table_metadata` (the updates applied to `base`, the metadata log given the location `base`
    was read from, the update time) without its closing deep copy of the whole result. Each update makes new objects
    of what it changes and shares the rest with `base`, which nothing changes in place (pyiceberg replaces its frozen
    models): the copy cost more than anything else in a commit, growing with the table's snapshot list."""
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            metadata = metadata.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


class MetadataOnceTransaction(Transaction):
    """pyiceberg's transaction, computing the metadata it stands for once per change instead of at every read, and
    without a deep copy.

    pyiceberg's ``table_metadata`` applies the transaction's updates and deep-copies the whole table metadata each
    time it is read: about 15 times in one append, each copy growing with the table's snapshot list (an append of
    one file on a 60-snapshot table spent 68 ms of its 110 ms, profiled, in those copies). The metadata is a frozen
    model that pyiceberg replaces rather than changes, so the metadata computed for the current base and updates
    (each change makes new objects of them), sharing what they leave alone with the base (`updated_metadata`),
    serves every read until they change.
    """

    _computed: tuple[TableMetadata, tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        computed = self._computed
        if computed is None or computed[0] is not base or computed[1] is not updates:
            computed = self._computed = (base, updates, updated_metadata(base, updates))
        return computed[2]


def coordinator_transaction(table: Table) -> MetadataOnceTransaction:
    """The transaction every commit of the coordinator on a table opens. It turns Iceberg's own deletion of the
    metadata files a commit drops from the metadata log off (write.metadata.delete-after-commit.enabled=false, set
    by every commit): pyiceberg would delete them right after the commit, outside the one place that proves a
    deletion safe. They become orphans, which the sweep deletes through that place (docs/architecture.md, "Deletion
    is proven, never assumed"). Set even when the table as loaded says false: pyiceberg reads the committed
    metadata's value, and a commit that adds a snapshot applies over property changes made since the load."""
    transaction = MetadataOnceTransaction(table)
    transaction.set_properties({TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "false"})
    return transaction


class MetadataKeepingSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, reading a table's metadata file only when it is not the one this process last loaded
    or committed for the table, and staging a commit's metadata without the deep copy (`updated_metadata`).

    pyiceberg's commit loads the table again (its row, then its metadata file read and parsed) to check the commit's
    requirements on the current metadata and to swap the row's location only if it still holds the one loaded. A
    metadata file is never rewritten (a commit writes a new one and swaps the location), so the metadata this
    process parsed from a location, or wrote there, stands for that file for good: a load still reads the row, and
    reads the file only when the row names another one. A concurrent commit is detected as before: the row names its
    file (read then, the requirements checked on it), or it lands between the load and the swap, which then fails.
    """

    _kept: dict[tuple[str, str], tuple[str, TableMetadata]]

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        key = (orm_table.table_namespace, orm_table.table_name)
        kept = self._kept.get(key)
        if kept is None or kept[0] != orm_table.metadata_location:
            table = super()._convert_orm_to_iceberg(orm_table)
            self._kept[key] = (table.metadata_location, table.metadata)
            return table
        location, metadata = kept
        return Table(
            identifier=(*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        if current_table is None:  # a table created: pyiceberg validates its first metadata
            return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = updated_metadata(current_table.metadata, updates, current_table.metadata_location)
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version
        )
        return StagedTable(
            identifier=table_identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(properties=metadata.properties, location=location),
            catalog=self,
        )

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(table.name()))
        self._kept[(namespace, Catalog.table_name_from(table.name()))] = (
            response.metadata_location,
            response.metadata,
        )
        return response


def keeping_metadata(catalog: Catalog) -> Catalog:
    """The catalog; pyiceberg's SQL catalog (exactly it, not a subclass someone configured) becomes a
    MetadataKeepingSqlCatalog, the same object with its engine and tables as opened. Other catalogs (REST: the
    server stages commits) are left as they are."""
    if type(catalog) is SqlCatalog:
        catalog.__class__ = MetadataKeepingSqlCatalog
        assert isinstance(catalog, MetadataKeepingSqlCatalog)
        catalog._kept = {}
    return catalog


_Struct = TypeVar("_Struct", bound=StructProtocol)
# The reader of an Avro file's header: the same for every file.
_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


class _ResolvedReaders:
    """The reader pyiceberg resolves for an Avro file, by the schema its header names (as text) and what the caller
    reads it as: resolved once per process (bounded, least recently used first). Readers hold no state of a read."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._resolved: OrderedDict[tuple[Any, ...], tuple[Schema | None, Schema, Schema, Reader]] = OrderedDict()
        self._lock = threading.Lock()

    def of(
        self,
        header: AvroFileHeader,
        read_schema: Schema | None,
        read_types: Mapping[int, Callable[..., StructProtocol]],
        read_enums: Mapping[int, Callable[..., Any]],
    ) -> tuple[Schema, Schema, Reader]:
        """The file's schema, the schema it is read as, and the reader."""
        # The entry keeps `read_schema` alive: while it is kept, no other object can have that id.
        key = (header.meta.get(_SCHEMA_KEY), id(read_schema), tuple(read_types.items()), tuple(read_enums.items()))
        with self._lock:
            resolved = self._resolved.get(key)
            if resolved is not None:
                self._resolved.move_to_end(key)
                return resolved[1:]
        file_schema = header.get_schema()
        read_as = read_schema or file_schema
        reader = resolve_reader(file_schema, read_as, dict(read_types), dict(read_enums))
        with self._lock:
            self._resolved[key] = (read_schema, file_schema, read_as, reader)
            while len(self._resolved) > self._capacity:
                self._resolved.popitem(last=False)
        return file_schema, read_as, reader


_RESOLVED_READERS = _ResolvedReaders(capacity=1_000)


class ReaderKeepingAvroFile(AvroFile[_Struct]):
    """pyiceberg's Avro file, its reader resolved once per schema (`_ResolvedReaders`). pyiceberg converted the schema
    a manifest's or manifest list's header names, and resolved a reader of it, for every file it read: most of the
    CPU of reading a small manifest, which a commit, a compaction and a replace each do for every manifest they
    read."""

    def __enter__(self) -> Self:
        with self.input_file.open() as stream:
            self.decoder = new_decoder(stream.read())
        self.header = _HEADER_READER.read(self.decoder)
        self.schema, self.read_schema, self.reader = _RESOLVED_READERS.of(
            self.header, self.read_schema, self.read_types, self.read_enums
        )
        return self


def keep_avro_readers() -> None:
    """Read manifests and manifest lists (pyiceberg.manifest's reads, every one pyiceberg makes) with
    ReaderKeepingAvroFile, in this process."""
    pyiceberg.manifest.AvroFile = ReaderKeepingAvroFile  # type: ignore[attr-defined]
