"""More sinks beside the Spark job, written through the protocol: many sinks, an aborted epoch re-sent, fan-out.

These kinds shape the run rather than strike at a moment: their writers
(tests/torture/writers.py) start with the job, through the same proxy, so that
every other fault hits them too, and each is checked like the Spark sink. Drawn
together, many_sinks and resend_aborted make one group of writers whose first
re-sends the aborted epoch. fan_out's coordinator may kill itself between two
tables' appends of one epoch (commit.between_tables).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from tests.torture.fault_kinds.coordinator import failpoint
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger
from tests.torture.writers import ProtocolWriter, plan_fan_out_writers, plan_writers

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def first_key(run: Run) -> int:
    """The first key of the writers' records, apart from the Spark sink's."""
    return (run.seed % 1000 + 1000) * 1_000_000


def configure_many(run: Run, record: FaultRecord) -> None:
    run.coordinator_env.update(
        SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS=str(record.plan.params["commit_interval_seconds"]),
        SINK_COORDINATOR_COMMIT_CONCURRENCY=str(record.plan.params["commit_concurrency"]),
    )


def plan_group(run: Run, record: FaultRecord) -> list[ProtocolWriter]:
    """many_sinks' writers, or resend_aborted's one; drawn together, one group (many_sinks' seed and count)."""
    many, resend = run.records_of.get("many_sinks"), run.records_of.get("resend_aborted")
    shaping = many or resend
    if record is not shaping:
        return []  # the other kind of the pair planned the group
    count = int(many.plan.params["writers"]) if many is not None else 1
    operator = run.operator if resend is not None else None
    rng = random.Random(record.plan.params["writers_seed"])
    writers = plan_writers(rng, count, run.proxy.target, first_key(run), operator, run.metastore_url)
    if many is not None:
        many.triggered = True
        many.detail["sinks"] = count + 1
    return writers


def resent(run: Run, record: FaultRecord) -> None:
    """What the re-sending writer (the group's first) did: the abort's answer, the re-sent epoch's."""
    record.detail.update(run.writers[0].resend)
    record.triggered = run.writers[0].resend.get("abort_status") == 200


def plan_fan_out(run: Run, record: FaultRecord) -> list[ProtocolWriter]:
    params = record.plan.params
    writers = plan_fan_out_writers(
        random.Random(params["writers_seed"]),
        int(params["writers"]),
        int(params["routes"]),
        run.proxy.target,
        first_key(run) + 50_000_000,
    )
    record.triggered = record.triggered or not params["failpoint"]
    record.detail["tables"] = {writer.name: len(writer.routes) + 1 for writer in writers}
    return list(writers)


def fan_out_kill(run: Run, record: FaultRecord) -> None:
    if record.plan.params["failpoint"]:
        failpoint(run, record)


def plan_many(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {
        "writers": rng.randint(4, 7),
        "commit_interval_seconds": round(rng.uniform(0.2, 1.5), 3),
        "commit_concurrency": rng.randint(1, 3),
        "writers_seed": rng.randrange(2**31),
    }


def plan_resend(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"writers_seed": rng.randrange(2**31)}


def plan_fan_out_kill(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {
        "writers": rng.randint(1, 3),
        "routes": rng.randint(2, 4),
        "writers_seed": rng.randrange(2**31),
        # commit.between_tables=kill@hit (None: no kill); hit once per table after the first of a pass
        "failpoint": "commit.between_tables" if rng.random() < 0.7 else None,
        "hit": rng.randint(1, 8),
        "downtime_seconds": round(rng.uniform(0, 1), 3),
    }


KINDS = (
    FaultKind("many_sinks", Trigger.SUPERVISOR, configure=configure_many, plan_writers=plan_group, plan=plan_many),
    FaultKind("resend_aborted", Trigger.SUPERVISOR, plan_writers=plan_group, after_drive=resent, plan=plan_resend),
    FaultKind("fan_out", Trigger.OWN_MOMENT, fan_out_kill, plan_writers=plan_fan_out, plan=plan_fan_out_kill),
)
