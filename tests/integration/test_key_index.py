"""The key index (coordinator_service.engine.key_index) on a real PostgreSQL and a real SQL catalog: its answer is the
scan's (key_resolution.live_rows) for the table as loaded, whatever happened to the table since it last looked (row
deltas recorded or not, another writer's appends, compaction, expiry, a rebuild), and following a table costs what
changed, not what the table holds."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table
from pyiceberg.types import LongType

from coordinator_service.contract.errors import CatalogConflict
from coordinator_service.engine.key_index import KeyIndex
from coordinator_service.log.database import Database, normalize_url
from coordinator_service.runtime import migrate
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_resolution import live_rows
from coordinator_service.tables.pyiceberg_internals import data_files_of
from coordinator_service.tables.row_deltas import commit_row_delta
from tests.fixtures.delete_files import commit_equality_deletes, commit_position_deletes
from tests.fixtures.key_index import assert_answers_as_the_scan, commit_through_index, counting
from tests.fixtures.keyed_tables import (
    KEYED,
    MARKER,
    Delete,
    Operation,
    Row,
    Upsert,
    planned_compaction,
    pyiceberg_rows,
    write_epoch,
)
from tests.fixtures.postgres import new_database, query

TABLE = "db.keyed"


@pytest.fixture
async def key_index(database_url: str) -> AsyncIterator[KeyIndex]:
    await asyncio.to_thread(migrate, normalize_url(database_url))
    database = Database(normalize_url(database_url))
    try:
        yield KeyIndex(database)
    finally:
        await database.dispose()


@pytest.fixture
def gateway(catalog: Catalog) -> IcebergGateway:
    gateway = IcebergGateway(catalog)
    gateway.ensure_table(TABLE, KEYED, (), key=("id",))
    return gateway


def index_rows(database_url: str) -> list[tuple[Any, ...]]:
    """Each index: its table's UUID, snapshot, whether it is built, its rows as counted and as held."""
    return query(
        database_url,
        "SELECT t.table_uuid, t.snapshot_id, t.built_at IS NOT NULL, t.rows, "
        "(SELECT count(*) FROM key_index k WHERE k.index_id = t.index_id) FROM key_index_tables t ORDER BY 1",
    )


def apply_commit(model: dict[int, list[Row]], epochs: list[list[Operation]]) -> None:
    """The model of a keyed table whose keys may be held more than once: an upsert or a delete of a key replaces
    every row it has."""
    for operations in epochs:
        for operation in operations:
            model[operation.key] = (
                [(operation.key, operation.region, operation.value)] if isinstance(operation, Upsert) else []
            )


def rows_of(model: dict[int, list[Row]]) -> list[Row]:
    return sorted(row for rows in model.values() for row in rows)


async def test_a_new_table_is_indexed_from_its_first_commit_on_and_answers_as_the_scan(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    """The first commit's positions() builds the empty table's index (no rows read), and each recorded commit moves
    it: no catch-up, no rebuild after that."""
    first = await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(10)]])
    built = query(database_url, "SELECT built_at FROM key_index_tables")
    second = await commit_through_index(
        key_index, gateway, TABLE, [[Upsert(3, "us", "b"), Delete(4)], [Upsert(3, "eu", "c"), Upsert(11, "eu", "d")]]
    )

    table = gateway.load(TABLE)
    assert (second.deleted_rows, first.deleted_rows) == (3, 0)  # 3 and 4 of the first; 3 of the first epoch
    [(table_uuid, snapshot_id, is_built, rows, held)] = index_rows(database_url)
    assert (table_uuid, snapshot_id, is_built) == (table.metadata.table_uuid, second.snapshot_id, True)
    assert rows == held == len(pyiceberg_rows(table)) == 10
    assert query(database_url, "SELECT built_at FROM key_index_tables") == built  # never rebuilt
    await assert_answers_as_the_scan(key_index, table, [(key,) for key in range(14)])


# Keys from a small range, so that commits update, delete and insert again the same keys.
KEYS = st.integers(min_value=0, max_value=15)
OPERATIONS = st.one_of(
    st.builds(Upsert, KEYS, st.sampled_from(["eu", "us"]), st.text("abc", min_size=1, max_size=3)),
    st.builds(Delete, KEYS),
)
# A commit: one epoch, or several coalesced into one snapshot.
COMMITS = st.lists(st.lists(OPERATIONS, max_size=8), min_size=1, max_size=3)


