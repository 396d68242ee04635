"""The databases: the metastore's PostgreSQL restarted, the catalog's stopped, the commit lock's connection killed.

The servers are the session's (tests/torture/session.py), restarted with
pg_ctl (fast or immediate: the latter is a crash, with recovery at the next
start). The commit lock is an advisory lock held by the committer's connection:
terminating that backend is the lock lost mid-commit.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import psycopg

from coordinator_service.log.database import libpq_url
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.infra import wait_for_change

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def postgres_restart(run: Run, record: FaultRecord) -> None:
    params = record.plan.params
    begin(record)
    run.board.set("up", False)
    run.session.metastore.stop(params["mode"])
    time.sleep(params["downtime_seconds"])  # how long PostgreSQL stays down
    run.session.metastore.start()
    record.ended_at = time.time()
    run.board.set("up")


def catalog_outage(run: Run, record: FaultRecord) -> None:
    begin(record)
    run.board.set("up", False)
    run.session.catalog.stop("fast")
    time.sleep(record.plan.params["downtime_seconds"])  # how long the catalog is unavailable
    run.session.catalog.start()
    record.ended_at = time.time()
    run.board.set("up")


def lock_kill(run: Run, record: FaultRecord) -> None:
    """Terminate the connection holding a commit lock (when one is held; awaited on the metastore's events)."""
    killed: list[int] = []

    def holder(connection: psycopg.Connection[Any]) -> int | None:
        row = connection.execute(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() LIMIT 1"
        ).fetchone()
        return None if row is None else int(row[0])

    for _ in range(int(record.plan.params["attempts"])):
        try:
            pid = wait_for_change(run.metastore_url, holder, 20)
        except TimeoutError:
            break
        with psycopg.connect(libpq_url(run.metastore_url), autocommit=True) as connection:
            row = connection.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
        if row is not None and row[0]:
            if not killed:
                begin(record)
            killed.append(pid)
    if not killed:
        record.detail["skipped"] = "no commit lock held in 20 s"
        return
    record.detail["terminated"] = len(killed)
    record.ended_at = time.time()


def plan_restart(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"mode": rng.choice(("fast", "immediate")), "downtime_seconds": round(rng.uniform(0, 3), 3)}


def plan_outage(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"downtime_seconds": round(rng.uniform(2.0, 8.0), 3)}


def plan_lock_kill(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"attempts": rng.randint(1, 3)}


KINDS = (
    FaultKind("postgres_restart", Trigger.AT_BATCH, postgres_restart, plan=plan_restart),
    FaultKind("catalog_outage", Trigger.AT_BATCH, catalog_outage, plan=plan_outage),
    FaultKind("lock_kill", Trigger.AT_BATCH, lock_kill, plan=plan_lock_kill),
)
