"""The admin API (/api/v1) against the real app, its committer and a real PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog import Catalog
from sqlalchemy import text

from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import SinkOverview
from tests.fixtures.admin import (
    AdminApp,
    AdminFactory,
    CatalogDatabase,
    commit_lock_held,
    epoch_metadata,
    eventually,
    sink_id_of,
    sink_identity,
    wait_for_commit_lock_waiter,
)
from tests.fixtures.coordinator import table_files, table_order_ids

TOKEN = "s3cret-admin-token-Zq3vX9pL2mN8rT5wY"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def error_of(response: object) -> dict[str, str]:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


async def epoch_state(admin: AdminApp, sink: str, epoch: int) -> dict[str, Any]:
    response = await admin.get(f"/api/v1/sinks/{sink}/epochs/{epoch}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_sinks_show_epochs_writer_and_committer(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    await admin.pre_commit("orders", registration, 1, 10)
    await admin.pre_commit("orders", registration, 2, 20)

    listing = await admin.get("/api/v1/sinks")
    assert listing.status_code == 200
    [sink] = listing.json()["sinks"]
    one = (await admin.get("/api/v1/sinks/orders")).json()
    assert one["oldest_pending_age_seconds"] >= sink["oldest_pending_age_seconds"]
    assert {**one, "oldest_pending_age_seconds": None} == {**sink, "oldest_pending_age_seconds": None}
    assert sink["sink"] == "orders"
    assert sink["table"] == "db.orders"
    assert (sink["checkpointed_epoch"], sink["committed_epoch"]) == (0, 0)
    assert (sink["writer_term"], sink["writer_count"], sink["generation"]) == (1, 1, 0)
    assert (sink["pending_epochs"], sink["aborted_epochs"]) == (2, 0)
    assert 0 <= sink["oldest_pending_age_seconds"] < 60
    assert sink["committer"]["state"] == "healthy"
    assert sink["last_commit_at"] is not None
    assert sink["awaiting_writer_after_reset"] is False


async def test_unknown_sink_and_epoch_are_404_in_the_error_format(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    for path in (
        "/api/v1/sinks/nope",
        "/api/v1/sinks/nope/epochs",
        "/api/v1/sinks/nope/epochs/0",
        "/api/v1/sinks/orders/epochs/7",
        "/api/v1/sinks/bad%20name%00/epochs",
        "/api/v1/nothing-here",
    ):
        response = await admin.get(path)
        assert response.status_code == 404, (path, response.text)
        assert error_of(response)["code"] == "NOT_FOUND"
    message = error_of(await admin.get("/api/v1/sinks/orders/epochs/7"))["message"]
    assert "no epoch 7" in message
    assert "is not registered" in error_of(await admin.get("/api/v1/sinks/nope"))["message"]


async def test_bad_parameters_are_422_not_500(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    for path, params in (
        ("/api/v1/sinks/orders/epochs", {"status": "lost"}),
        ("/api/v1/sinks/orders/epochs", {"limit": "0"}),
        ("/api/v1/sinks/orders/epochs", {"limit": "abc"}),
        ("/api/v1/sinks/orders/epochs", {"cursor": "not-a-cursor"}),
        ("/api/v1/sinks/orders/epochs", {"cursor": "eyJiZWxvdyI6IC0xfQ=="}),  # {"below": -1}
        ("/api/v1/sinks/orders/epochs/-1", {}),
        ("/api/v1/sinks/orders/epochs/99999999999999999999", {}),
    ):
        response = await admin.get(path, params=params)
        assert response.status_code == 422, (path, params, response.text)
        assert error_of(response)["code"] == "INVALID_ARGUMENT"
    assert "cursor" in error_of(await admin.get("/api/v1/sinks/orders/epochs", params={"cursor": "x"}))["message"]
    for body in ({}, {"reason": ""}, {"reason": "nul \x00 byte"}, {"reason": "ok", "force": "maybe"}, [1]):
        response = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json=body)
        assert response.status_code == 422, (body, response.text)
        assert error_of(response)["message"].startswith("the request is invalid: body")
    response = await admin.post(
        "/api/v1/sinks/orders/epochs/0/abort", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert (await epoch_state(admin, "orders", 0))["status"] == "PENDING"


async def test_messages_quote_at_most_200_characters_of_the_input(admin: AdminApp) -> None:
    await admin.register("orders")
    response = await admin.get("/api/v1/sinks/" + "n" * 5000)
    assert response.status_code == 404
    message = error_of(response)["message"]
    assert "is not registered" in message and "n" * 201 not in message, message
    response = await admin.post("/api/v1/sinks/orders/reset", json={"confirm": "c" * 300, "reason": "why"})
    assert response.status_code == 422, response.text
    message = error_of(response)["message"]
    assert "confirm must repeat" in message and "c" * 201 not in message, message


async def test_a_value_postgresql_refuses_is_422_not_500(admin: AdminApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last net: a psycopg DataError that reaches the adapter unchecked is still the request's fault."""

    async def refused_by_postgresql(operations: Operations) -> list[SinkOverview]:
        async with admin.runtime.database.transaction() as session:
            await session.execute(text("SELECT CAST(:value AS text)"), {"value": "nul \x00 byte"})
        raise AssertionError("PostgreSQL stored a NUL byte")

    monkeypatch.setattr(Operations, "sinks", refused_by_postgresql)
    response = await admin.get("/api/v1/sinks")
    assert response.status_code == 422, response.text
    assert error_of(response) == {
        "code": "INVALID_ARGUMENT",
        "message": "the request holds a value that cannot be stored: "
        "PostgreSQL text fields cannot contain NUL (0x00) bytes",
    }