class KeyIndexFollowsItsTable(RuleBasedStateMachine):
    """A keyed table written by row deltas resolved through the index and by others behind its back, and maintained;
    whenever asked, and at the end, the index answers as the scan for keys held and not, holds every live row, and the
    table holds the model's rows."""

    def __init__(self, postgres_url: str, root: Path) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.database_url = self.stack.enter_context(new_database(postgres_url))
        self.loop = asyncio.new_event_loop()
        migrate(normalize_url(self.database_url))
        self.database = Database(normalize_url(self.database_url))
        self.index = KeyIndex(self.database)
        warehouse = root / uuid.uuid4().hex[:8]
        warehouse.mkdir(parents=True)
        self.catalog = load_catalog("default", type="sql", uri=self.database_url, warehouse=warehouse.as_uri())
        self.gateway = IcebergGateway(self.catalog)
        self.model: dict[int, list[Row]] = {}

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        try:
            self.the_index_answers_as_the_scan()
            self.run(self.database.dispose())
        finally:
            self.loop.close()
            self.stack.close()

    def table(self) -> Table:
        return self.gateway.load(TABLE)

    @initialize(partitioned=st.booleans())
    def create_table(self, partitioned: bool) -> None:
        self.gateway.ensure_table(TABLE, KEYED, ("region",) if partitioned else (), key=("id",))

    @rule(epochs=COMMITS, recorded=st.booleans())
    def upserts_and_deletes(self, epochs: list[list[Operation]], recorded: bool) -> None:
        """A row delta resolved through the index; not recorded: the coordinator died between commit and record."""
        expected = sum(len(self.model.get(key, [])) for key in {op.key for op in epochs[0]})
        committed = self.run(commit_through_index(self.index, self.gateway, TABLE, epochs, record=recorded))
        if len(epochs) == 1:
            assert committed.deleted_rows == expected
        apply_commit(self.model, epochs)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=5))
    def another_writer_appends(self, keys: list[int]) -> None:
        """Plain rows appended behind the index's back, keys already held included (a key twice, as in a table that
        was appended to before it was keyed)."""
        rows = [(key, "eu", f"append-{index}") for index, key in enumerate(keys)]
        self.table().append(pa.Table.from_pylist([dict(zip(KEYED.names, row, strict=True)) for row in rows], KEYED))
        for row in rows:
            self.model.setdefault(row[0], []).append(row)

    @rule(replace=st.booleans())
    def compaction(self, replace: bool) -> None:
        """Every live row rewritten (their positions all change): the project's own `replace` snapshot of files
        written with their deletes applied, or pyiceberg's overwrite."""
        table = self.table()
        rows = table.scan().to_arrow()
        if not rows.num_rows:
            return
        if replace:
            written = list(data_files_of(table.metadata, rows, table.io))
            cp.commit_compaction(table, cp.Rewrite(cp.live_files(table).data, written))
        else:
            table.overwrite(rows)

    @rule(ratio=st.sampled_from([1e-9, 0.3, 1.0]), delete_files=st.integers(min_value=2, max_value=4))
    def maintenance_compaction(self, ratio: float, delete_files: int) -> None:
        """The coordinator's compaction as a maintenance run plans it: a partition's position delete files merged into
        one, the data files whose rows they delete at `ratio` rewritten with them applied."""
        table = self.table()
        plan = planned_compaction(table, delete_files=delete_files, deleted_rows_ratio=ratio, min_files=2)
        if plan:
            cp.commit_compaction(table, cp.write_compacted(table, plan, target_bytes=1 << 20))

    @rule()
    def expiry(self) -> None:
        """Every snapshot but the current one expired: an index left at one of them is rebuilt."""
        table = self.table()
        current = table.metadata.current_snapshot_id
        older = [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.snapshot_id != current]
        if older:
            tm.expire(table, older)

    @rule(forget=st.booleans())
    def forced_rebuild(self, forget: bool) -> None:
        if forget:
            self.run(self.index.forget(self.table().metadata.table_uuid))
        else:
            query(self.database_url, "UPDATE key_index_tables SET built_at = NULL")

    @rule()
    def the_index_answers_as_the_scan(self) -> None:
        """A rule, not an invariant: the answer brings the index to the table, and the other steps must also meet an
        index left behind (by a commit not recorded, or any other writer) with whatever came since."""
        table = self.table()
        self.run(assert_answers_as_the_scan(self.index, table, [(key,) for key in range(18)]))
        assert pyiceberg_rows(table) == rows_of(self.model)
        # It holds every live row, not only those of the keys asked.
        [(_, snapshot_id, built, rows, held)] = index_rows(self.database_url)
        assert (snapshot_id, built) == (table.metadata.current_snapshot_id, True)
        assert rows == held == len(rows_of(self.model))


