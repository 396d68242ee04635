"""Fan-out: one sink, one epoch numbering, several tables. Each epoch's files go to their tables exactly once,
whatever crashes between the tables of an epoch or whichever table's catalog fails meanwhile.

A writer ensures the tables it routes to (EnsureTables), names each file's table in its pre-commit, and the
committer appends to each table with the sink's markers, recording per table the newest epoch it holds; the sink's
committed epoch is the least of them.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorRpcError, PreCommitFile, TableSpec
from coordinator_service.contract.errors import CheckpointBehind, FailedPrecondition, Fenced, InvalidArgument, NotFound
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from coordinator_service.contract.source_positions import END_OFFSETS, SNAPSHOT_END_OFFSETS
from coordinator_service.contract.views import Registration
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from tests.fixtures.admin import (
    AdminApp,
    AdminFactory,
    commit_lock_held,
    epoch_metadata,
    eventually,
    sink_id_of,
    sink_identity,
    wait_for_commit_lock_waiter,
)
from tests.fixtures.coordinator import (
    ORDERS,
    CoordinatorProcess,
    failpoints_env,
    orders,
    table_order_ids,
    write_parquet,
)
from tests.fixtures.postgres import query

SCHEMA = ORDERS.serialize().to_pybytes()
OWN = "db.orders"
ROUTED = ("db.eu", "db.us")
TABLES = (OWN, *ROUTED)


async def fan_out_sink(admin: AdminApp, sink: str = "orders", routed: tuple[str, ...] = ROUTED) -> Registration:
    registration = await admin.register(sink)
    await admin.runtime.coordinator.ensure_tables(
        sink, registration.writer_term, [TableRequest(table, SCHEMA) for table in routed]
    )
    return registration


def location_of(catalog: Catalog, table: str) -> str:
    return str(catalog.load_table(table).location())


def first_order(epoch: int, table: str) -> int:
    """The orders of an epoch and table: 10 of them, none shared with another epoch or table."""
    return epoch * 100 + TABLES.index(table) * 10 if table in TABLES else epoch * 100 + 90


async def pre_commit(
    admin: AdminApp,
    catalog: Catalog,
    registration: Registration,
    epoch: int,
    tables: tuple[str, ...] = TABLES,
    sink: str = "orders",
    properties: dict[str, str] | None = None,
) -> None:
    """Pre-commit one file of 10 orders in each of the tables (the sink's own named by no table)."""
    files = {
        write_parquet(location_of(catalog, table), orders(first_order(epoch, table), 10)): table for table in tables
    }
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(
            sink,
            epoch,
            registration.writer_term,
            tuple(files),
            file_tables={path: table for path, table in files.items() if table != OWN},
            properties=properties or {},
        )
    )


def expected_orders(epochs: range, table: str) -> Counter[int]:
    return Counter(
        order for epoch in epochs for order in range(first_order(epoch, table), first_order(epoch, table) + 10)
    )


def markers(catalog: Catalog, table: str, sink: str = "orders") -> list[int]:
    return [
        int(properties[MARKER_EPOCH])
        for snapshot in catalog.load_table(table).snapshots()
        if (properties := snapshot_properties(snapshot)).get(MARKER_SINK) == sink
    ]


def on_storage(paths: Iterable[str]) -> set[str]:
    return {path for path in paths if Path(path.removeprefix("file://")).exists()}


def table_epochs(database_url: str) -> dict[str, int]:
    rows = query(database_url, "SELECT table_identifier, committed_epoch FROM sink_tables ORDER BY 1")
    return {str(table): int(str(epoch)) for table, epoch in rows}


def sink_epochs(database_url: str) -> tuple[int, int]:
    [(checkpointed, committed)] = query(database_url, "SELECT checkpointed_epoch, committed_epoch FROM sinks")
    return int(str(checkpointed)), int(str(committed))


def statuses(database_url: str) -> dict[int, str]:
    rows = query(database_url, "SELECT epoch, status FROM pending_sink_state ORDER BY epoch")
    return {int(str(epoch)): str(status) for epoch, status in rows}


