"""Row mutations committed as row deltas (coordinator_service.tables.row_deltas): keys resolved against the table's
live rows to positions, position delete files, one snapshot per commit, on a real pyiceberg SQL catalog (SQLite) and
local files. Every check compares the table with a model (the last value of each key) as two independent readers
see it: pyiceberg's scan and DuckDB's Iceberg extension."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table

from coordinator_service.contract.markers import snapshot_properties
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_resolution import DuplicateKeys, live_rows
from coordinator_service.tables.row_deltas import EpochChange, commit_row_delta
from tests.fixtures.coordinator import write_parquet
from tests.fixtures.delete_files import commit_position_deletes
from tests.fixtures.duckdb_reader import duckdb_rows
from tests.fixtures.keyed_tables import (
    KEY_SCHEMA,
    KEYED,
    MARKER,
    Delete,
    Operation,
    Row,
    Upsert,
    apply,
    commit_epochs,
    duckdb_table_rows,
    model_rows,
    planned_compaction,
    pyiceberg_rows,
    surviving_rows,
    write_epoch,
)

_TABLES = itertools.count()


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri())


@pytest.fixture
def gateway(catalog: Catalog) -> IcebergGateway:
    return IcebergGateway(catalog)


def keyed_table(gateway: IcebergGateway, partitioned: bool = False) -> str:
    identifier = f"db.keyed_{next(_TABLES)}"
    gateway.ensure_table(identifier, KEYED, ("region",) if partitioned else (), key=("id",))
    return identifier


def assert_readers_see(table: Table, model: dict[int, Row]) -> None:
    expected = model_rows(model)
    assert pyiceberg_rows(table) == expected
    assert duckdb_table_rows(table) == expected


def delete_entries(table: Table) -> list[tuple[ManifestContent, DataFileContent]]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        (manifest.content, entry.data_file.content)
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.data_file.content != DataFileContent.DATA
    ]


# Keys from a small range, so that epochs update, delete and re-insert the same keys.
KEYS = st.integers(min_value=0, max_value=11)
OPERATIONS = st.one_of(
    st.builds(Upsert, KEYS, st.sampled_from(["eu", "us"]), st.text("abc", min_size=1, max_size=3)),
    st.builds(Delete, KEYS),
)
EPOCH = st.lists(OPERATIONS, max_size=10)
# A commit: one epoch, or several coalesced into one snapshot.
COMMITS = st.lists(st.lists(EPOCH, min_size=1, max_size=3), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=COMMITS, partitioned=st.booleans())
def test_random_upserts_and_deletes_leave_each_key_once_with_its_last_value(
    gateway: IcebergGateway, commits: list[list[list[Operation]]], partitioned: bool
) -> None:
    identifier = keyed_table(gateway, partitioned)
    model: dict[int, Row] = {}
    for number, epochs in enumerate(commits, start=1):
        committed = commit_epochs(gateway, identifier, epochs)
        replaced = 0  # each live row of a key an epoch touches is deleted once, never a row already gone
        for operations in epochs:
            replaced += len(set(surviving_rows(operations)[1]) & set(model))
            apply(model, operations)
        assert committed.deleted_rows == replaced

        table = gateway.load(identifier)
        assert committed.snapshot_id == table.metadata.current_snapshot_id
        assert len(table.snapshots()) == number  # several epochs, one snapshot
        assert_readers_see(table, model)
        assert all(
            kinds == (ManifestContent.DELETES, DataFileContent.POSITION_DELETES) for kinds in delete_entries(table)
        )


def test_coalesced_epochs_are_resolved_each_after_the_one_before(gateway: IcebergGateway) -> None:
    identifier = keyed_table(gateway)
    commit_epochs(gateway, identifier, [[Upsert(1, "eu", "a"), Upsert(2, "eu", "b"), Upsert(3, "us", "c")]])

    committed = commit_epochs(
        gateway,
        identifier,
        [
            [Upsert(4, "eu", "new"), Upsert(1, "eu", "a2")],  # 4 is new; 1 replaces the table's row
            [Upsert(4, "us", "newer"), Delete(2)],  # 4 again: its row of the epoch before, in this snapshot, goes
            [Delete(4), Upsert(2, "eu", "back")],  # and 4 goes altogether; 2 comes back
        ],
    )

    table = gateway.load(identifier)
    assert_readers_see(table, {1: (1, "eu", "a2"), 2: (2, "eu", "back"), 3: (3, "us", "c")})
    # Rows 1 and 2 of the first snapshot; 4 of the first epoch, of the second, and 2 deleted then re-inserted.
    assert (committed.deleted_rows, committed.data_files, len(committed.delete_files)) == (4, 3, 1)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    assert snapshot.summary["added-position-deletes"] == "4"
    assert MARKER in snapshot_properties(snapshot)


def test_a_commit_on_a_stale_head_is_refused_and_changes_nothing(gateway: IcebergGateway, catalog: Catalog) -> None:
    identifier = keyed_table(gateway)
    commit_epochs(gateway, identifier, [[Upsert(1, "eu", "a"), Upsert(2, "eu", "b")]])
    stale = gateway.load(identifier)
    commit_epochs(gateway, identifier, [[Upsert(1, "eu", "moved")]])  # another commit moves the head
    head = catalog.load_table(identifier)

    with pytest.raises(CommitFailedException):
        commit_epochs(gateway, identifier, [[Upsert(2, "eu", "late"), Delete(1)]], table=stale)

    after = catalog.load_table(identifier)
    assert after.metadata_location == head.metadata_location
    assert_readers_see(after, {1: (1, "eu", "moved"), 2: (2, "eu", "b")})
    # Resolved again on the table as it is now, the same change lands once.
    commit_epochs(gateway, identifier, [[Upsert(2, "eu", "late"), Delete(1)]])
    assert_readers_see(gateway.load(identifier), {2: (2, "eu", "late")})


def test_maintenance_under_a_resolution_is_a_conflict_too(gateway: IcebergGateway, catalog: Catalog) -> None:
    identifier = keyed_table(gateway)
    for key, value in ((1, "a"), (2, "b"), (3, "c")):
        commit_epochs(gateway, identifier, [[Upsert(key, "eu", value)]])
    stale = gateway.load(identifier)
    table = catalog.load_table(identifier)
    plan = cp.CompactionPlan([[tm.as_small_file(data_file) for data_file in cp.live_files(table).data]])
    # The positions in the stale table's files are gone.
    cp.commit_compaction(table, cp.write_compacted(table, plan, target_bytes=1 << 20))

    with pytest.raises(CommitFailedException):
        commit_epochs(gateway, identifier, [[Delete(1)]], table=stale)
    commit_epochs(gateway, identifier, [[Delete(1)]])
    assert_readers_see(gateway.load(identifier), {2: (2, "eu", "b"), 3: (3, "eu", "c")})


def test_existing_position_deletes_are_honoured_and_a_duplicated_key_is_made_whole(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    """Rows another engine deleted are not live (not deleted again); a key the table holds twice (appended before it
    was keyed) has both rows deleted by its next upsert."""
    identifier = keyed_table(gateway)
    commit_epochs(gateway, identifier, [[Upsert(key, "eu", "old") for key in range(5)]])
    table = catalog.load_table(identifier)
    [data_file] = cp.live_files(table).data
    commit_position_deletes(table, data_file, [1])  # key 1, by another engine
    table = catalog.load_table(identifier)
    table.add_files([_parquet(table, [(3, "eu", "twice")])])  # a plain append: key 3 twice
    table = catalog.load_table(identifier)

    found = live_rows(table, [(1,), (3,), (4,)])
    assert set(found.positions) == {(3,), (4,)}
    assert len(found.positions[(3,)]) == 2

    committed = commit_epochs(gateway, identifier, [[Upsert(1, "us", "back"), Upsert(3, "us", "once")]])
    assert committed.deleted_rows == 2
    assert_readers_see(
        gateway.load(identifier),
        {0: (0, "eu", "old"), 1: (1, "us", "back"), 2: (2, "eu", "old"), 3: (3, "us", "once"), 4: (4, "eu", "old")},
    )


def test_position_delete_files_follow_the_spec(gateway: IcebergGateway) -> None:
    """The spec's columns and field ids, rows sorted by path then position, whole path bounds, one file per partition
    of the rows deleted, in a deletes manifest; never an equality delete."""
    identifier = keyed_table(gateway, partitioned=True)
    commit_epochs(gateway, identifier, [[Upsert(key, "eu" if key % 2 else "us", "a") for key in range(20)]])
    commit_epochs(gateway, identifier, [[Upsert(key, "eu" if key % 2 else "us", "b") for key in range(20, 30)]])

    committed = commit_epochs(gateway, identifier, [[Delete(key) for key in range(0, 30, 3)]])

    table = gateway.load(identifier)
    assert len(committed.delete_files) == 2  # eu and us
    for path in committed.delete_files:
        contents = pq.read_table(path.removeprefix("file://"))
        fields = {field.name: field for field in contents.schema}
        assert [(name, field.metadata[b"PARQUET:field_id"]) for name, field in fields.items()] == [
            ("file_path", b"2147483546"),
            ("pos", b"2147483545"),
        ]
        assert (fields["file_path"].type, fields["pos"].type) == (pa.string(), pa.int64())
        assert not fields["file_path"].nullable and not fields["pos"].nullable
        rows = list(zip(contents.column("file_path").to_pylist(), contents.column("pos").to_pylist(), strict=True))
        assert rows == sorted(rows) and len(set(rows)) == len(rows)
        assert len({path for path, _ in rows}) == 2  # a partition's rows in both snapshots' files
    snapshot = table.current_snapshot()
    assert snapshot is not None
    deletes = [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io)
        if manifest.content == ManifestContent.DELETES
    ]
    assert {delete.file_path for delete in deletes} == set(committed.delete_files)
    for delete in deletes:
        paths = sorted(pq.read_table(delete.file_path.removeprefix("file://")).column("file_path").to_pylist())
        assert delete.lower_bounds[2147483546] == paths[0].encode()
        assert delete.upper_bounds[2147483546] == paths[-1].encode()
        assert delete.partition[0] in {"eu", "us"}
    assert sum(delete.record_count for delete in deletes) == committed.deleted_rows == 10
    assert all(kinds[1] != DataFileContent.EQUALITY_DELETES for kinds in delete_entries(table))
    assert_readers_see(
        table, {key: (key, "eu" if key % 2 else "us", "a" if key < 20 else "b") for key in range(30) if key % 3}
    )


def test_the_operation_says_what_the_rows_did(gateway: IcebergGateway) -> None:
    identifier = keyed_table(gateway)
    operations = []
    for epoch in ([Upsert(1, "eu", "a")], [Upsert(1, "eu", "b")], [Delete(1)], [Delete(7)]):
        commit_epochs(gateway, identifier, [epoch])
        snapshot = gateway.load(identifier).current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        operations.append(snapshot.summary.operation.value)
    # Java's row delta: rows only added, added and deleted, only deleted; a key nobody holds deletes nothing.
    assert operations == ["append", "overwrite", "delete", "append"]
    assert_readers_see(gateway.load(identifier), {})


def test_an_epoch_whose_rows_hold_a_key_twice_is_refused(gateway: IcebergGateway) -> None:
    identifier = keyed_table(gateway)
    table = gateway.load(identifier)
    path = _parquet(table, [(5, "eu", "a"), (5, "eu", "b")])
    entries = gateway.read_data_files(identifier, [path], 0, False).entries

    with pytest.raises(DuplicateKeys, match=r"the key \(5,\) is in an epoch's rows twice"):
        commit_row_delta(table, [EpochChange(entries, pa.table({"id": [5]}, schema=KEY_SCHEMA))], {})
    assert gateway.load(identifier).current_snapshot() is None


def test_only_keyed_format_v2_tables_take_row_deltas(gateway: IcebergGateway, catalog: Catalog) -> None:
    catalog.create_namespace("plain")
    v1 = catalog.create_table("plain.v1", schema=KEYED, properties={"format-version": "1"})
    unkeyed = catalog.create_table("plain.unkeyed", schema=KEYED)
    change = EpochChange([], pa.table({"id": [1]}, schema=KEY_SCHEMA))

    with pytest.raises(ValueError, match="format v1"):
        commit_row_delta(v1, [change], {})
    with pytest.raises(ValueError, match="no identifier fields"):
        commit_row_delta(unkeyed, [change], {})


def test_an_epoch_of_only_deletes_or_of_nothing_still_commits_its_snapshot(gateway: IcebergGateway) -> None:
    """The markers must land even when an epoch changed nothing: an epoch with neither rows nor keys commits a
    snapshot without files."""
    identifier = keyed_table(gateway)
    committed = commit_row_delta(gateway.load(identifier), [write_epoch(gateway, identifier, [])], {MARKER: "empty"})
    table = gateway.load(identifier)
    assert table.metadata.current_snapshot_id == committed.snapshot_id
    assert (committed.data_files, committed.delete_files, committed.deleted_rows) == (0, (), 0)
    assert_readers_see(table, {})


def _parquet(table: Table, rows: list[Row]) -> str:
    return write_parquet(
        str(table.location()), [{"id": key, "region": region, "value": value} for key, region, value in rows], KEYED
    )


def test_a_composite_key_is_resolved_as_a_whole(gateway: IcebergGateway, catalog: Catalog) -> None:
    schema = pa.schema([pa.field("tenant", pa.string(), nullable=False), *KEYED])
    gateway.ensure_table("db.accounts", schema, (), key=("tenant", "id"))

    def commit(rows: list[tuple[str, int, str]], touched: list[tuple[str, int]]) -> None:
        table = catalog.load_table("db.accounts")
        columns = [{"tenant": t, "id": i, "region": "eu", "value": v} for t, i, v in rows]
        path = write_parquet(str(table.location()), columns, schema)
        entries = gateway.read_data_files("db.accounts", [path], 0, False).entries
        keys = pa.table({"tenant": [t for t, _ in touched], "id": pa.array([i for _, i in touched], pa.int64())})
        commit_row_delta(table, [EpochChange(entries, keys)], {})

    commit([("a", 1, "a1"), ("b", 1, "b1"), ("a", 2, "a2")], [])
    commit([("b", 1, "b1'")], [("a", 2), ("b", 2)])  # same ids, other tenants: only (b, 1) and (a, 2) change

    table = catalog.load_table("db.accounts")
    expected = [("a", 1, "eu", "a1"), ("b", 1, "eu", "b1'")]
    assert sorted(tuple(row.values()) for row in table.scan().to_arrow().to_pylist()) == expected
    duckdb = duckdb_rows(table.metadata_location, "tenant, id")
    assert sorted(duckdb) == expected


def test_rows_under_an_earlier_partition_spec_are_deleted_in_that_spec(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    identifier = keyed_table(gateway)
    model: dict[int, Row] = {}
    first = [Upsert(key, "eu" if key % 2 else "us", "v0") for key in range(6)]
    commit_epochs(gateway, identifier, [first])
    apply(model, first)
    with catalog.load_table(identifier).update_spec() as spec:
        spec.add_identity("region")
    second = [Upsert(key, "us", "v1") for key in range(3, 9)]
    commit_epochs(gateway, identifier, [second])
    apply(model, second)

    third = [Delete(0), Upsert(4, "eu", "v2"), Upsert(8, "eu", "v2")]  # rows of spec 0, and of spec 1
    committed = commit_epochs(gateway, identifier, [third])
    apply(model, third)

    table = gateway.load(identifier)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    deletes = [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.snapshot_id == committed.snapshot_id
    ]
    assert sorted(delete.spec_id for delete in deletes) == [0, 1]
    assert_readers_see(table, model)


def test_delete_files_of_each_spec_and_partition_are_merged_in_it(gateway: IcebergGateway, catalog: Catalog) -> None:
    """Delete files under an earlier partition spec and under the current one, merged by compaction: one file per
    spec and partition, written in that spec (its manifest's), and both readers see the same rows."""
    identifier = keyed_table(gateway)
    model: dict[int, Row] = {}
    epochs: list[list[Operation]] = [[Upsert(key, "eu" if key % 2 else "us", "v0") for key in range(12)]]
    epochs += [[Upsert(key, "eu", f"a{key}")] for key in (0, 1, 2)]
    for operations in epochs:
        commit_epochs(gateway, identifier, [operations])
        apply(model, operations)
    with catalog.load_table(identifier).update_spec() as spec:
        spec.add_identity("region")
    # Rows of spec 0 replaced and deleted (delete files in spec 0), then rows of spec 1 (in spec 1, partition us).
    later: list[list[Operation]] = [[Upsert(key, "us", f"b{key}") for key in (3, 4, 0, 5, 6)]]
    later += [[Upsert(3, "us", "c3")], [Upsert(4, "us", "c4")], [Delete(1)], [Delete(0)]]
    for operations in later:
        commit_epochs(gateway, identifier, [operations])
        apply(model, operations)
    table = gateway.load(identifier)
    before = cp.live_files(table).deletes
    plan = planned_compaction(table, delete_files=2, target_bytes=1 << 30)
    assert len(plan.merges) == 2  # (a file whose every row is deleted is rewritten too: to nothing)

    merged = cp.commit_compaction(table, cp.write_compacted(table, plan, target_bytes=1 << 30))

    assert_readers_see(merged, model)
    after = cp.live_files(merged).deletes
    places = [(delete_file.spec_id, tuple(delete_file.partition)) for delete_file in after]
    assert len(places) == len(set(places)) < len(before)
    assert {spec_id for spec_id, _ in places} == {0, 1}
    snapshot = merged.current_snapshot()
    assert snapshot is not None
    for manifest in snapshot.manifests(merged.io):
        for entry in manifest.fetch_manifest_entry(merged.io):
            assert entry.data_file.spec_id == manifest.partition_spec_id


def test_maintenance_counts_delete_files_as_referenced(gateway: IcebergGateway, catalog: Catalog) -> None:
    """The orphan sweep's referenced files include the delete files, and expiring the snapshot that added one while a
    later snapshot still holds it frees nothing of it."""
    identifier = keyed_table(gateway)
    commit_epochs(gateway, identifier, [[Upsert(key, "eu", "a") for key in range(4)]])
    first = commit_epochs(gateway, identifier, [[Upsert(1, "eu", "b")]])
    commit_epochs(gateway, identifier, [[Upsert(2, "eu", "c")]])
    table = catalog.load_table(identifier)

    assert set(first.delete_files) <= tm.referenced_files(table)
    committed, gone = tm.expire(table, [first.snapshot_id])
    assert first.snapshot_id not in {snapshot.snapshot_id for snapshot in committed.snapshots()}
    assert not set(first.delete_files) & gone.data_files
    assert set(first.delete_files) <= tm.referenced_files(committed)
    assert_readers_see(committed, {0: (0, "eu", "a"), 1: (1, "eu", "b"), 2: (2, "eu", "c"), 3: (3, "eu", "a")})


def test_touched_keys_without_the_key_column_or_with_a_null_are_refused(gateway: IcebergGateway) -> None:
    identifier = keyed_table(gateway)
    table = gateway.load(identifier)

    with pytest.raises(ValueError, match="the keys hold 1 null id: a key is never null"):
        commit_row_delta(table, [EpochChange([], pa.table({"id": pa.array([1, None], pa.int64())}))], {})
    with pytest.raises(ValueError, match="the keys have no column id"):
        commit_row_delta(table, [EpochChange([], pa.table({"key": [1]}))], {})
    assert gateway.load(identifier).current_snapshot() is None