def test_an_index_of_the_empty_table_is_rebuilt_once_the_first_snapshots_expired(
    postgres_url: str, tmp_path: Path
) -> None:
    """Expiry leaves the oldest snapshot it keeps without a parent, like a table's first: an index built on the empty
    table caught up from it alone and missed the rows of the expired snapshots (the state machine's example; the
    index answered without the first append's row)."""
    machine = KeyIndexFollowsItsTable(postgres_url, tmp_path)
    machine.create_table(partitioned=False)
    machine.the_index_answers_as_the_scan()
    machine.another_writer_appends(keys=[0])
    machine.another_writer_appends(keys=[0])
    machine.expiry()
    machine.the_index_answers_as_the_scan()
    machine.teardown()


def test_the_index_follows_its_table_through_anything(postgres_url: str, tmp_path: Path) -> None:
    class Machine(KeyIndexFollowsItsTable):
        def __init__(self) -> None:
            super().__init__(postgres_url, tmp_path)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=int(os.environ.get("SINK_TEST_KEY_INDEX_EXAMPLES", "25")),
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


async def test_a_merge_of_delete_files_is_followed_without_a_rebuild(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    """Compaction merges a partition's delete files into one (a `replace` snapshot that removes them and adds a file
    of the same rows): the catch-up removes no row twice and rebuilds nothing. On the old catch-up, a removed delete
    file of data files that stay meant a rebuild (the rows it deleted may be live again), whatever the snapshot
    added."""
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(20)]])
    for key in range(0, 12, 3):
        await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "b"), Delete(key + 1)]])
    built = query(database_url, "SELECT built_at FROM key_index_tables")
    table = gateway.load(TABLE)
    plan = planned_compaction(table, delete_files=2)
    assert (len(plan.groups), [len(merge) for merge in plan.merges]) == (0, [4])
    merged = cp.commit_compaction(table, cp.write_compacted(table, plan, target_bytes=1 << 20))
    assert len(cp.live_files(merged).deletes) == 1

    after = await commit_through_index(key_index, gateway, TABLE, [[Upsert(2, "eu", "c"), Delete(5)]])

    table = gateway.load(TABLE)
    assert after.deleted_rows == 2
    [(_, snapshot_id, is_built, rows, held)] = index_rows(database_url)
    assert (snapshot_id, is_built) == (table.metadata.current_snapshot_id, True)
    assert rows == held == len(pyiceberg_rows(table)) == 20 - 4 - 1
    assert query(database_url, "SELECT built_at FROM key_index_tables") == built  # caught up, never rebuilt
    await assert_answers_as_the_scan(key_index, table, [(key,) for key in range(22)])


async def test_a_catch_up_reads_only_what_the_new_snapshots_wrote(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    """O(epoch), not O(table): the index at H, a commit H' it did not record (a crash), then a positions() on H'
    reads H''s manifest list, the manifests H' wrote, and H''s own data and delete files: none of the table's other
    files."""
    for first in range(0, 200, 10):  # 20 data files, each in a manifest of its own
        await commit_through_index(
            key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(first, first + 10)]]
        )
    committed = await commit_through_index(
        key_index, gateway, TABLE, [[Upsert(5, "us", "b"), Delete(17), Upsert(500, "eu", "c")]], record=False
    )
    table = gateway.load(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    written = [
        manifest for manifest in snapshot.manifests(table.io) if manifest.added_snapshot_id == snapshot.snapshot_id
    ]
    new_files = {
        entry.data_file.file_path
        for manifest in written
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.snapshot_id == snapshot.snapshot_id
    }
    assert len(new_files) == 2 and set(committed.delete_files) <= new_files  # its data file and its delete file
    watched, reads = counting(table)

    answered = await key_index.positions(watched, [(5,), (17,), (500,), (150,)])

    allowed = {snapshot.manifest_list} | {manifest.manifest_path for manifest in written} | new_files
    assert set(reads.read) <= allowed, sorted(set(reads.read) - allowed)
    assert new_files <= set(reads.read)
    assert set(answered.positions) == {(5,), (500,), (150,)}
    assert index_rows(database_url)[0][1] == snapshot.snapshot_id
    # The scan, for contrast, reads every data file of the table.
    scan_table, scanned = counting(table)
    live_rows(scan_table, [(key,) for key in range(0, 200, 7)])
    assert len({path for path in scanned.read if path.endswith(".parquet")}) >= 20


async def test_an_index_ahead_of_a_stale_table_refuses_it_and_changes_nothing(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(1, "eu", "a")]])
    stale = gateway.load(TABLE)
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(1, "eu", "b")]])  # another sink moves it on
    before = index_rows(database_url)

    with pytest.raises(CatalogConflict, match=r"older than its key index .* load it again"):
        await key_index.positions(stale, [(1,)])

    assert index_rows(database_url) == before
    await assert_answers_as_the_scan(key_index, gateway.load(TABLE), [(1,), (2,)])