async def test_an_epoch_with_files_in_three_tables_is_committed_once_in_each(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    registration = await fan_out_sink(admin)
    await pre_commit(admin, catalog, registration, 0)
    await pre_commit(admin, catalog, registration, 1, tables=(OWN, "db.us"))  # db.eu has nothing in epoch 1
    assert await admin.checkpoint("orders", registration, 1) == 1

    for table in TABLES:
        epochs = range(1) if table == "db.eu" else range(2)
        assert Counter(table_order_ids(catalog.load_table(table))) == expected_orders(epochs, table), table
        assert markers(catalog, table) == [1], f"{table}: one snapshot, with the marker of the group's newest epoch"
    assert table_epochs(database_url) == dict.fromkeys(sorted(TABLES), 1)
    assert sink_epochs(database_url) == (1, 1)
    assert statuses(database_url) == {0: "COMMITTED", 1: "COMMITTED"}

    state = await admin.runtime.coordinator.sink_state("orders")
    assert [(table.table, table.committed_epoch) for table in state.tables] == [(OWN, 1), ("db.eu", 1), ("db.us", 1)]
    shown = (await admin.get("/api/v1/sinks/orders")).json()
    assert [(t["table"], t["committed_epoch"], t["retrying"], t["last_error"]) for t in shown["tables"]] == [
        (OWN, 1, False, None),
        ("db.eu", 1, False, None),
        ("db.us", 1, False, None),
    ]
    detail = (await admin.get("/api/v1/sinks/orders/epochs/0")).json()
    assert (detail["table"], sorted(file["table"] for file in detail["files"])) == (OWN, sorted(TABLES))
    scraped = (await admin.get("/metrics")).text
    assert 'sink_coordinator_table_committed_epoch{sink="orders",table="db.eu"} 1.0' in scraped
    assert 'sink_coordinator_table_commit_retrying{sink="orders",table="db.us"} 0.0' in scraped


async def test_each_tables_snapshot_says_where_the_epoch_ended(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    registration = await fan_out_sink(admin)
    ends = {END_OFFSETS: json.dumps({"orders": {"0": 42}})}
    await pre_commit(admin, catalog, registration, 0, properties=ends)
    await admin.checkpoint("orders", registration, 0)
    for table in TABLES:
        snapshot = catalog.load_table(table).current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        assert snapshot.summary[SNAPSHOT_END_OFFSETS] == ends[END_OFFSETS], table


async def test_a_table_added_mid_stream(admin: AdminApp, catalog: Catalog, database_url: str) -> None:
    registration = await fan_out_sink(admin, routed=("db.eu",))
    for epoch in range(2):
        await pre_commit(admin, catalog, registration, epoch, tables=(OWN, "db.eu"))
    await admin.checkpoint("orders", registration, 1)

    # A file of a table the sink does not have yet is refused, and changes nothing.
    catalog.create_table("db.us", schema=ORDERS)
    before = statuses(database_url)
    with pytest.raises(InvalidArgument, match=r"'db\.us', which is not one of the sink's 2 tables"):
        await pre_commit(admin, catalog, registration, 2)
    assert statuses(database_url) == before

    ensured = await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest("db.us", SCHEMA)]
    )
    assert [t.table for t in ensured.tables] == ["db.us"]
    assert table_epochs(database_url)["db.us"] == 1, "a new table holds every epoch the sink committed before it"
    await pre_commit(admin, catalog, registration, 2)
    assert await admin.checkpoint("orders", registration, 2) == 2
    assert Counter(table_order_ids(catalog.load_table("db.us"))) == expected_orders(range(2, 3), "db.us")
    assert markers(catalog, "db.us") == [2]
    assert table_epochs(database_url) == {"db.eu": 2, OWN: 2, "db.us": 2}


