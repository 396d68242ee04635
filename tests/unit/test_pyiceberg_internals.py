"""Each use of pyiceberg's private API (coordinator_service.tables.pyiceberg_internals) against the installed
pyiceberg: an upgrade that moves or changes one fails here, by name. The table is a real one, in a SQL catalog on
SQLite in a temporary directory."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyiceberg.manifest
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntryStatus,
    read_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate, update_table_metadata
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from coordinator_service.tables import pyiceberg_internals as internals
from coordinator_service.tables.iceberg import without_retries
from tests.fixtures.delete_files import commit_position_deletes

SCHEMA = Schema(
    NestedField(1, "order_id", LongType(), required=True),
    NestedField(2, "country", StringType(), required=False),
)
# A position delete file's columns (the spec's reserved field ids).
POSITION_DELETES = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": "2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "2147483545"}),
    ]
)
ROWS = pa.Table.from_pylist(
    [{"order_id": n, "country": "DE" if n % 2 else "FR"} for n in range(10)],
    schema=pa.schema([pa.field("order_id", pa.int64(), nullable=False), pa.field("country", pa.string())]),
)


@pytest.fixture
def table(tmp_path: Path) -> Iterator[Table]:
    catalog = SqlCatalog("internals", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "country"))
    yield catalog.create_table("db.orders", schema=SCHEMA, partition_spec=spec)
    catalog.engine.dispose()


def test_check_file_schema_takes_a_fitting_file_and_refuses_a_nullable_required_column() -> None:
    internals.check_file_schema(SCHEMA, ROWS.schema, format_version=2)
    nullable = pa.schema([pa.field("order_id", pa.int64()), pa.field("country", pa.string())])
    with pytest.raises(ValueError, match="order_id"):
        internals.check_file_schema(SCHEMA, nullable, format_version=2)


def test_evolved_schema_applies_in_memory_and_commits_nothing(table: Table) -> None:
    wider = pa.schema([*ROWS.schema, pa.field("coupon", pa.string())])
    evolved = internals.evolved_schema(table.update_schema().union_by_name(wider))
    assert evolved.column_names == ["order_id", "country", "coupon"]
    assert table.refresh().schema().column_names == ["order_id", "country"]


def test_partition_values_are_the_records_values_in_order() -> None:
    assert internals.partition_values(Record("DE", 7)) == ("DE", 7)


def test_file_info_tells_size_and_modification_time_in_one_request(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(ROWS, path)
    info = internals.file_info(PyArrowFileIO().new_input(f"file://{path}"))  # type: ignore[arg-type]
    assert info.size == path.stat().st_size
    assert info.mtime_ns == path.stat().st_mtime_ns


def test_data_files_of_writes_files_nothing_references_and_replace_files_swaps_them(table: Table) -> None:
    table.append(ROWS)
    table = table.refresh()
    before = {task.file.file_path for task in table.scan().plan_files()}

    written = list(internals.data_files_of(table.metadata, ROWS, table.io))

    assert {data_file.partition[0] for data_file in written} == {"DE", "FR"}
    assert sum(data_file.record_count for data_file in written) == 10
    assert {task.file.file_path for task in table.refresh().scan().plan_files()} == before

    replaced = [task.file for task in table.scan().plan_files()]
    committed = internals.replace_files(table, replaced, written, {"marker": "test"})

    snapshot = committed.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary["marker"] == "test"
    assert {task.file.file_path for task in committed.scan().plan_files()} == {f.file_path for f in written}
    assert sorted(committed.scan().to_arrow().column("order_id").to_pylist()) == list(range(10))


def test_replace_files_writes_one_manifest_for_the_files_of_every_manifest_it_rewrites(table: Table) -> None:
    """A compaction's small files come from many commits' manifests: the added files and what each of those manifests
    keeps go into one manifest (a manifest written costs a file and its Avro schema), each entry with its status, and
    a manifest that holds no removed file stays as it is."""
    for first in range(0, 40, 10):
        table.append(orders(first, countries=("DE", "FR") if first < 30 else ("FR",)))
    table = table.refresh()
    untouched = table.metadata.snapshots[-1].manifests(table.io)[0]  # the last append's: only FR
    germany = [task.file for task in table.scan(row_filter="country == 'DE'").plan_files()]
    written = list(
        internals.data_files_of(table.metadata, table.scan(row_filter="country == 'DE'").to_arrow(), table.io)
    )

    committed = internals.replace_files(table, germany, written, {"marker": "test"})

    snapshot = committed.current_snapshot()
    assert snapshot is not None
    manifests = snapshot.manifests(committed.io)
    [new] = [manifest for manifest in manifests if manifest.added_snapshot_id == snapshot.snapshot_id]
    assert [manifest.manifest_path for manifest in manifests if manifest is not new] == [untouched.manifest_path]
    statuses = Counter(
        (entry.status, entry.data_file.partition[0]) for entry in new.fetch_manifest_entry(committed.io, False)
    )
    assert statuses == {
        (ManifestEntryStatus.ADDED, "DE"): len(written),
        (ManifestEntryStatus.DELETED, "DE"): 3,
        (ManifestEntryStatus.EXISTING, "FR"): 3,
    }
    assert sorted(committed.scan().to_arrow().column("order_id").to_pylist()) == sorted(
        table.scan().to_arrow().column("order_id").to_pylist()
    )


def test_replace_files_removes_a_position_delete_file_recording_it_deleted_in_a_delete_manifest(table: Table) -> None:
    """pyiceberg's overwrite refuses to remove a delete file and would write a delete manifest back as a data one."""
    table.append(ROWS)
    table = table.refresh()
    [germany] = [task.file for task in table.scan().plan_files() if task.file.partition[0] == "DE"]
    delete_path = commit_position_deletes(table, germany, [0])
    table = table.refresh()
    [delete_file] = [task_delete for task in table.scan().plan_files() for task_delete in task.delete_files]
    kept = table.scan(row_filter="country == 'DE'").to_arrow()
    written = list(internals.data_files_of(table.metadata, kept, table.io))

    committed = internals.replace_files(table, [germany], written, {"marker": "test"}, deletes_dropped=[delete_file])

    snapshot = committed.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert (snapshot.summary.operation.value, snapshot.summary["total-delete-files"]) == ("replace", "0")
    assert [task.delete_files for task in committed.scan().plan_files()] == [set(), set()]
    removed = [
        (manifest.content, entry.status, entry.data_file.file_path)
        for manifest in snapshot.manifests(committed.io)
        if manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(committed.io, discard_deleted=False)
        if entry.status == ManifestEntryStatus.DELETED
    ]
    assert sorted(removed) == sorted(
        [
            (ManifestContent.DATA, ManifestEntryStatus.DELETED, germany.file_path),
            (ManifestContent.DELETES, ManifestEntryStatus.DELETED, delete_path),
        ]
    )
    assert sorted(committed.scan().to_arrow().column("order_id").to_pylist()) == [0, *range(2, 10)]  # 1: deleted