async def test_a_changed_key_type_an_expired_snapshot_and_a_replaced_table_are_rebuilt(
    key_index: KeyIndex, gateway: IcebergGateway, catalog: Catalog, database_url: str
) -> None:
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), *list(KEYED)[1:]])
    gateway.ensure_table("db.narrow", schema, (), key=("id",))
    table = catalog.load_table("db.narrow")
    table.append(pa.Table.from_pylist([{"id": 1, "region": "eu", "value": "a"}], schema))
    await assert_answers_as_the_scan(key_index, catalog.load_table("db.narrow"), [(1,)])
    [(_, _, _, _, _)] = index_rows(database_url)
    with catalog.load_table("db.narrow").update_schema() as update:
        update.update_column("id", LongType())  # the key's bytes are 8 bytes now, not 4

    await assert_answers_as_the_scan(key_index, catalog.load_table("db.narrow"), [(1,), (2,)])
    assert query(database_url, "SELECT key_types, rows FROM key_index_tables") == [(["long"], 1)]

    # An index left at a snapshot that expired since: rebuilt.
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(1, "eu", "a")]], record=False)
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(2, "eu", "b")]], record=False)
    table = gateway.load(TABLE)
    current = table.metadata.current_snapshot_id
    tm.expire(table, [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.snapshot_id != current])
    await assert_answers_as_the_scan(key_index, gateway.load(TABLE), [(1,), (2,), (3,)])

    # A table dropped and created again under its name is another table, with an index of its own.
    old_uuid = gateway.load(TABLE).metadata.table_uuid
    catalog.drop_table(TABLE)
    gateway.ensure_table(TABLE, KEYED, (), key=("id",))
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(1, "us", "new")]])
    await assert_answers_as_the_scan(key_index, gateway.load(TABLE), [(1,), (2,)])
    assert await key_index.forget(old_uuid)
    assert not await key_index.forget(old_uuid)
    uuids = [row[0] for row in index_rows(database_url)]
    assert old_uuid not in uuids and gateway.load(TABLE).metadata.table_uuid in uuids


async def test_two_replicas_following_one_table_at_once_apply_its_changes_once(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    """Two sinks (or replicas) of one table: the index's row lock makes one catch up and the other see it done."""
    other = KeyIndex(Database(normalize_url(database_url)))
    try:
        await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(50)]])
        for key in range(5):
            await commit_through_index(
                key_index, gateway, TABLE, [[Upsert(key, "us", "b"), Delete(key + 10)]], record=False
            )
        table = gateway.load(TABLE)

        first, second = await asyncio.gather(
            key_index.positions(table, [(key,) for key in range(20)]),
            other.positions(table, [(key,) for key in range(20)]),
        )

        assert first.positions == second.positions
        [(_, snapshot_id, _, rows, held)] = index_rows(database_url)
        assert (snapshot_id, rows, held) == (table.metadata.current_snapshot_id, 45, 45)
        await assert_answers_as_the_scan(key_index, table, [(key,) for key in range(60)])
    finally:
        await other.database.dispose()


