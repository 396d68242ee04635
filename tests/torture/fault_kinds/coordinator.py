"""The coordinator's process: killed, killed by its own failpoint, stalled, doubled, or down as the stream goes idle.

Each restart starts a successor on the same ports (the writers and the proxy
keep their addresses) unless another fault replaced the process first. "up" is
lowered for as long as the coordinator is down, so that the supervisor starts
the job again only once it is back.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from coordinator_service.log.database import libpq_url
from tests.torture import idle
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.infra import wait_for_change
from tests.torture.session import RUN_SECONDS, SINK

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def coordinator_kill(run: Run, record: FaultRecord) -> None:
    victim = run.coordinators[int(record.plan.params.get("which", 0)) % len(run.coordinators)]
    begin(record)
    run.board.set("up", False)
    victim.kill()
    run.restart_if_current(victim, record.plan.params["downtime_seconds"])
    record.ended_at = time.time()
    run.board.set("up")


def failpoint(run: Run, record: FaultRecord) -> None:
    """The coordinator started with the plan's failpoint armed (kill@hit): await its death, then restart it.

    Shared by every kind that arms one (coordinator_failpoint, maintenance_kill, fan_out); only the fault
    whose failpoint the coordinator logged restarts it.
    """
    process = run.coordinators[0]
    assert process.process is not None
    died = threading.Event()

    def await_exit() -> None:
        assert process.process is not None
        process.process.wait()
        died.set()
        run.board.set("coordinator-died")

    threading.Thread(target=await_exit, daemon=True).start()
    run.board.wait(lambda: run.board.has("coordinator-died"), RUN_SECONDS)
    if not died.is_set():
        return  # the job finished before the failpoint's hit: the coordinator stays up
    with run.lock:
        if process.process.returncode != -signal.SIGKILL or process not in run.coordinators:
            return
        try:
            hit = process.wait_for_log("failpoint hit", 10).get("failpoint")
        except TimeoutError:
            hit = None
        if hit is not None and hit != record.plan.params["failpoint"]:
            return  # the run's other armed failpoint killed it: that fault restarts it
        begin(record)
        record.detail["failpoint_logged"] = hit is not None
        run.board.set("up", False)
        run.restart_if_current(process, record.plan.params["downtime_seconds"])
        record.ended_at = time.time()
        run.board.set("up")


def coordinator_stall(run: Run, record: FaultRecord) -> None:
    victim = run.coordinators[0]
    assert victim.process is not None
    begin(record)
    run.board.set("up", False)
    os.kill(victim.process.pid, signal.SIGSTOP)
    try:
        time.sleep(record.plan.params["stall_seconds"])  # the stall's random length
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)
    record.ended_at = time.time()
    run.board.set("up")


def split_brain(run: Run, record: FaultRecord) -> None:
    params = record.plan.params
    first = run.coordinators[0]
    begin(record)
    second = run.start_coordinator(run.new_coordinator())
    run.coordinators.append(second)
    run.proxy.set_endpoints([first.grpc_port, second.grpc_port], reset=True)
    time.sleep(params["seconds"])  # both serve this long
    victim, survivor = (second, first) if params["survivor"] == "first" else (first, second)
    run.proxy.set_endpoints([survivor.grpc_port])
    if params["end_by"] == "kill":
        victim.kill()
    else:
        victim.stop()
    run.proxy.reset()
    run.coordinators.remove(victim)
    record.ended_at = time.time()


def keep_query_up(run: Run, record: FaultRecord) -> None:
    run.idle = True  # the query stays up after the drain: a report that failed must land by itself


def outage_then_idle(run: Run, record: FaultRecord) -> None:
    """Kill the coordinator as the last batch is pre-committed; restart it after the writer's retries."""
    try:
        epoch = wait_for_change(run.metastore_url, lambda c: idle.at_last_batch(run, c), RUN_SECONDS)
    except TimeoutError:
        return
    with run.lock:
        if run.board.has("done"):
            return
        victim = run.coordinators[0]
        with psycopg.connect(libpq_url(run.metastore_url), autocommit=True) as connection:
            row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
        begin(record)
        run.board.set("up", False)
        victim.kill()
        record.detail.update(epoch=epoch, report_pending=row is not None and int(row[0]) < epoch)
        run.restart_if_current(victim, record.plan.params["downtime_seconds"])
        record.ended_at = time.time()
        run.board.set("up")


FAILPOINTS: tuple[tuple[str, int], ...] = (
    # (name, most hits before it fires); each is hit once per batch, commit pass or registration
    ("register.before_recovery", 1),
    ("register.after_recovery", 1),
    ("precommit.before_persist", 4),
    ("precommit.after_persist", 4),
    ("checkpoint.after_record", 4),
    ("commit.after_lock", 4),
    ("commit.before_append", 4),
    ("commit.after_append", 4),
    ("commit.after_mark", 4),
)


def plan_kill(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"downtime_seconds": round(rng.uniform(0.0, 2.0), 3)}


def plan_failpoint(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    point, most = rng.choice(FAILPOINTS)
    return {"failpoint": point, "hit": rng.randint(1, most), "downtime_seconds": round(rng.uniform(0, 1), 3)}


def plan_stall(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"stall_seconds": round(shape.call_deadline + rng.uniform(1.0, 4.0), 3)}


def plan_split_brain(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {
        "seconds": round(rng.uniform(2.0, 8.0), 3),
        "survivor": rng.choice(("first", "second")),
        "end_by": rng.choice(("kill", "stop")),
    }


def plan_outage_then_idle(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    # Beyond the call deadline only, or beyond the writer's whole retry window too.
    return {"downtime_seconds": round(shape.call_deadline + rng.choice((rng.uniform(1, 5), rng.uniform(21, 26))), 3)}


KINDS = (
    FaultKind("coordinator_kill", Trigger.AT_BATCH, coordinator_kill, plan=plan_kill),
    FaultKind("coordinator_failpoint", Trigger.OWN_MOMENT, failpoint, plan=plan_failpoint),
    FaultKind("coordinator_stall", Trigger.AT_BATCH, coordinator_stall, plan=plan_stall),
    FaultKind("split_brain", Trigger.AT_BATCH, split_brain, plan=plan_split_brain),
    FaultKind(
        "outage_then_idle", Trigger.OWN_MOMENT, outage_then_idle, configure=keep_query_up, plan=plan_outage_then_idle
    ),
)