def test_iceberg_schema_numbers_an_arrow_schemas_fields_and_keeps_their_nullability() -> None:
    schema = internals.iceberg_schema(ROWS.schema)

    assert schema.column_names == ["order_id", "country"]
    assert sorted(schema.field_ids) == [1, 2]
    assert [field.required for field in schema.fields] == [True, False]


def test_deleted_positions_are_read_by_data_file_path(table: Table, tmp_path: Path) -> None:
    path = tmp_path / "deletes.parquet"
    rows = pa.table({"file_path": ["file:///a", "file:///a", "file:///b"], "pos": [3, 7, 0]}, schema=POSITION_DELETES)
    pq.write_table(rows, path)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path.as_uri(),
        file_format=FileFormat.PARQUET,
        record_count=3,
        file_size_in_bytes=path.stat().st_size,
    )

    deleted = internals.pyiceberg_deleted_positions(table.io, delete_file)

    assert {data_path: positions.to_pylist() for data_path, positions in deleted.items()} == {
        "file:///a": [3, 7],
        "file:///b": [0],
    }


def test_row_delta_adds_data_and_delete_files_in_one_snapshot_under_java_operations(table: Table) -> None:
    """Delete files go to `deletes` manifests of their own spec; a delete applies to a data file of the same
    snapshot (the same sequence number); the operation is append, overwrite or delete as Java's row delta says."""
    transaction = table.transaction()
    first = internals.RowDelta(transaction, table.io, {"marker": "1"})
    old = list(internals.data_files_of(table.metadata, ROWS, table.io))
    for data_file in old:
        data_file.spec_id = table.spec().spec_id
        first.append_data_file(data_file)
    first.commit()
    table = transaction.commit_transaction()
    assert _operation(table) == "append"

    [de] = [task.file for task in table.scan().plan_files() if task.file.partition[0] == "DE"]
    new = list(internals.data_files_of(table.metadata, ROWS.slice(0, 2), table.io))
    [new_fr] = [data_file for data_file in new if data_file.partition[0] == "FR"]
    for data_file in new:
        data_file.spec_id = table.spec().spec_id
    deletes = [
        _position_deletes(table, de, [0]),  # order 1 of the first snapshot
        _position_deletes(table, new_fr, [0]),  # order 0 of this snapshot
    ]
    transaction = table.transaction()
    delta = internals.RowDelta(transaction, table.io, {"marker": "2"})
    for data_file in new:
        delta.append_data_file(data_file)
    for delete_file in deletes:
        delta.add_delete_file(delete_file)
    delta.commit()
    table = transaction.commit_transaction()

    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert (_operation(table), snapshot.summary["marker"]) == ("overwrite", "2")
    assert (snapshot.summary["added-delete-files"], snapshot.summary["added-position-deletes"]) == ("2", "2")
    contents = {manifest.content.name for manifest in snapshot.manifests(table.io) if manifest.has_added_files()}
    assert contents == {"DATA", "DELETES"}
    # Without the deletes orders 0 and 1 would be there twice; with a wrong position, another order would be gone.
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == list(range(10))
    with pytest.raises(ValueError, match="position delete files only"):
        internals.RowDelta(table.transaction(), table.io, {}).add_delete_file(old[0])

    transaction = table.transaction()
    only_deletes = internals.RowDelta(transaction, table.io, {})
    only_deletes.add_delete_file(_position_deletes(table, de, [1]))
    only_deletes.commit()
    table = transaction.commit_transaction()
    assert _operation(table) == "delete"
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def _operation(table: Table) -> str:
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return str(snapshot.summary.operation.value)