async def test_ensure_tables_refuses_what_it_cannot_do_and_changes_nothing(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    old = await admin.register("orders")
    registration = await admin.register("orders")
    ensure = admin.runtime.coordinator.ensure_tables
    with pytest.raises(Fenced):
        await ensure("orders", old.writer_term, [TableRequest("db.eu", SCHEMA)])
    with pytest.raises(FailedPrecondition, match="never issued"):
        await ensure("orders", registration.writer_term + 1, [TableRequest("db.eu", SCHEMA)])
    with pytest.raises(NotFound):
        await ensure("nobody", 1, [TableRequest("db.eu", SCHEMA)])
    with pytest.raises(InvalidArgument, match="more than once"):
        await ensure("orders", registration.writer_term, [TableRequest("db.eu", SCHEMA), TableRequest("db.eu")])
    with pytest.raises(InvalidArgument, match="no schema to create it"):
        await ensure("orders", registration.writer_term, [TableRequest("db.eu")])
    with pytest.raises(InvalidArgument, match=r"'namespace\.table'"):
        await ensure("orders", registration.writer_term, [TableRequest("eu", SCHEMA)])
    assert not catalog.table_exists("db.eu")
    assert table_epochs(database_url) == {OWN: -1}
    assert (await ensure("orders", registration.writer_term, [])).tables == ()


async def test_ensure_tables_evolves_an_existing_table_and_is_idempotent(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    registration = await fan_out_sink(admin, routed=("db.eu",))
    wider = ORDERS.append(pa.field("region", pa.string()))
    again = await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest("db.eu", wider.serialize().to_pybytes()), TableRequest(OWN)]
    )
    assert [t.table for t in again.tables] == ["db.eu", OWN]
    assert [t.location for t in again.tables] == [location_of(catalog, "db.eu"), location_of(catalog, OWN)]
    assert "region" in catalog.load_table("db.eu").schema().column_names
    assert "region" not in catalog.load_table(OWN).schema().column_names
    assert table_epochs(database_url) == {"db.eu": -1, OWN: -1}


async def test_each_file_is_checked_against_its_own_table(admin: AdminApp, catalog: Catalog) -> None:
    registration = await admin.register("orders")
    other = pa.schema([pa.field("order_id", pa.int64(), nullable=False), pa.field("note", pa.string())])
    await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest("db.notes", other.serialize().to_pybytes())]
    )

    def request(path: str, table: str) -> PreCommitRequest:
        return PreCommitRequest("orders", 0, registration.writer_term, (path,), file_tables={path: table})

    # Written under the sink's own table, named for another: outside that table's location.
    misplaced = write_parquet(location_of(catalog, OWN), orders(0, 10))
    with pytest.raises(InvalidArgument, match="lies outside the table's data directory"):
        await admin.runtime.coordinator.pre_commit(request(misplaced, "db.notes"))
    # Under the right table's location, of the other table's schema.
    misfit = write_parquet(location_of(catalog, "db.notes"), orders(0, 10))
    with pytest.raises(InvalidArgument, match="does not fit the schema"):
        await admin.runtime.coordinator.pre_commit(request(misfit, "db.notes"))
    # With evolve_schema, a table gets the columns of its own files only.
    evolving = write_parquet(location_of(catalog, "db.notes"), orders(0, 10))
    result = await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(
            "orders", 0, registration.writer_term, (evolving,), file_tables={evolving: "db.notes"}, evolve_schema=True
        )
    )
    assert result.record_count == 10
    assert {"customer", "amount"} <= set(catalog.load_table("db.notes").schema().column_names)
    assert "note" not in catalog.load_table(OWN).schema().column_names