async def test_epochs_page_newest_first_by_status(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    for epoch in range(5):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
    await admin.checkpoint("orders", registration, 1)
    await admin.post("/api/v1/sinks/orders/epochs/4/abort", json={"reason": "test", "force": True})

    seen: list[list[int]] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await admin.get("/api/v1/sinks/orders/epochs", params=params)).json()
        seen.append([epoch["epoch"] for epoch in page["epochs"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [[4, 3], [2, 1], [0]]

    async def epochs_with(status: str) -> list[tuple[int, str]]:
        page = (await admin.get("/api/v1/sinks/orders/epochs", params={"status": status})).json()
        return [(epoch["epoch"], epoch["status"]) for epoch in page["epochs"]]

    assert await epochs_with("pending") == [(3, "PENDING"), (2, "PENDING")]
    assert await epochs_with("committed") == [(1, "COMMITTED"), (0, "COMMITTED")]
    assert await epochs_with("aborted") == [(4, "ABORTED")]


async def test_one_epoch_with_its_files(admin: AdminApp, database_url: str) -> None:
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    epoch = await epoch_state(admin, "orders", 0)
    assert epoch["status"] == "COMMITTED"
    assert (epoch["attempt"], epoch["file_count"], epoch["record_count"]) == (1, 1, 10)
    assert epoch["snapshot_id"] is not None
    assert epoch["table"] == "db.orders"
    assert [file["path"] for file in epoch["files"]] == [path]
    assert epoch["files"][0]["record_count"] == 10
    assert epoch_metadata(database_url, 0).paths == {path}


async def test_abort_of_a_pending_epoch_needs_force_and_does_not_wedge_the_writer(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    """Item 10: Spark may have checkpointed a PENDING epoch already (its report not yet arrived)."""
    admin = await admin_factory(admin_token=TOKEN, admin_read_requires_token=False)
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)

    refused = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "poison pill"}, headers=AUTH)
    assert refused.status_code == 409, refused.text
    assert "force=true" in error_of(refused)["message"]
    assert (await epoch_state(admin, "orders", 0))["status"] == "PENDING"

    body = {"reason": "poison pill", "force": True}
    response = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    aborted = response.json()
    assert aborted["changed"] is True
    assert "10 records will not reach the table" in aborted["warning"]
    assert aborted["epoch"]["status"] == "ABORTED"
    assert aborted["epoch"]["reason"] == "operator abort by admin from 10.0.0.7:40123: poison pill"

    again = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json=body, headers=AUTH)
    assert again.status_code == 200
    assert again.json()["changed"] is False
    assert again.json()["epoch"]["reason"] == aborted["epoch"]["reason"]

    # Spark had checkpointed batch 0: its report is taken, the epoch stays aborted, and the stream goes on.
    assert await admin.checkpoint("orders", registration, 0) == 0
    await admin.pre_commit("orders", registration, 1, 10)
    assert await admin.checkpoint("orders", registration, 1) == 1

    async def cleaned() -> bool:
        return bool((await epoch_state(admin, "orders", 0))["files_cleaned"])

    await eventually(cleaned, "the aborted epoch's files deleted")
    assert not await asyncio.to_thread(Path(path.removeprefix("file://")).exists)
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10, 20))


