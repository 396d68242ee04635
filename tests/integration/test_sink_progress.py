"""What a sink's row says about its writer and its progress, on every replica (issue 26.5): the writer's term and
last call, a stalled state when an epoch waits too long, the last commit as the log has it, and the other sinks
writing one of its tables (issue 26.4)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pyarrow as pa

from tests.fixtures.admin import AdminApp, AdminFactory
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet
from tests.fixtures.postgres import query


async def sink_of(admin: AdminApp, name: str) -> dict[str, Any]:
    response = await admin.get(f"/api/v1/sinks/{name}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_the_last_commit_is_the_logs_whichever_process_made_it(admin_factory: AdminFactory) -> None:
    """It showed a dash on every replica but the one that committed, and after a restart."""
    first = await admin_factory()
    registration = await first.register("orders")
    await first.pre_commit("orders", registration, 0, 0)
    await first.checkpoint("orders", registration, 0)
    committed_at = (await sink_of(first, "orders"))["last_commit_at"]
    assert committed_at is not None

    other = await admin_factory()  # another replica, or this one restarted: its committer never ran the sink
    sink = await sink_of(other, "orders")
    assert sink["committer"]["state"] == "idle"
    assert sink["last_commit_at"] == committed_at


async def test_a_sink_whose_oldest_epoch_waits_too_long_is_stalled(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(stalled_after_seconds=120, metrics_cache_seconds=0)
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    await admin.pre_commit("orders", registration, 1, 10)  # its checkpoint never comes: the writer died
    assert (await sink_of(admin, "orders"))["stalled"] is None

    query(database_url, "UPDATE pending_sink_state SET updated_at = now() - interval '150 seconds' WHERE epoch = 1")
    sink = await sink_of(admin, "orders")
    assert re.match(r"epoch 1 was pre-committed 15\d s ago and its checkpoint has not come", sink["stalled"])
    assert sink["committer"]["state"] == "healthy"  # the committer has nothing to do: the writer is the matter
    scrape = (await admin.get("/metrics")).text
    assert 'sink_coordinator_sink_stalled{sink="orders"} 1.0' in scrape

    await admin.checkpoint("orders", registration, 1)
    assert (await sink_of(admin, "orders"))["stalled"] is None
    assert 'sink_coordinator_sink_stalled{sink="orders"} 0.0' in (await admin.get("/metrics")).text


async def test_the_sinks_writing_one_table_each_name_the_others(admin: AdminApp) -> None:
    await admin.register("orders")
    narrower = pa.schema([pa.field("order_id", pa.int64(), nullable=False)]).serialize().to_pybytes()
    await admin.runtime.coordinator.register_writer("orders-replay", "db.orders", -1, arrow_schema=narrower)
    await admin.register("payments", table="db.payments")

    listed = {sink["sink"]: sink for sink in (await admin.get("/api/v1/sinks")).json()["sinks"]}
    assert listed["orders"]["tables"][0]["also_written_by"] == ["orders-replay"]
    assert listed["orders-replay"]["tables"][0]["also_written_by"] == ["orders"]
    assert listed["payments"]["tables"][0]["also_written_by"] == []


def test_the_writers_last_call_and_term_show_on_every_replica(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """The writer's calls reach one replica; what they say of it is the log's (metastore), read by any other."""
    one, other = coordinator_factory(), coordinator_factory()
    before = httpx.get(f"{other.http_url}/api/v1/sinks", timeout=10).json()["sinks"]
    assert before == []
    with one.client() as client:
        writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])

    def sink() -> dict[str, Any]:
        response = httpx.get(f"{other.http_url}/api/v1/sinks/orders", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    seen = wait_for(sink, lambda s: s["writer_last_call_at"] is not None)
    assert seen["writer_term"] == 1
    assert 0 <= seen["writer_last_call_age_seconds"] < 60


def wait_for(
    read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], seconds: float = 15.0
) -> dict[str, Any]:
    """Read until `done` holds of what was read (the replica records a writer's calls in the background)."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {value}")
        time.sleep(0.05)
