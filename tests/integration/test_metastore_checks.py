"""A metastore restored to an earlier point, another table under a sink's table's name, another catalog: detected
(the sink suspended, with the way back in its reason and a gauge), never served as if nothing happened; reconciled
one sink at a time or every suspended sink at once (the admin API and the command line)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import SecretStr
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import SinkSuspended
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.log import sink_rows, sink_tables
from coordinator_service.runtime import Runtime
from coordinator_service.settings import Settings
from tests.fixtures.admin import AdminApp, AdminFactory, CatalogDatabase, commit_lock_held, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders, table_order_ids, write_parquet
from tests.fixtures.postgres import query


async def committed(admin: AdminApp, epochs: int, sink: str = "orders") -> None:
    registration = await admin.register(sink, table=f"db.{sink}")
    for epoch in range(epochs):
        await admin.pre_commit(sink, registration, epoch, epoch * 10)
        assert await admin.checkpoint(sink, registration, epoch) == epoch


def restore_earlier_backup(database_url: str, epoch: int, *sinks: str) -> None:
    """What the log of `sinks` (none named: every sink) looked like when epoch `epoch` was the last one committed (the
    catalog stays current)."""
    names = list(sinks) or [str(name) for (name,) in query(database_url, "SELECT name FROM sinks")]
    of_sinks = "sink_id IN (SELECT id FROM sinks WHERE name = ANY(%s))"
    query(database_url, f"DELETE FROM pending_sink_state WHERE epoch > %s AND {of_sinks}", epoch, names)
    query(database_url, f"UPDATE sink_tables SET committed_epoch = %s WHERE {of_sinks}", epoch, names)
    query(
        database_url,
        "UPDATE sinks SET checkpointed_epoch = %s, committed_epoch = %s WHERE name = ANY(%s)",
        epoch,
        epoch,
        names,
    )


async def test_a_metastore_restored_to_an_earlier_point_is_detected_and_reconciled(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """On-call review: a metastore restored to an earlier dump while the catalog stayed current: the pod was ready,
    logged nothing, reported committed epoch 4 for a table holding 9 and refused the running writer."""
    await committed(admin, 5)
    restore_earlier_backup(database_url, 2)

    found = await admin.runtime.checks.check_all()

    assert "holds epoch 4" in found["orders"] and "reconcile" in found["orders"]
    sink = (await admin.get("/api/v1/sinks/orders")).json()
    assert sink["suspended_reason"] == found["orders"]
    assert 'sink_coordinator_sink_suspended{sink="orders"} 1.0' in (await admin.get("/metrics")).text
    term = sink["writer_term"]
    with pytest.raises(SinkSuspended, match="metastore is behind"):
        await admin.runtime.coordinator.pre_commit(PreCommitRequest("orders", 3, term, ()))
    with pytest.raises(SinkSuspended):
        await admin.register("orders", checkpointed_epoch=4)

    wrong = await admin.post("/api/v1/sinks/orders/reconcile", json={"confirm": "other", "reason": "restore"})
    assert wrong.status_code == 422
    response = await admin.post("/api/v1/sinks/orders/reconcile", json={"confirm": "orders", "reason": "restore"})
    assert response.status_code == 200, response.text
    reconciled = response.json()
    assert (reconciled["restart_epoch"], reconciled["tables"]) == (4, {"db.orders": 4})
    assert reconciled["sink"]["suspended_reason"] is None
    assert await admin.runtime.checks.check_all() == {}

    # The documented restart: a new checkpoint, from the restart point's end offsets (new records).
    new = await admin.register("orders", checkpointed_epoch=-1)
    await admin.pre_commit("orders", new, 0, 100)
    assert await admin.checkpoint("orders", new, 0) == 0
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(50), *range(100, 110)]


# How late an asyncio timer may fire on a loaded machine (two cores shared with other test runs).
TIMER_LATENESS_SECONDS = 0.5


async def test_a_running_coordinator_finds_a_restored_metastore_by_itself_within_one_check_interval(
    admin_factory: AdminFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27.5's goal: the restore is detected within one check interval, by the running process's own periodic
    check (no one calls it): the first round that starts after the restore finds it, within the interval."""
    interval = 1.0
    admin = await admin_factory(metastore_check_interval_seconds=interval)
    await committed(admin, 5)
    checks = admin.runtime.checks
    rounds: asyncio.Queue[tuple[float, dict[str, str]]] = asyncio.Queue()
    check_all = checks.check_all

    async def observed_round() -> dict[str, str]:
        started = time.monotonic()
        found = await check_all()
        rounds.put_nowait((started, found))
        return found

    monkeypatch.setattr(checks, "check_all", observed_round)
    async with asyncio.timeout(interval + 10):
        _, found = await rounds.get()
    assert found == {}

    restore_earlier_backup(database_url, 2)
    restored_at = time.monotonic()
    async with asyncio.timeout(interval + 10):
        started, found = await rounds.get()

    assert "holds epoch 4" in found["orders"], found
    assert started - restored_at <= interval + TIMER_LATENESS_SECONDS, started - restored_at
    sink = (await admin.get("/api/v1/sinks/orders")).json()
    assert sink["suspended_reason"] == found["orders"]
    assert 'sink_coordinator_sink_suspended{sink="orders"} 1.0' in (await admin.get("/metrics")).text