async def test_abort_of_a_committed_epoch_is_409(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    for force in (False, True):
        response = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "late", "force": force})
        assert response.status_code == 409
        assert error_of(response)["code"] == "FAILED_PRECONDITION"
        assert "COMMITTED" in error_of(response)["message"]


async def test_abort_of_a_checkpointed_epoch_needs_force_and_waits_for_the_committer(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(admin_lock_timeout_seconds=0.3)
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    async with commit_lock_held(database_url, sink_id_of(database_url, "orders")):
        # The committer cannot take the sink while the test holds its lock: epoch 0 stays PENDING.
        await admin.checkpoint("orders", registration, 0, wait=False)

        refused = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad"})
        assert refused.status_code == 409
        assert "force=true" in error_of(refused)["message"]

        busy = await admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad", "force": True})
        assert busy.status_code == 503
        assert error_of(busy)["code"] == "UNAVAILABLE"
        assert "nothing was changed" in error_of(busy)["message"]
        assert (await epoch_state(admin, "orders", 0))["status"] == "PENDING"


async def test_forced_abort_takes_the_commit_lock_from_the_committer(
    admin: AdminApp, database_url: str, catalog: Catalog
) -> None:
    registration = await admin.register("orders")
    sink_id = sink_id_of(database_url, "orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    async with commit_lock_held(database_url, sink_id) as lock:
        await admin.checkpoint("orders", registration, 0, wait=False)
        forced = asyncio.create_task(
            admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad", "force": True})
        )
        await wait_for_commit_lock_waiter(lock, sink_id)
    # PostgreSQL hands the released lock to the queued abort, before the committer tries again.
    response = await forced
    assert response.status_code == 200, response.text
    assert response.json()["epoch"]["status"] == "ABORTED"
    assert "10 records will not reach the table" in response.json()["warning"]

    await admin.pre_commit("orders", registration, 1, 10)
    assert await admin.checkpoint("orders", registration, 1) == 1
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10, 20))
    assert path not in table_files(catalog.load_table("db.orders"))


async def test_forced_abort_rechecks_the_epoch_once_it_holds_the_lock(admin: AdminApp, database_url: str) -> None:
    registration = await admin.register("orders")
    sink_id = sink_id_of(database_url, "orders")
    await admin.pre_commit("orders", registration, 0, 0)
    async with commit_lock_held(database_url, sink_id) as lock:
        await admin.checkpoint("orders", registration, 0, wait=False)
        forced = asyncio.create_task(
            admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad", "force": True})
        )
        await wait_for_commit_lock_waiter(lock, sink_id)
        # What a committer holding the lock does at the end of its commit.
        await lock.execute(
            "UPDATE pending_sink_state SET status = 'COMMITTED' WHERE sink_id = %s AND epoch = 0", (sink_id,)
        )
    response = await forced
    assert response.status_code == 409
    assert "is COMMITTED" in error_of(response)["message"]