async def test_a_table_whose_catalog_fails_waits_while_the_others_commit(
    admin: AdminApp, catalog: Catalog, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """db.eu's storage refuses every commit for a while: db.orders and db.us go on committing, the sink's committed
    epoch waits for db.eu, the epochs it lacks can be neither aborted nor reset away, and once it is back it gets
    every epoch exactly once (the others none a second time)."""
    gateway = admin.runtime.iceberg
    down = {"db.eu"}
    append = gateway.append

    def failing_append(identifier: str, *args: Any) -> int:
        if identifier in down:
            raise OSError(f"the storage of {identifier} is unreachable")
        return append(identifier, *args)

    monkeypatch.setattr(gateway, "append", failing_append)
    registration = await fan_out_sink(admin)
    for epoch in range(2):
        await pre_commit(admin, catalog, registration, epoch)
    await admin.checkpoint("orders", registration, 1, wait=False)

    async def others_hold(epoch: int) -> bool:
        return table_epochs(database_url) == {"db.eu": -1, OWN: epoch, "db.us": epoch}

    await eventually(lambda: others_hold(1), "db.orders and db.us hold epochs 0-1")
    assert sink_epochs(database_url) == (1, -1)
    assert statuses(database_url) == {0: "PENDING", 1: "PENDING"}
    assert catalog.load_table("db.eu").current_snapshot() is None
    shown = {t["table"]: t for t in (await admin.get("/api/v1/sinks/orders")).json()["tables"]}
    assert shown["db.eu"]["retrying"] is True
    assert "the storage of db.eu is unreachable" in shown["db.eu"]["last_error"]
    assert (shown[OWN]["retrying"], shown[OWN]["committed_epoch"], shown["db.eu"]["committed_epoch"]) == (False, 1, -1)
    scraped = (await admin.get("/metrics")).text
    assert 'sink_coordinator_table_commit_retrying{sink="orders",table="db.eu"} 1.0' in scraped

    # Epochs some tables hold: only the committer settles them.
    abort = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "test", "force": True})
    assert abort.status_code == 409, abort.text
    assert "not yet in db.eu" in abort.json()["error"]["message"]
    # A reset first completes the checkpointed epochs in every table (the restart point): not while db.eu fails.
    reset = await admin.post("/api/v1/sinks/orders/reset", json={"confirm": "orders", "reason": "test"})
    assert reset.status_code == 503, reset.text
    assert "no epoch was aborted" in reset.json()["error"]["message"]
    assert "the storage of db.eu is unreachable" in reset.json()["error"]["message"]
    assert statuses(database_url) == {0: "PENDING", 1: "PENDING"}

    # The others keep committing the epochs that come meanwhile.
    await pre_commit(admin, catalog, registration, 2)
    await admin.checkpoint("orders", registration, 2, wait=False)
    await eventually(lambda: others_hold(2), "db.orders and db.us hold epoch 2")

    down.clear()

    async def caught_up() -> bool:
        return table_epochs(database_url) == dict.fromkeys(sorted(TABLES), 2)

    await eventually(caught_up, "db.eu caught up")
    assert sink_epochs(database_url) == (2, 2)
    assert statuses(database_url) == {0: "COMMITTED", 1: "COMMITTED", 2: "COMMITTED"}
    for table in TABLES:
        assert Counter(table_order_ids(catalog.load_table(table))) == expected_orders(range(3), table), table
    assert markers(catalog, OWN) == [1, 2]
    assert markers(catalog, "db.eu") == [2], "db.eu got epochs 0-2 in one snapshot"
    shown = {t["table"]: t for t in (await admin.get("/api/v1/sinks/orders")).json()["tables"]}
    assert (shown["db.eu"]["retrying"], shown["db.eu"]["last_error"]) == (False, None)


@pytest.mark.parametrize("tables_appended", [1, 2])
def test_a_crash_between_the_tables_of_an_epoch(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog, database_url: str, tables_appended: int
) -> None:
    """Killed after `tables_appended` of the epoch's three tables got its files: a restarted coordinator appends
    to the rest, and never again to those."""
    first = coordinator_factory(**failpoints_env(f"commit.between_tables=kill@{tables_appended}"))
    with first.client(retry_seconds=0) as client:
        writer = client.register_writer("orders", OWN, -1, arrow_schema=SCHEMA)
        ensured = client.ensure_tables("orders", writer.writer_term, [TableSpec(table, SCHEMA) for table in ROUTED])
        locations = {OWN: writer.table_location, **{t.table: t.location for t in ensured.tables}}
        files: list[str | PreCommitFile] = [write_parquet(locations[OWN], orders(first_order(0, OWN), 10))]
        files += [
            PreCommitFile(write_parquet(locations[table], orders(first_order(0, table), 10)), table=table)
            for table in ROUTED
        ]
        client.pre_commit("orders", 0, writer.writer_term, files)
        with pytest.raises(CoordinatorRpcError) as killed:
            client.commit_checkpoint("orders", 0, writer.writer_term, wait=True)
        assert killed.value.code == grpc.StatusCode.UNAVAILABLE
    assert first.wait_killed() == -9
    assert [bool(markers(catalog, table)) for table in TABLES] == [i < tables_appended for i in range(3)]
    assert statuses(database_url) == {0: "PENDING"}
    assert table_epochs(database_url) == dict.fromkeys(sorted(TABLES), -1), "nothing recorded before the pass ends"

    second = coordinator_factory()
    second.wait_for_log("epochs committed", sink="orders", epochs=[0])
    for table in TABLES:
        assert Counter(table_order_ids(catalog.load_table(table))) == expected_orders(range(1), table), table
        assert markers(catalog, table) == [0], f"{table} was appended to once"
    assert statuses(database_url) == {0: "COMMITTED"}
    assert table_epochs(database_url) == dict.fromkeys(sorted(TABLES), 0)
    with second.client() as client:
        state = client.sink_state("orders")
    assert [(t.table, t.committed_epoch) for t in state.tables] == [(OWN, 0), ("db.eu", 0), ("db.us", 0)]
    assert state.committed_epoch == 0