def _position_deletes(table: Table, data_file: DataFile, positions: list[int]) -> DataFile:
    path = f"{table.location()}/data/{uuid.uuid4().hex}-deletes.parquet"
    rows = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions}, schema=POSITION_DELETES)
    with table.io.new_output(path).create() as stream:
        pq.write_table(rows, stream)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=len(positions),
        file_size_in_bytes=len(table.io.new_input(path)),
    )
    delete_file.spec_id = data_file.spec_id
    return delete_file


def test_the_metadata_once_transaction_computes_the_metadata_again_only_when_the_transaction_changes(
    table: Table,
) -> None:
    """It reads pyiceberg's Transaction._table and ._updates: the metadata it stands for must stay what pyiceberg's
    own transaction computes, read after read and change after change."""
    transaction = internals.MetadataOnceTransaction(table)
    plain = Transaction(table)

    def comparable(metadata: TableMetadata) -> dict[str, object]:
        return metadata.model_dump(exclude={"last_updated_ms"})  # when each was computed

    first = transaction.table_metadata
    assert transaction.table_metadata is first, "read twice without a change: computed twice"
    assert comparable(first) == comparable(plain.table_metadata)

    transaction.set_properties({"owner": "orders-team"})
    plain.set_properties({"owner": "orders-team"})
    changed = transaction.table_metadata
    assert changed is not first
    assert comparable(changed) == comparable(plain.table_metadata)
    assert transaction.table_metadata is changed

    committed = transaction.commit_transaction()
    assert committed.properties["owner"] == "orders-team"


def _append_updates(table: Table) -> tuple[TableUpdate, ...]:
    """The updates of a commit like the coordinator's: a property made sure of, then an append of one file."""
    transaction = Transaction(table)
    transaction.set_properties({"owner": "orders-team"})
    with transaction.update_snapshot().fast_append() as append:
        for data_file in internals.data_files_of(table.metadata, ROWS, table.io):
            append.append_data_file(data_file)
    return transaction._updates