async def test_forced_abort_marks_committed_an_epoch_already_in_the_table(admin: AdminApp, database_url: str) -> None:
    registration = await admin.register("orders")
    sink_id = sink_id_of(database_url, "orders")
    await admin.pre_commit("orders", registration, 0, 0)
    async with commit_lock_held(database_url, sink_id) as lock:
        await admin.checkpoint("orders", registration, 0, wait=False)
        # A committer that appended epoch 0 and died before its COMMITTED update.
        entries = epoch_metadata(database_url, 0).data_files
        snapshot_id = await asyncio.to_thread(
            admin.runtime.iceberg.append, "db.orders", await sink_identity(admin, "orders"), 0, "crashed", entries
        )
        forced = asyncio.create_task(
            admin.post("/api/v1/sinks/orders/epochs/0/abort", json={"reason": "bad", "force": True})
        )
        await wait_for_commit_lock_waiter(lock, sink_id)
    response = await forced
    assert response.status_code == 409
    assert "already in the table" in error_of(response)["message"]
    epoch = await epoch_state(admin, "orders", 0)
    assert (epoch["status"], epoch["snapshot_id"]) == ("COMMITTED", snapshot_id)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_commits_aborts_and_pending_epochs(admin: AdminApp) -> None:
    sink = "metered"  # the registry is the process's: a sink name of its own keeps the counts this test's
    registration = await admin.register(sink)
    await admin.pre_commit(sink, registration, 0, 0)
    await admin.checkpoint(sink, registration, 0)
    await admin.pre_commit(sink, registration, 1, 10)
    await admin.pre_commit(sink, registration, 2, 20)
    await admin.post(f"/api/v1/sinks/{sink}/epochs/2/abort", json={"reason": "metrics", "force": True})

    response = await admin.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = scrape(response.text)
    label = (("sink", sink),)
    assert samples["sink_coordinator_pending_epochs", label] == 1
    assert samples["sink_coordinator_aborted_epochs_in_log", label] == 1
    assert samples["sink_coordinator_oldest_pending_epoch_age_seconds", label] > 0
    assert samples["sink_coordinator_committer_retrying", label] == 0
    assert samples["sink_coordinator_commits_total", label] == 1
    assert samples["sink_coordinator_committed_epochs_total", label] == 1
    assert samples["sink_coordinator_commit_seconds_count", label] == 1
    assert samples["sink_coordinator_precommit_seconds_count", label] == 3
    assert samples["sink_coordinator_aborted_epochs_total", (("cause", "operator"), ("sink", sink))] == 1
    assert samples["sink_coordinator_metastore_up", ()] == 1

    async def cleaned_files_counted() -> bool:
        return scrape((await admin.get("/metrics")).text).get(("sink_coordinator_cleaned_files_total", label)) == 1

    await eventually(cleaned_files_counted, "the aborted epoch's file counted as cleaned")


async def test_a_failing_committer_shows_as_retrying(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase
) -> None:
    """The catalog's PostgreSQL down: the committer retries, and says it is the catalog. A SQL catalog's errors are
    SQLAlchemy's too: raised inside the pass's metastore connection (the commit lock's), they were taken for the
    metastore's ('the PostgreSQL metastore is unreachable', cause metastore)."""
    admin = await admin_factory(catalog=catalog_database.properties)
    sink = "outage"
    registration = await admin.register(sink)
    await admin.pre_commit(sink, registration, 0, 0)
    catalog_database.go_down()  # every commit of the sink fails until it comes back
    await admin.checkpoint(sink, registration, 0, wait=False)

    async def retrying() -> bool:
        committer = (await admin.get(f"/api/v1/sinks/{sink}")).json()["committer"]
        return bool(committer["state"] == "retrying" and committer["failed_attempts"] >= 2)

    await eventually(retrying, "the committer reported as retrying")
    committer = (await admin.get(f"/api/v1/sinks/{sink}")).json()["committer"]
    assert committer["last_error"].startswith("CatalogUnavailable: the Iceberg catalog or its storage failed")
    assert committer["last_error_at"] is not None
    samples = scrape((await admin.get("/metrics")).text)
    assert samples["sink_coordinator_committer_retrying", (("sink", sink),)] == 1
    assert samples["sink_coordinator_commit_retries_total", (("cause", "catalog"), ("sink", sink))] >= 2
    assert (await epoch_state(admin, sink, 0))["status"] == "PENDING"


async def test_an_epoch_not_in_the_log_is_said_to_be_pruned_only_when_it_could_be(
    admin_factory: AdminFactory,
) -> None:
    """Issue 26.12: GET .../epochs/99999 said 'committed and pruned', far above the committed epoch."""
    admin = await admin_factory(retention_epochs=0)
    registration = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
    await admin.checkpoint("orders", registration, 1)

    above = await admin.get("/api/v1/sinks/orders/epochs/99999")
    assert above.status_code == 404
    message = above.json()["error"]["message"]
    assert "pruned" not in message
    assert message == "sink orders has no epoch 99999: it was never pre-committed (its newest epoch is 2)"
    pruned = await admin.get("/api/v1/sinks/orders/epochs/0")
    assert pruned.status_code == 404
    assert pruned.json()["error"]["message"] == (
        "sink orders has no epoch 0 in its log: it was committed and pruned (committed epoch 1), or never pre-committed"
    )