async def test_another_table_under_the_sinks_table_name_is_detected(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    await committed(admin, 2)
    assert await admin.runtime.checks.check_all() == {}  # records the table's UUID
    catalog.drop_table("db.orders")
    catalog.create_table("db.orders", schema=ORDERS)

    found = await admin.runtime.checks.check_all()
    assert "another table under its name" in found["orders"]
    [(suspended,)] = query(database_url, "SELECT suspended_reason FROM sinks")
    assert suspended == found["orders"]


async def test_a_coordinator_started_on_another_catalog_suspends_the_sink_instead_of_creating_its_table_again(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase, catalog: Catalog, database_url: str
) -> None:
    """On-call review: restarted on another catalog, the coordinator silently created a new empty table and committed
    there while the API still named the old catalog."""
    first = await admin_factory()
    await committed(first, 2)
    await first.runtime.close()

    moved = await admin_factory(catalog=catalog_database.properties, catalog_name="elsewhere")
    found = await moved.runtime.checks.check_all()
    assert "created in catalog 'default'" in found["orders"]
    with pytest.raises(SinkSuspended, match="catalog"):
        await moved.register("orders", checkpointed_epoch=1)
    location = f"{catalog_database.warehouse}/db/orders"
    path = write_parquet(location, orders(20, 10))
    with pytest.raises(SinkSuspended):
        await moved.runtime.coordinator.pre_commit(PreCommitRequest("orders", 2, 2, (path,)))
    assert query(database_url, "SELECT count(*) FROM pending_sink_state WHERE epoch = 2") == [(0,)]
    assert sink_id_of(database_url, "orders") == 1
    # An operator's reconcile cannot take the other catalog's tables as the sink's: refused, nothing changed.
    before = query(database_url, "SELECT generation, writer_term, suspended_reason FROM sinks")
    refused = await moved.post("/api/v1/sinks/orders/reconcile", json={"confirm": "orders", "reason": "moved"})
    assert refused.status_code == 409
    assert "configure the catalog it was created in" in refused.json()["error"]["message"]
    assert query(database_url, "SELECT generation, writer_term, suspended_reason FROM sinks") == before


async def restored_metastore_with_three_suspended_sinks(admin: AdminApp, database_url: str) -> dict[str, str]:
    """orders and clicks behind their tables (epochs 0-4 committed, the log restored to epoch 2), moved created in
    another catalog, steady in step; what the check found."""
    for sink in ("orders", "clicks", "moved", "steady"):
        await committed(admin, 5, sink)
    restore_earlier_backup(database_url, 2, "orders", "clicks")
    query(database_url, "UPDATE sinks SET catalog = 'elsewhere' WHERE name = 'moved'")
    found = await admin.runtime.checks.check_all()
    assert sorted(found) == ["clicks", "moved", "orders"]
    return found


async def test_every_suspended_sink_is_reconciled_at_once(admin: AdminApp, catalog: Catalog, database_url: str) -> None:
    """Issue 27.5: a bulk reconcile. After a restore of the metastore every sink it put behind its tables is suspended;
    one request reconciles them all, reports the one it cannot (another catalog) and leaves the sink in step alone."""
    found = await restored_metastore_with_three_suspended_sinks(admin, database_url)
    steady_term = (await admin.get("/api/v1/sinks/steady")).json()["writer_term"]

    response = await admin.post("/api/v1/sinks/reconcile", json={"all_suspended": True, "reason": "restore INC-7"})

    assert response.status_code == 200, response.text
    answer = response.json()
    assert [(each["sink"]["sink"], each["restart_epoch"], each["tables"]) for each in answer["reconciled"]] == [
        ("clicks", 4, {"db.clicks": 4}),
        ("orders", 4, {"db.orders": 4}),
    ]
    [refused] = answer["refused"]
    assert refused["sink"] == "moved" and refused["error"]["code"] == "FAILED_PRECONDITION"
    assert "configure the catalog it was created in" in refused["error"]["message"]
    assert await admin.runtime.checks.check_all() == {"moved": found["moved"]}
    assert (await admin.get("/api/v1/sinks/steady")).json()["writer_term"] == steady_term
    # Each goes on from its restart point, as after its own reconcile.
    for sink in ("orders", "clicks"):
        new = await admin.register(sink, checkpointed_epoch=-1, table=f"db.{sink}")
        await admin.pre_commit(sink, new, 0, 100)
        assert await admin.checkpoint(sink, new, 0) == 0
        assert table_order_ids(catalog.load_table(f"db.{sink}")) == [*range(50), *range(100, 110)]


# Requests to reconcile several sinks that must be refused, and the status that says so.
REFUSED_BULK_RECONCILES: list[tuple[dict[str, object], int]] = [
    ({"sinks": ["orders", "steady"], "reason": "r"}, 409),  # one is in step: it would lose its writer
    ({"sinks": ["orders", "nowhere"], "reason": "r"}, 404),
    ({"sinks": ["orders", "../db"], "reason": "r"}, 404),
    ({"sinks": ["orders", "x" * 301], "reason": "r"}, 422),
    ({"sinks": [], "reason": "r"}, 422),
    ({"sinks": ["orders"], "all_suspended": True, "reason": "r"}, 422),
    ({"reason": "r"}, 422),
    ({"all_suspended": "yes", "reason": "r"}, 422),
    ({"all_suspended": True, "reason": ""}, 422),
    ({"all_suspended": True, "reason": "a\x00b"}, 422),
    ({"all_suspended": True}, 422),
    ({"all_suspended": True, "reason": "r", "confirm": "all"}, 422),
    ({"sinks": "orders", "reason": "r"}, 422),
    ({"sinks": [f"s{i}" for i in range(1001)], "reason": "r"}, 422),
]


async def test_a_bulk_reconcile_that_is_refused_changes_nothing(admin: AdminApp, database_url: str) -> None:
    await restored_metastore_with_three_suspended_sinks(admin, database_url)
    before = query(database_url, "SELECT name, writer_term, suspended_reason FROM sinks ORDER BY name")
    for body, status in REFUSED_BULK_RECONCILES:
        response = await admin.post("/api/v1/sinks/reconcile", json=body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["message"], body
        assert query(database_url, "SELECT name, writer_term, suspended_reason FROM sinks ORDER BY name") == before


async def test_a_bulk_reconcile_needs_the_admin_token(admin_factory: AdminFactory, database_url: str) -> None:
    token = "reconcile-admin-token-Zq3vX9pL2mN8rT5w"
    admin = await admin_factory(admin_token=token)
    await restored_metastore_with_three_suspended_sinks(admin, database_url)
    body = {"all_suspended": True, "reason": "restore"}
    assert (await admin.post("/api/v1/sinks/reconcile", json=body)).status_code == 401
    assert query(database_url, "SELECT count(*) FROM sinks WHERE suspended_reason IS NOT NULL") == [(3,)]
    allowed = await admin.post("/api/v1/sinks/reconcile", json=body, headers={"Authorization": f"Bearer {token}"})
    assert allowed.status_code == 200, allowed.text


async def test_the_command_line_reconciles_suspended_sinks_as_the_api_does(
    admin: AdminApp, catalog: Catalog, database_url: str, tmp_path: Path
) -> None:
    """`sink-coordinator reconcile`, run beside a serving coordinator (this test's runtime): the sinks named, or every
    suspended one (--all); one line per sink; exit 1 when one could not be, 2 for a command that names none."""
    found = await restored_metastore_with_three_suspended_sinks(admin, database_url)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        "SINK_COORDINATOR_DATABASE_URL": database_url,
        "SINK_COORDINATOR_DATA_DIR": str(tmp_path / "coordinator"),
    }

    async def reconcile_command(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "coordinator_service.cli", "reconcile", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    unnamed = await reconcile_command("--reason", "restore")
    assert (unnamed.returncode, unnamed.stderr.strip()) == (
        2,
        "cannot reconcile: name the suspended sinks to reconcile, or give --all",
    )
    in_step = await reconcile_command("orders", "steady", "--reason", "restore")
    assert in_step.returncode == 1
    assert in_step.stderr.strip().startswith("cannot reconcile: sinks 'steady' are not suspended"), in_step.stderr
    every = await reconcile_command("--all", "--reason", "restore INC-7")

    assert every.returncode == 1, every.stderr
    assert every.stdout.strip().splitlines() == [
        "sink clicks reconciled: restart epoch 4, tables db.clicks at 4",
        "sink orders reconciled: restart epoch 4, tables db.orders at 4",
        "sink moved not reconciled: sink moved was created in catalog 'elsewhere', the coordinator uses 'default': "
        "configure the catalog it was created in; nothing was changed",
    ]
    assert await admin.runtime.checks.check_all() == {"moved": found["moved"]}
    # The serving coordinator commits the reconciled sinks' new writers.
    for sink in ("orders", "clicks"):
        new = await admin.register(sink, checkpointed_epoch=-1, table=f"db.{sink}")
        await admin.pre_commit(sink, new, 0, 100)
        assert await admin.checkpoint(sink, new, 0) == 0
        assert table_order_ids(catalog.load_table(f"db.{sink}")) == [*range(50), *range(100, 110)]


async def test_a_committer_that_met_a_suspension_commits_the_sink_once_another_process_reconciled_it(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str, tmp_path: Path
) -> None:
    """A pass that found its sink suspended (a check on any replica suspended it after the pass was asked for: while
    it waited out its commit interval, say) stuck this process's committer until an operator resumed it here: after a
    reconcile by another process (the command line, another replica) the sink's new writer was never committed by it,
    and its stuck gauge paged SinkCommitterStuck. The committer leaves a suspended sink alone instead, and commits it
    once it is back."""
    serving = await admin_factory()
    registration = await serving.register("orders")
    await serving.pre_commit("orders", registration, 0, 0)
    assert await serving.checkpoint("orders", registration, 0) == 0
    sink_id = sink_id_of(database_url, "orders")
    # Epoch 1 checkpointed while its pass cannot begin (the lock busy), the sink suspended meanwhile.
    async with commit_lock_held(database_url, sink_id):
        await serving.pre_commit("orders", registration, 1, 10)
        await serving.checkpoint("orders", registration, 1, wait=False)
        query(database_url, "UPDATE sinks SET suspended_reason = 'out of step, found by another replica'")
    committer = serving.runtime.committer
    passed = asyncio.create_task(committer.wait_for_pass(sink_id, 15))
    committer.wake(sink_id)
    await passed
    assert committer.health[sink_id].stuck is None

    elsewhere = await Runtime.open(
        Settings(database_url=SecretStr(database_url), data_dir=tmp_path / "coordinator", allowed_hosts=["x"])
    )
    try:
        operations = Operations(
            elsewhere.database,
            elsewhere.iceberg,
            elsewhere.committer,
            elsewhere.cleaner,
            elsewhere.maintainer,
            elsewhere.settings,
        )
        reconciled = await operations.reconcile_suspended(None, "restore", Operator("cli", "elsewhere"))
        assert [(each.sink.sink.name, each.restart_epoch) for each in reconciled.reconciled] == [("orders", 0)]
    finally:
        await elsewhere.close()

    new = await serving.register("orders", checkpointed_epoch=-1)
    await serving.pre_commit("orders", new, 0, 100)
    async with asyncio.timeout(15):
        assert await serving.checkpoint("orders", new, 0) == 0
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(10), *range(100, 110)]


async def test_a_sink_that_commits_while_it_is_checked_is_not_taken_for_a_restored_metastore(admin: AdminApp) -> None:
    """A check reads the log, then each table: a commit between the two takes the table past the checkpoint the
    check read, as a restored metastore would. The check decides on the log as it is after the table was read.
    Before, the sink was suspended, and its writer refused (CI, 2026-11-29: a rolling upgrade's new replica checked
    its sinks at start while the writer streamed: "table db.orders holds epoch 235 of sink orders, but the log's
    checkpoint is epoch 232")."""
    registration = await admin.register("orders")
    database = admin.runtime.database
    async with database.transaction() as session:  # what the check read before the commit
        [read_before] = [sink for sink in await sink_rows.all_sinks(session) if sink.name == "orders"]
        tables = (await sink_tables.tables_of_sinks(session, [read_before.id]))[read_before.id]
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0, wait=True) == 0
    assert read_before.checkpointed_epoch == -1
    assert await admin.runtime.checks.check(read_before, tables) is None
    assert (await admin.get("/api/v1/sinks/orders")).json()["committed_epoch"] == 0
    await admin.pre_commit("orders", registration, 1, 10)  # the writer is served