def test_updated_metadata_is_pyicebergs_update_without_the_copy_and_leaves_the_base_as_it_was(table: Table) -> None:
    """It stands in for pyiceberg's update_table_metadata (the transaction's metadata, the SQL catalog's staged
    metadata): the same metadata, log entry included, for the updates of an append; and the sharing it relies on
    instead of the copy is safe: applying and committing the updates leave the base's objects unchanged."""
    table.append(ROWS)
    table = table.refresh()
    base = table.metadata
    before = base.model_dump()
    updates = _append_updates(table)

    for location in (None, table.metadata_location):
        ours = internals.updated_metadata(base, updates, location)
        theirs = update_table_metadata(base, updates, metadata_location=location)
        assert ours.model_dump() == theirs.model_dump()
        assert ours.snapshots[0] is base.snapshots[0], "not shared: pyiceberg's copy is back, or ours is wrong"
    assert [entry.metadata_file for entry in ours.metadata_log][-1] == table.metadata_location

    transaction = internals.coordinator_transaction(table)
    with transaction.update_snapshot().fast_append() as append:
        for data_file in internals.data_files_of(table.metadata, ROWS, table.io):
            append.append_data_file(data_file)
    committed = transaction.commit_transaction()
    assert len(committed.metadata.snapshots) == 2
    assert base.model_dump() == before


def _sql_catalogs(tmp_path: Path) -> tuple[internals.MetadataKeepingSqlCatalog, SqlCatalog]:
    """The coordinator's catalog as runtime.open_catalog makes it, and a plain one on the same database: another
    process committing to the same tables."""
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{tmp_path}"}
    ours = internals.keeping_metadata(load_catalog("internals", **properties))
    assert isinstance(ours, internals.MetadataKeepingSqlCatalog), "load_catalog's SQL catalog is no SqlCatalog"
    other = SqlCatalog("internals", **properties)
    ours.create_namespace("db")
    ours.create_table("db.orders", schema=SCHEMA)
    return ours, other


def _append(table: Table, marker: str) -> Table:
    transaction = internals.coordinator_transaction(table)
    with transaction.update_snapshot(snapshot_properties={"marker": marker}).fast_append() as append:
        for data_file in internals.data_files_of(table.metadata, ROWS, table.io):
            append.append_data_file(data_file)
    return transaction.commit_transaction()


def test_the_keeping_catalog_reads_a_metadata_file_only_when_the_row_names_one_it_does_not_hold(
    tmp_path: Path,
) -> None:
    """It overrides SqlCatalog._convert_orm_to_iceberg (a row to a table), _update_and_stage_table (a commit's
    metadata and its location) and commit_table: what it keeps must be what pyiceberg writes and reads."""
    ours, other = _sql_catalogs(tmp_path)
    loaded = ours.load_table("db.orders")
    assert ours.load_table("db.orders").metadata is loaded.metadata, "the same file parsed again"
    first = loaded.metadata_location  # the commit moves `loaded` on

    committed = _append(loaded, "ours")
    again = ours.load_table("db.orders")
    assert (again.metadata, again.metadata_location) == (committed.metadata, committed.metadata_location)
    assert again.metadata is committed.metadata, "the file this process wrote read back"
    written = other.load_table("db.orders")
    assert written.metadata_location == committed.metadata_location
    assert written.metadata.model_dump() == committed.metadata.model_dump(), "kept is not what was written"
    assert written.metadata.metadata_log[-1].metadata_file == first

    theirs = _append(written, "theirs")
    current = ours.load_table("db.orders")
    assert current.metadata_location == theirs.metadata_location
    assert [snapshot.summary["marker"] for snapshot in current.snapshots()] == ["ours", "theirs"]  # type: ignore[index]