async def test_maintenance_runs_on_every_table_and_keeps_each_tables_unrecorded_marker(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    # No scheduled or threshold-triggered run (a commit past SNAPSHOT_MAX_COUNT asks for one): the operator's run
    # below is the one that expires, and what it counts is all that was expired.
    admin = await admin_factory(snapshot_max_count=1, compaction_min_files=1_000_000, maintenance_enabled=False)
    registration = await fan_out_sink(admin, routed=("db.eu",))
    for epoch in range(3):
        await pre_commit(admin, catalog, registration, epoch, tables=(OWN, "db.eu"))
        assert await admin.checkpoint("orders", registration, epoch) == epoch
    # Epoch 3 reached db.eu and the committer died before its record (then someone else appended to db.eu).
    await pre_commit(admin, catalog, registration, 3, tables=(OWN, "db.eu"))
    [eu_files] = [entries for table, entries in epoch_metadata(database_url, 3).by_table().items() if table == "db.eu"]
    crashed = await asyncio.to_thread(
        admin.runtime.iceberg.append, "db.eu", await sink_identity(admin, "orders"), 3, "crashed", eu_files
    )
    catalog.load_table("db.eu").append(pa.Table.from_pylist(orders(5000, 5), schema=ORDERS))

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert run.outcome == "ok", run.error
    assert run.snapshots_expired == 2 + 3, "db.orders kept its newest of 3, db.eu its newest and epoch 3's marker"
    assert len(catalog.load_table(OWN).snapshots()) == 1
    assert {s.snapshot_id for s in catalog.load_table("db.eu").snapshots()} >= {crashed}
    for table in (OWN, "db.eu"):
        assert Counter(table_order_ids(catalog.load_table(table))) >= expected_orders(range(3), table), table


async def test_recovery_aborts_an_epoch_in_every_table_and_the_cleaner_deletes_its_files(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    admin = await admin_factory(recovery_files_keep_seconds=0)
    registration = await fan_out_sink(admin)
    await pre_commit(admin, catalog, registration, 0)
    paths = epoch_metadata(database_url, 0).paths
    assert len(paths) == 3

    again = await admin.register("orders")  # the writer restarted with no checkpoint: epoch 0 is aborted
    assert again.aborted_epochs == (0,)

    async def cleaned() -> bool:
        return statuses(database_url) == {0: "ABORTED"} and bool(
            query(database_url, "SELECT files_cleaned FROM pending_sink_state WHERE epoch = 0")[0][0]
        )

    await eventually(cleaned, "epoch 0's files cleaned")
    assert on_storage(paths) == set(), "a table's file was left"
    assert all(catalog.load_table(table).current_snapshot() is None for table in TABLES)


async def test_a_checkpoint_behind_what_one_table_holds_is_refused(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """Epoch 0 is in db.eu (a committer appended it there and lost it all, checkpoint included): a writer that
    registers from no checkpoint is refused, and epoch 0, in db.eu only, is neither aborted nor marked."""
    registration = await fan_out_sink(admin)
    await pre_commit(admin, catalog, registration, 0)
    [eu_files] = [entries for table, entries in epoch_metadata(database_url, 0).by_table().items() if table == "db.eu"]
    await asyncio.to_thread(
        admin.runtime.iceberg.append, "db.eu", await sink_identity(admin, "orders"), 0, "lost", eu_files
    )
    with pytest.raises(CheckpointBehind, match=r"its tables already hold epochs \[0\]"):
        await admin.register("orders")
    assert statuses(database_url) == {0: "PENDING"}
    assert table_epochs(database_url) == dict.fromkeys(sorted(TABLES), -1)


async def test_a_reset_of_a_half_appended_group_leaves_one_restart_point(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """Defect: epoch 0 has files only in db.eu, epoch 1 only in db.orders; the pass appended db.orders (the sink's
    own table first) and stopped before db.eu. A reset then marked 1, aborted 0 and reported -1: a restart from -1
    writes epoch 1 twice, one from 1 loses epoch 0. After a reset every table holds exactly the epochs up to the
    reported one."""
    registration = await fan_out_sink(admin)
    await pre_commit(admin, catalog, registration, 0, tables=("db.eu",))
    await pre_commit(admin, catalog, registration, 1, tables=(OWN,))
    sink_id = sink_id_of(database_url, "orders")
    async with commit_lock_held(database_url, sink_id) as lock:
        await admin.checkpoint("orders", registration, 1, wait=False)
        # What the committer did before it died between the tables: the group's snapshot in the sink's own table.
        await asyncio.to_thread(
            admin.runtime.iceberg.append,
            OWN,
            await sink_identity(admin, "orders"),
            1,
            "died-between-tables",
            epoch_metadata(database_url, 1).data_files,
        )
        reset = asyncio.create_task(
            admin.post("/api/v1/sinks/orders/reset", json={"confirm": "orders", "reason": "checkpoint lost"})
        )
        await wait_for_commit_lock_waiter(lock, sink_id)
    response = await reset
    assert response.status_code == 200, response.text
    restart = response.json()["sink"]["committed_epoch"]

    written = {0: ("db.eu",), 1: (OWN,)}
    for table in TABLES:
        held = sum(
            (expected_orders(range(e, e + 1), table) for e in range(restart + 1) if table in written[e]), Counter()
        )
        assert Counter(table_order_ids(catalog.load_table(table))) == held, table
    assert restart == 1
    assert response.json()["aborted_epochs"] == []


async def test_a_table_dropped_for_good_is_removed_from_its_sink_with_its_records_accounted_for(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """A fan-out table dropped from the catalog wedged its sink: the committer retried it forever, and a forced
    abort and a reset answered 422. The operator removes it from the sink; the other tables go on."""
    registration = await fan_out_sink(admin)
    await pre_commit(admin, catalog, registration, 0)
    catalog.drop_table("db.eu")
    await admin.checkpoint("orders", registration, 0, wait=False)

    async def others_hold_epoch_0() -> bool:
        return table_epochs(database_url) == {"db.eu": -1, OWN: 0, "db.us": 0}

    await eventually(others_hold_epoch_0, "db.orders and db.us hold epoch 0, db.eu cannot")
    remove = "/api/v1/sinks/orders/tables/{}/remove"
    body = {"confirm": "db.eu", "reason": "dropped by its owners"}
    assert (await admin.post(remove.format(OWN), json={**body, "confirm": OWN})).status_code == 409
    assert (await admin.post(remove.format("db.nope"), json={**body, "confirm": "db.nope"})).status_code == 404
    assert (await admin.post(remove.format("db.eu"), json={**body, "confirm": "db.us"})).status_code == 422

    response = await admin.post(remove.format("db.eu"), json=body)
    assert response.status_code == 200, response.text
    assert response.json()["given_up"] == [{"epoch": 0, "files": 1, "records": 10}]
    assert [table["table"] for table in response.json()["sink"]["tables"]] == [OWN, "db.us"]

    # The writer was fenced: one restarted without db.eu in its routes goes on.
    restarted = await admin.register("orders", checkpointed_epoch=0)
    assert restarted.writer_term == registration.writer_term + 2  # fenced by the removal, then registered
    assert await admin.checkpoint("orders", restarted, 0) == 0
    stray = write_parquet(location_of(catalog, OWN), orders(first_order(1, "db.eu"), 10))
    with pytest.raises(InvalidArgument, match="not one of the sink's"):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest("orders", 1, restarted.writer_term, (stray,), file_tables={stray: "db.eu"})
        )
    await pre_commit(admin, catalog, restarted, 1, tables=(OWN, "db.us"))
    assert await admin.checkpoint("orders", restarted, 1) == 1
    for table in (OWN, "db.us"):
        assert Counter(table_order_ids(catalog.load_table(table))) == expected_orders(range(2), table), table
