"""The faults a torture run injects, each planned from the run's seed before anything starts.

A plan fixes everything random about a fault (its trigger: the k-th batch
pre-committed by the run's drivers, then a delay; its parameters: how long a
server stays down, which failpoint, which process). The moment it lands in the
system's own timeline varies, which is the point; the seed replays the plan.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

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

# Faults whose checks assume one life of the topic, or the failOnDataLoss remedy of their own: a run that
# draws topic_recreated drops them.
EXCLUDED_BY: dict[str, frozenset[str]] = {
    "topic_recreated": frozenset(
        {
            "operator_abort",
            "operator_reset",
            "retention_before_rerun",
            "bad_records",
            "latest_under_load",
            "broker_restart",
            "outage_then_idle",
        }
    )
}

MAINTENANCE_FAILPOINTS: tuple[tuple[str, int], ...] = (
    ("maintenance.after_expire", 2),
    ("maintenance.before_compaction_commit", 2),
    ("maintenance.after_compaction_commit", 2),
    ("maintenance.during_sweep", 1),  # only once orphans are older than the grace: killed tasks, compactions
)

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

DRIVER_KILL_POINTS = ("after-precommit", "before-checkpoint-report")


@dataclass
class FaultPlan:
    name: str
    trigger_batch: int  # fires once the run's drivers pre-committed this many batches ...
    delay_seconds: float  # ... and this long after
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class FaultRecord:
    plan: FaultPlan
    triggered: bool = False
    started_at: float | None = None  # wall clock (time.time(), comparable with PostgreSQL's clock_timestamp())
    ended_at: float | None = None
    recovery_seconds: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "fault": self.plan.name,
            "plan": asdict(self.plan),
            "triggered": self.triggered,
            "duration_seconds": None
            if self.started_at is None or self.ended_at is None
            else round(self.ended_at - self.started_at, 3),
            "recovery_seconds": None if self.recovery_seconds is None else round(self.recovery_seconds, 3),
            **self.detail,
        }


def plan_faults(
    rng: random.Random, pool: tuple[str, ...], batches: int, call_deadline: float, exactly: int | None = None
) -> list[FaultPlan]:
    """One fault (two in about a third of the runs; `exactly` N if given), each with its trigger and parameters."""
    count = 2 if rng.random() < 0.35 and len(pool) > 1 else 1
    count = min(exactly, len(pool)) if exactly is not None else count
    names = rng.sample(pool, count)
    for name, excluded in EXCLUDED_BY.items():
        if name in names:
            names = [n for n in names if n not in excluded]
    plans = []
    for name in names:
        params: dict[str, Any] = {}
        if name == "coordinator_kill":
            params = {"downtime_seconds": round(rng.uniform(0.0, 2.0), 3)}
        elif name == "coordinator_failpoint":
            point, most = rng.choice(FAILPOINTS)
            params = {"failpoint": point, "hit": rng.randint(1, most), "downtime_seconds": round(rng.uniform(0, 1), 3)}
        elif name == "coordinator_stall":
            params = {"stall_seconds": round(call_deadline + rng.uniform(1.0, 4.0), 3)}
        elif name == "split_brain":
            params = {
                "seconds": round(rng.uniform(2.0, 8.0), 3),
                "survivor": rng.choice(("first", "second")),
                "end_by": rng.choice(("kill", "stop")),
                "proxy_seed": rng.randrange(2**31),
            }
        elif name == "driver_killpoint":
            params = {"kill_point": rng.choice(DRIVER_KILL_POINTS), "epoch": rng.randint(0, max(0, batches - 2))}
        elif name == "executor_kill":
            params = {"pick": rng.random()}
        elif name == "postgres_restart":
            params = {"mode": rng.choice(("fast", "immediate")), "downtime_seconds": round(rng.uniform(0, 3), 3)}
        elif name == "catalog_outage":
            params = {"downtime_seconds": round(rng.uniform(2.0, 8.0), 3)}
        elif name == "zombie_writer":
            params = {"pick": rng.random()}
        elif name == "operator_abort":
            params = {"force": rng.random() < 0.7}
        elif name == "lock_kill":
            params = {"attempts": rng.randint(1, 3)}
        elif name == "many_sinks":
            params = {
                "writers": rng.randint(4, 7),
                "commit_interval_seconds": round(rng.uniform(0.2, 1.5), 3),
                "commit_concurrency": rng.randint(1, 3),
                "writers_seed": rng.randrange(2**31),
            }
        elif name == "resend_aborted":
            params = {"writers_seed": rng.randrange(2**31)}
        elif name == "maintenance_kill":
            point, most = rng.choice(MAINTENANCE_FAILPOINTS)
            params = {
                "failpoint": point,
                "hit": rng.randint(1, most),
                "downtime_seconds": round(rng.uniform(0, 1), 3),
                "interval_seconds": round(rng.uniform(0.5, 2.0), 3),
                "snapshot_max_count": rng.randint(2, 4),
                "compaction_min_files": rng.randint(2, 4),
                # Short, so that the sweep finds the files of killed tasks and compactions; a pre-commit of
                # files older than this is refused (the batch runs again).
                "orphan_grace_seconds": round(rng.uniform(5, 15), 3),
            }
        elif name == "broker_restart":
            params = {"downtime_seconds": round(rng.uniform(0.5, 5.0), 3)}
        elif name == "retention_before_rerun":
            params = {"epoch": rng.randint(0, max(0, batches - 2)), "fraction": round(rng.uniform(0.1, 1.0), 3)}
        elif name == "bad_records":
            policy = rng.choice(("fail", "null", "dead-letter"))
            params = {
                "policy": policy,
                "then": rng.choice(("null", "dead-letter")) if policy == "fail" else policy,
                "count": rng.randint(3, 10),
                "seed": rng.randrange(2**31),
            }
        elif name == "latest_under_load":
            params = {
                "records": rng.randint(200, 800),
                "per_second": rng.choice((50, 200, 1000)),
                "delay_seconds": round(rng.uniform(0, 3), 3),
            }
        elif name == "topic_recreated":
            params = {"records": rng.randint(50, 300), "partitions": rng.randint(1, 4)}
        elif name == "fan_out":
            params = {
                "writers": rng.randint(1, 3),
                "routes": rng.randint(2, 4),
                "writers_seed": rng.randrange(2**31),
                # commit.between_tables=kill@hit (None: no kill); hit once per table after the first of a pass
                "failpoint": "commit.between_tables" if rng.random() < 0.7 else None,
                "hit": rng.randint(1, 8),
                "downtime_seconds": round(rng.uniform(0, 1), 3),
            }
        elif name == "outage_then_idle":
            # Beyond the call deadline only, or beyond the writer's whole retry window too.
            params = {
                "downtime_seconds": round(call_deadline + rng.choice((rng.uniform(1, 5), rng.uniform(21, 26))), 3)
            }
        plans.append(
            FaultPlan(
                name=name,
                trigger_batch=rng.randint(1, max(1, batches // 2)),
                delay_seconds=round(rng.uniform(0.0, 1.5), 3),
                params=params,
            )
        )
    return plans