def test_a_commit_on_the_keeping_catalog_fails_when_another_lands_first_and_keeps_a_property_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit protocol's assertion of the branch head, through the keeping catalog: an append built on a table
    another process has appended to since fails its requirement, and one whose commit another lands in the middle
    of (after pyiceberg's load, before its swap) fails the swap; neither lands. A change of properties only is
    applied under, as pyiceberg's own SQL catalog does."""
    ours, other = _sql_catalogs(tmp_path)
    base = ours.load_table("db.orders")
    _append(other.load_table("db.orders"), "theirs")
    with pytest.raises(CommitFailedException, match="Requirement failed: branch main"):
        _append(_no_retries(base), "stale")

    base = ours.load_table("db.orders")
    write_metadata = ours._write_metadata

    def another_lands_first(*args: object, **kwargs: object) -> None:
        monkeypatch.setattr(ours, "_write_metadata", write_metadata)
        _append(other.load_table("db.orders"), "theirs again")
        write_metadata(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ours, "_write_metadata", another_lands_first)
    with pytest.raises(CommitFailedException, match="updated by another process"):
        _append(_no_retries(base), "raced")
    markers = [snapshot.summary["marker"] for snapshot in ours.load_table("db.orders").snapshots()]  # type: ignore[index]
    assert markers == ["theirs", "theirs again"]

    base = ours.load_table("db.orders")
    other.load_table("db.orders").transaction().set_properties({"owner": "orders-team"}).commit_transaction()
    committed = _append(_no_retries(base), "after a property change")
    assert committed.properties["owner"] == "orders-team"
    assert other.load_table("db.orders").properties["owner"] == "orders-team"


def _no_retries(table: Table) -> Table:
    """As the gateway commits: pyiceberg's retry would rebuild the append on the new head and land."""
    return without_retries(table)


def test_keeping_metadata_leaves_other_catalogs_as_they_are(tmp_path: Path) -> None:
    class Configured(SqlCatalog):
        pass

    catalog = Configured("internals", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    assert type(internals.keeping_metadata(catalog)) is Configured


def orders(first: int, countries: tuple[str, ...] = ("DE", "FR")) -> pa.Table:
    """Ten orders from `first` on, their countries taken in turn."""
    return pa.Table.from_pylist(
        [{"order_id": n, "country": countries[n % len(countries)]} for n in range(first, first + 10)],
        schema=ROWS.schema,
    )


def _plain(value: Any) -> Any:
    """A manifest's or manifest list's record as plain values, every field (pyiceberg's equality of a ManifestFile
    or a DataFile compares paths alone)."""
    if isinstance(value, Record):
        return [type(value).__name__, *(_plain(field) for field in value._data)]
    if isinstance(value, dict):
        return {key: _plain(field) for key, field in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(field) for field in value]
    return value


def _every_manifest_read(tables: list[Table]) -> list[Any]:
    read: list[Any] = []
    for table in tables:
        for snapshot in table.metadata.snapshots:
            manifests = list(read_manifest_list(table.io.new_input(snapshot.manifest_list)))
            read.append(_plain(manifests))
            read.extend(
                _plain(manifest.fetch_manifest_entry(table.io, discard_deleted=False)) for manifest in manifests
            )
    return read


def test_manifests_read_with_the_readers_kept_are_what_pyiceberg_reads(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Differential: every manifest list and manifest of two tables whose files name different schemas (partitioned
    on a string, and not), data and position delete manifests, entries added, existing and deleted, read with
    pyiceberg's AvroFile and then with ReaderKeepingAvroFile, twice: the same records; the second time without
    resolving a reader again."""
    table.append(ROWS)
    table = table.refresh()
    [germany] = [task.file for task in table.scan().plan_files() if task.file.partition[0] == "DE"]
    commit_position_deletes(table, germany, [0, 3])
    table = table.refresh()
    table.overwrite(orders(10, ("FR",)))
    table.append(orders(20, ("DE", "IT")))
    merging = {TableProperties.MANIFEST_MERGE_ENABLED: "true", TableProperties.MANIFEST_MIN_MERGE_COUNT: "2"}
    other = table.catalog.create_table("db.others", schema=SCHEMA, properties=merging)  # existing entries
    other.append(ROWS)
    other.append(orders(30, ("DE",)))
    tables = [table.refresh(), other.refresh()]
    expected = _every_manifest_read(tables)
    manifests = [
        (manifest, read.io)
        for read in tables
        for snapshot in read.metadata.snapshots
        for manifest in snapshot.manifests(read.io)
    ]
    assert {manifest.content for manifest, _ in manifests} == {ManifestContent.DATA, ManifestContent.DELETES}
    statuses = {entry.status for manifest, io in manifests for entry in manifest.fetch_manifest_entry(io, False)}
    assert statuses == set(ManifestEntryStatus)

    monkeypatch.setattr(pyiceberg.manifest, "AvroFile", AvroFile)  # pyiceberg's own again after the test
    resolved = Counter[str]()
    resolve = internals.resolve_reader

    def counted_resolve(*args: Any) -> Any:
        resolved["readers"] += 1
        return resolve(*args)

    monkeypatch.setattr(internals, "resolve_reader", counted_resolve)
    internals.keep_avro_readers()
    assert pyiceberg.manifest.AvroFile is internals.ReaderKeepingAvroFile
    assert _every_manifest_read(tables) == expected
    first = resolved["readers"]
    assert _every_manifest_read(tables) == expected
    assert resolved["readers"] == first  # each schema's reader was kept