async def test_a_record_is_taken_only_on_the_commits_base_and_a_wrong_index_is_rebuilt(
    key_index: KeyIndex, gateway: IcebergGateway, database_url: str
) -> None:
    """A record comes late (the commit's positions() are the next commit's catch-up): it is taken when the index is
    at the commit's base, refused otherwise. A record whose deleted rows the index does not hold marks it for a
    rebuild. Either way the next answer is the scan's."""
    first = await commit_through_index(key_index, gateway, TABLE, [[Upsert(1, "eu", "a")]], record=False)
    second = await commit_through_index(key_index, gateway, TABLE, [[Upsert(2, "eu", "b")]], record=False)
    assert not await key_index.record(first)  # the second commit's positions() caught up with it already
    assert await key_index.record(second)
    assert index_rows(database_url)[0][1:] == (second.snapshot_id, True, 2, 2)

    # A row lost from the index: a commit resolved by the scan deletes it, and its record finds the index wrong.
    query(database_url, "DELETE FROM key_index WHERE key = %s", (1).to_bytes(8, "little"))
    change = write_epoch(gateway, TABLE, [Upsert(1, "us", "c"), Upsert(2, "us", "c")])
    resolved = commit_row_delta(gateway.load(TABLE), [change], {MARKER: "scan"})
    assert resolved.deleted_rows == 2
    assert not await key_index.record(resolved)
    assert query(database_url, "SELECT built_at IS NULL FROM key_index_tables") == [(True,)]

    await assert_answers_as_the_scan(key_index, gateway.load(TABLE), [(1,), (2,), (3,)])
    assert index_rows(database_url)[0][1:] == (resolved.snapshot_id, True, 2, 2)


async def test_keys_the_table_cannot_hold_and_tables_without_a_key_are_refused_and_change_nothing(
    key_index: KeyIndex, gateway: IcebergGateway, catalog: Catalog, database_url: str
) -> None:
    table = gateway.load(TABLE)
    with pytest.raises(ValueError, match="a key is never null"):
        await key_index.positions(table, [(None,)])
    with pytest.raises(ValueError, match="Could not convert 'not a number'"):
        await key_index.positions(table, [("not a number",)])
    catalog.create_namespace_if_not_exists("plain")
    v1 = catalog.create_table("plain.v1", schema=KEYED, properties={"format-version": "1"})
    unkeyed = catalog.create_table("plain.unkeyed", schema=KEYED)
    with pytest.raises(ValueError, match="format v1"):
        await key_index.positions(v1, [(1,)])
    with pytest.raises(ValueError, match="no identifier fields"):
        await key_index.positions(unkeyed, [(1,)])
    assert index_rows(database_url) == []
    assert (await key_index.positions(table, [])).positions == {}


async def test_rows_another_engine_deletes_and_a_key_held_twice_are_followed(
    key_index: KeyIndex, gateway: IcebergGateway, catalog: Catalog
) -> None:
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(5)]])
    table = catalog.load_table(TABLE)
    [data_file] = cp.live_files(table).data
    commit_position_deletes(table, data_file, [1, 2])  # keys 1 and 2, by another engine
    catalog.load_table(TABLE).append(pa.Table.from_pylist([{"id": 3, "region": "eu", "value": "twice"}], KEYED))

    await assert_answers_as_the_scan(key_index, gateway.load(TABLE), [(key,) for key in range(6)])
    answered = await key_index.positions(gateway.load(TABLE), [(3,)])
    assert len(answered.positions[(3,)]) == 2
    deletes = [
        file for file in cp.live_files(gateway.load(TABLE)).deletes if file.content == DataFileContent.POSITION_DELETES
    ]
    assert len(deletes) == 1


async def test_an_equality_delete_is_refused_as_the_scan_refuses_it_and_the_index_stays_as_it_was(
    key_index: KeyIndex, gateway: IcebergGateway, catalog: Catalog, database_url: str
) -> None:
    """Another engine's equality delete file: a catch-up cannot follow it, and the rebuild's scan (pyiceberg's) cannot
    read it, as key_resolution's cannot: the same refusal, and the index is left at its snapshot."""
    await commit_through_index(key_index, gateway, TABLE, [[Upsert(key, "eu", "a") for key in range(5)]])
    before = index_rows(database_url)
    commit_equality_deletes(catalog.load_table(TABLE), "id", [2])
    table = gateway.load(TABLE)

    with pytest.raises(ValueError, match="does not yet support equality deletes"):
        live_rows(table, [(1,)])
    with pytest.raises(ValueError, match="does not yet support equality deletes"):
        await key_index.positions(table, [(1,)])

    assert index_rows(database_url) == before
