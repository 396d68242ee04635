"""A commit that no retry can fix puts the sink in a visible `stuck` state instead of retrying forever."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from structlog.testing import capture_logs

from coordinator_service import runtime as runtime_module
from coordinator_service.failpoints import Failpoint
from tests.fixtures.admin import AdminApp, Gate, eventually
from tests.fixtures.postgres import query


async def committer_of(admin: AdminApp) -> dict[str, Any]:
    committer = (await admin.get("/api/v1/sinks/orders")).json()["committer"]
    assert isinstance(committer, dict)
    return committer


async def _checkpoint_an_undecodable_record(admin: AdminApp, database_url: str) -> object:
    """Sink orders' epoch 0 pre-committed, its log record made undecodable, and checkpointed: its commit cannot succeed
    by retrying. Returns the record as it was (writing it back is the fix)."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    [(record,)] = query(database_url, "SELECT metadata FROM pending_sink_state WHERE epoch = 0")
    query(database_url, "UPDATE pending_sink_state SET metadata = 'not json' WHERE epoch = 0")
    await admin.checkpoint("orders", registration, 0, wait=False)
    return record


async def test_an_undecodable_log_record_sticks_the_sink_until_an_operator_resumes_it(
    admin: AdminApp, database_url: str
) -> None:
    record = await _checkpoint_an_undecodable_record(admin, database_url)

    async def stuck() -> bool:
        return (await committer_of(admin))["state"] == "stuck"

    await eventually(stuck, "the sink stuck")
    committer = await committer_of(admin)
    assert "MetadataDecodeError" in committer["last_error"]
    assert committer["failed_attempts"] == 0  # not retried as if it were an outage
    metrics = (await admin.get("/metrics")).text
    assert 'sink_coordinator_committer_stuck{sink="orders"} 1.0' in metrics

    query(database_url, "UPDATE pending_sink_state SET metadata = %s WHERE epoch = 0", record)  # the fix
    resumed = await admin.post("/api/v1/sinks/orders/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["committer"]["state"] == "healthy"
    assert resumed.json()["committed_epoch"] == 0


async def test_a_table_dropped_under_the_sink_sticks_it(admin: AdminApp, catalog: Catalog) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    catalog.drop_table("db.orders")
    await admin.checkpoint("orders", registration, 0, wait=False)

    async def stuck() -> bool:
        return (await committer_of(admin))["state"] == "stuck"

    await eventually(stuck, "the sink stuck")
    assert "does not exist" in (await committer_of(admin))["last_error"]
    # Resuming without fixing the cause: stuck again, and it says so.
    resumed = await admin.post("/api/v1/sinks/orders/resume")
    assert resumed.json()["committer"]["state"] == "stuck"


async def test_the_committer_stops_while_a_pass_is_under_way(
    admin: AdminApp, gates: Callable[[Failpoint], Gate]
) -> None:
    """A shutdown cancels a pass in the middle: the cancellation ends the task, it is never retried."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    locked = gates(Failpoint.COMMIT_AFTER_LOCK)
    await admin.checkpoint("orders", registration, 0, wait=False)
    await locked.wait_reached()
    async with asyncio.timeout(15):
        await admin.runtime.committer.stop()


async def test_a_part_whose_clean_up_never_ends_does_not_hold_the_close(
    admin: AdminApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background task whose clean-up after the cancellation waits on something that never comes (CI's console
    tests saw the cleaner wait on a connection's lock at the runtime's close until the test's timeout): the close goes
    on without it once STOP_SECONDS have passed, says which part, and ends the wait by cancelling it again. On the old
    code the close waited forever (this test's own timeout)."""
    monkeypatch.setattr(runtime_module, "STOP_SECONDS", 0.5)
    await admin.runtime.cleaner.stop()
    cleaning_up = asyncio.Event()

    async def clean_up_that_waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaning_up.set()
            await asyncio.Event().wait()  # interrupted only by a second cancellation
            raise

    admin.runtime.cleaner._task = asyncio.create_task(clean_up_that_waits_forever())
    with capture_logs() as logs:
        async with asyncio.timeout(15):
            await admin.runtime.close()
    assert cleaning_up.is_set() and admin.runtime.cleaner._task.done()
    [stuck] = [line for line in logs if line["event"].startswith("a part of the background work did not stop")]
    assert stuck["part"] == "cleaner" and stuck["log_level"] == "error"


async def test_the_log_holds_the_stuck_state_and_a_resume_counted_there_resumes_the_committer(
    admin: AdminApp, database_url: str
) -> None:
    """A committer stuck here records why in the log (what every process and replica shows) and follows a resume
    counted in the log by another process or replica, as if the POST had reached it."""
    record = await _checkpoint_an_undecodable_record(admin, database_url)

    async def stuck_in_log() -> bool:
        [(reason,)] = query(database_url, "SELECT committer_stuck_reason FROM sinks WHERE name = 'orders'")
        return reason is not None and "MetadataDecodeError" in reason

    await eventually(stuck_in_log, "the stuck state in the log")
    query(database_url, "UPDATE pending_sink_state SET metadata = %s WHERE epoch = 0", record)  # the fix
    # Another process's resume: the count in the log, and the stuck state cleared there.
    query(
        database_url,
        "UPDATE sinks SET resumes = resumes + 1, committer_stuck_reason = NULL, committer_stuck_at = NULL "
        "WHERE name = 'orders'",
    )

    async def committed() -> bool:
        sink = (await admin.get("/api/v1/sinks/orders")).json()
        return sink["committed_epoch"] == 0 and sink["committer"]["state"] == "healthy"

    await eventually(committed, "the sink committed after a resume through another process")


async def test_a_sink_stuck_in_another_process_is_shown_stuck_here(admin: AdminApp, database_url: str) -> None:
    """The log says a committer elsewhere is stuck on the sink: this process's answer and its scrape say so too."""
    await admin.register("orders")
    query(
        database_url,
        "UPDATE sinks SET committer_stuck_reason = 'CommitFailed: elsewhere', committer_stuck_at = now() "
        "WHERE name = 'orders'",
    )
    committer = await committer_of(admin)
    assert (committer["state"], committer["last_error"]) == ("stuck", "CommitFailed: elsewhere")
    assert committer["last_error_at"] is not None
    assert 'sink_coordinator_committer_stuck{sink="orders"} 1.0' in (await admin.get("/metrics")).text
    resumed = await admin.post("/api/v1/sinks/orders/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["committer"]["state"] != "stuck"
    assert query(database_url, "SELECT resumes, committer_stuck_reason FROM sinks WHERE name = 'orders'") == [(1, None)]


async def test_a_commit_that_succeeds_clears_a_stuck_state_left_in_the_log(admin: AdminApp, database_url: str) -> None:
    """A committer stuck elsewhere (a process that stuck, then restarted) left its state in the log: a pass that
    commits here proves the cause gone, clears it and counts a resume, which the committers stuck elsewhere follow."""
    registration = await admin.register("orders")
    query(
        database_url,
        "UPDATE sinks SET committer_stuck_reason = 'CommitFailed: elsewhere', committer_stuck_at = now() "
        "WHERE name = 'orders'",
    )
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0, wait=True)

    async def cleared() -> bool:  # right after the COMMITTED record, which the wait returns at
        state = query(database_url, "SELECT resumes, committer_stuck_reason FROM sinks WHERE name = 'orders'")
        return state == [(1, None)]

    await eventually(cleared, "the stuck state cleared and a resume counted")
    assert (await committer_of(admin))["state"] == "healthy"
