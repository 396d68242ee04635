"""The Spark side: the driver killed (at a random moment or at a kill point), an executor killed, a zombie writer.

A killed driver takes its process group (driver, JVM, Python workers); the
supervisor starts the job again on the standby driver, from its checkpoint. A
kill point is the job's own: the driver dies right after PreCommit(N) or right
before CommitCheckpoint(N), in the job's first start. The zombie writer is the
old driver coming back: a late PreCommit and CommitCheckpoint with its old
term, which the coordinator must refuse (FAILED_PRECONDITION).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import psycopg

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.log.database import libpq_url
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.session import RUN_SECONDS, SINK, TABLE

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def driver_kill(run: Run, record: FaultRecord) -> None:
    driver = run.driver
    if driver is None or not driver.alive:
        return
    begin(record)
    driver.kill()
    record.ended_at = time.time()


def killpoint_first_job(run: Run, record: FaultRecord) -> int | None:
    """The job's first start with the plan's kill point; the supervisor starts it again after the kill."""
    if "retention_before_rerun" in run.records_of:
        return None  # drawn together, retention's kill point takes the first start (as it always has)
    code = run.run_job(record.plan.params["kill_point"], record.plan.params["epoch"])
    record.triggered = code == -signal.SIGKILL
    record.started_at = record.ended_at = time.time()
    run.board.set("killpoint-fired")
    return code


def await_killpoint(run: Run, record: FaultRecord) -> None:
    """The fault's thread lasts until the supervisor's first start met its kill point (or ended without it)."""
    run.board.wait(lambda: run.board.has("killpoint-fired"), RUN_SECONDS, unless=None)


def executor_kill(run: Run, record: FaultRecord) -> None:
    driver = run.driver
    workers = driver.python_workers() if driver is not None else []
    if not workers:
        record.detail["skipped"] = "no Python worker running at that moment"
        return
    victim = workers[int(record.plan.params["pick"] * len(workers))]
    begin(record)
    record.detail["worker"] = " ".join(victim.cmdline()[-3:])
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim.pid, signal.SIGKILL)
    record.ended_at = time.time()


def zombie_writer(run: Run, record: FaultRecord) -> None:
    driver = run.driver
    if driver is None or not driver.alive or not run.board.terms:
        return
    old_term = run.board.terms[-1]
    begin(record)
    driver.kill()  # the supervisor starts a new driver, which registers with a newer term
    run.lock.release()  # let other faults act while the new driver starts (the supervisor needs no lock)
    try:
        registered = run.board.wait(lambda: bool(run.board.terms) and run.board.terms[-1] > old_term, 120)
    finally:
        run.lock.acquire()
    if not registered:
        record.detail["skipped"] = "no new registration"
        return
    location = run.open_catalog().load_table(TABLE).location().removeprefix("file://")
    candidates = sorted(Path(location, "data").rglob("*.parquet"))
    if not candidates:
        record.detail["skipped"] = "no data file to imitate"
        return
    source = candidates[int(record.plan.params["pick"] * len(candidates))]
    zombie = source.with_name(f"zombie-{uuid.uuid4().hex}.parquet")
    shutil.copyfile(source, zombie)
    run.zombie_paths.add(zombie.as_uri())
    with psycopg.connect(libpq_url(run.metastore_url), autocommit=True) as connection:
        row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
    epoch = int(row[0]) + 1 if row else 0
    codes: dict[str, str] = {}
    with CoordinatorClient(run.proxy.target, timeout_seconds=10, retry_seconds=30) as client:
        for call, invoke in (
            ("pre_commit", lambda: client.pre_commit(SINK, epoch, old_term, [zombie.as_uri()])),
            ("commit_checkpoint", lambda: client.commit_checkpoint(SINK, epoch, old_term)),
        ):
            try:
                invoke()
                codes[call] = "OK"
            except CoordinatorRpcError as error:
                codes[call] = error.code.name
                record.detail[f"{call}_message"] = error.message[:200]
    record.detail.update(old_term=old_term, epoch=epoch, codes=codes)
    for call, code in codes.items():
        if code != grpc.StatusCode.FAILED_PRECONDITION.name:
            run.anomalies.append(f"zombie writer (term {old_term}) {call}({epoch}) answered {code}")
    record.ended_at = time.time()


DRIVER_KILL_POINTS = ("after-precommit", "before-checkpoint-report")


def plan_killpoint(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"kill_point": rng.choice(DRIVER_KILL_POINTS), "epoch": rng.randint(0, max(0, shape.batches - 2))}


def plan_pick(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"pick": rng.random()}


KINDS = (
    FaultKind("driver_kill", Trigger.AT_BATCH, driver_kill),
    FaultKind(
        "driver_killpoint", Trigger.OWN_MOMENT, await_killpoint, first_job=killpoint_first_job, plan=plan_killpoint
    ),
    FaultKind("executor_kill", Trigger.AT_BATCH, executor_kill, plan=plan_pick),
    FaultKind("zombie_writer", Trigger.AT_BATCH, zombie_writer, plan=plan_pick),
)
