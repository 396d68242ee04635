"""The fault kinds, one module per family, and the dispatcher that injects each at its moment.

- coordinator: the coordinator's process killed, killed by a failpoint,
  stalled, doubled (split brain), or down as the stream goes idle
- maintenance: table maintenance killed inside one of its steps
- spark: the driver killed (at a random moment or a kill point), an executor
  killed, a zombie writer with the old term
- databases: the metastore's PostgreSQL restarted, the catalog's stopped, the
  commit lock's connection terminated
- operators: an abort of a PENDING epoch, a reset after a lost checkpoint
- protocol_writers: more sinks through the protocol (many, a re-sent aborted
  epoch, fan-out)
- kafka_topic, kafka_records: the broker restarted, a producer under load at
  `latest`, the topic recreated; retention before a re-run, bad records

A new fault kind is one module (or one more function in its family's) with a
`KINDS` tuple of FaultKind (tests/torture/fault_kinds/kind.py: its function,
its trigger, its hooks, its parameters' draw, the kinds it excludes), and its
registration here: its module in KINDS, its name at the end of FAULTS.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tests.torture.fault_kinds import (
    coordinator,
    databases,
    kafka_records,
    kafka_topic,
    maintenance,
    operators,
    protocol_writers,
    spark,
)
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger
from tests.torture.faults import FaultPlan
from tests.torture.session import RUN_SECONDS

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run

# Every fault kind, in the order the run draws from (a seeded run's draws depend on it: a new kind goes at the end).
FAULTS: tuple[str, ...] = (
    "coordinator_kill",  # kill -9 of a serving coordinator, restarted on the same ports
    "coordinator_failpoint",  # the coordinator kills itself exactly between two steps (name=kill@N)
    "coordinator_stall",  # SIGSTOP longer than the writer's call deadline, then SIGCONT
    "split_brain",  # a second coordinator on the same database; the writer's connections go to either
    "driver_kill",  # kill -9 of the Spark driver's process group (driver, JVM, Python workers)
    "driver_killpoint",  # the driver killed right after PreCommit(N) or right before CommitCheckpoint(N)
    "executor_kill",  # kill -9 of one Python worker of the driver's JVM
    "postgres_restart",  # the metastore's PostgreSQL: pg_ctl stop -m fast|immediate, then start
    "catalog_outage",  # the catalog's PostgreSQL stopped for a while
    "zombie_writer",  # after a driver restart, a late PreCommit/CommitCheckpoint with the old term
    "operator_abort",  # an operator aborts the newest PENDING epoch through the admin API, with force or without
    "operator_reset",  # the Spark checkpoint is lost: the writer stopped, the sink reset, a new query from the
    #                    last committed epoch's offsets (docs/operations.md's procedure)
    "lock_kill",  # pg_terminate_backend of the connection that holds a sink's commit lock (advisory lock)
    "many_sinks",  # 4-7 more sinks written through the protocol; commit interval above 0, concurrency below sinks
    "resend_aborted",  # a writer re-sends an epoch an operator aborted, naming the same files
    "outage_then_idle",  # the coordinator down longer than the writer's retries as the last batch is
    #                      pre-committed; the query stays up, idle: its failed report must land by itself
    "maintenance_kill",  # table maintenance every 0.5-2 s; the coordinator kills itself inside one of its steps
    "broker_restart",  # the Kafka broker stopped and started again on its port with its data, mid-read
    "retention_before_rerun",  # the driver killed after PreCommit(N); records of batch N deleted before the re-run
    "bad_records",  # records that do not fit the schema in the topic; the job's policy fail, null or dead-letter
    "latest_under_load",  # startingOffsets=latest while a producer writes; the query stays up until all is read
    "topic_recreated",  # the topic deleted mid-stream: the data-loss error, then (failOnDataLoss=false) a batch
    #                     without it; the topic created again (1-4 partitions) and read from its start
    "fan_out",  # 1-3 more sinks, each writing 3-5 tables through the protocol (one table added mid-stream);
    #             in most runs the coordinator kills itself between two tables' appends of one epoch
)

KINDS: tuple[FaultKind, ...] = tuple(
    sorted(
        (
            *coordinator.KINDS,
            *maintenance.KINDS,
            *spark.KINDS,
            *databases.KINDS,
            *operators.KINDS,
            *protocol_writers.KINDS,
            *kafka_topic.KINDS,
            *kafka_records.KINDS,
        ),
        key=lambda kind: FAULTS.index(kind.name),
    )
)
REGISTRY: dict[str, FaultKind] = {kind.name: kind for kind in KINDS}


def drawn(records_of: dict[str, FaultRecord]) -> Iterator[tuple[FaultKind, FaultRecord]]:
    """The run's faults with their kinds, in FAULTS order (the order their hooks are called in)."""
    for name in FAULTS:
        if name in records_of:
            yield REGISTRY[name], records_of[name]


def inject(run: Run, record: FaultRecord) -> None:
    """A fault's thread: await its trigger, act, and report a failure of the harness as an anomaly."""
    plan = record.plan
    kind = REGISTRY[plan.name]
    assert kind.act is not None, f"{plan.name} has no thread: the supervisor or the run's shape is the fault"
    try:
        if kind.trigger is Trigger.AT_BATCH:
            if not run.board.wait(lambda: run.board.precommits >= plan.trigger_batch, RUN_SECONDS):
                return
            if run.board.wait(lambda: False, plan.delay_seconds):  # the random moment after the trigger
                return
            if kind.locked:
                with run.lock:
                    if run.board.has("done"):
                        return
                    kind.act(run, record)
                return
        kind.act(run, record)
    except Exception as error:
        run.anomalies.append(f"fault {plan.name} failed: {type(error).__name__}: {error}")
        run.notes.append(traceback.format_exc()[-3000:])
        run.board.set("up")


__all__ = ["KINDS", "REGISTRY", "FaultKind", "Trigger", "drawn", "inject"]


def plan_faults(
    rng: random.Random,
    pool: tuple[str, ...],
    batches: int,
    call_deadline: float,
    exactly: int | None = None,
    keyed: bool = False,
) -> list[FaultPlan]:
    """One fault (two in about a third of the runs; `exactly` N if given), each with its trigger and the parameters
    its kind draws (for a `keyed` stream's run: tests/torture/upserts.py)."""
    count = 2 if rng.random() < 0.35 and len(pool) > 1 else 1
    count = min(exactly, len(pool)) if exactly is not None else count
    names = rng.sample(pool, count)
    for kind in KINDS:
        if kind.name in names:
            names = [name for name in names if name not in kind.excludes]
    shape = RunShape(batches, call_deadline, keyed)
    plans = []
    for name in names:
        plan = REGISTRY[name].plan
        plans.append(
            FaultPlan(
                name=name,
                params={} if plan is None else plan(rng, shape),
                trigger_batch=rng.randint(1, max(1, batches // 2)),
                delay_seconds=round(rng.uniform(0.0, 1.5), 3),
            )
        )
    return plans
