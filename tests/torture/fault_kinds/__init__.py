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
its trigger, its hooks), registered in KINDS below; its name goes in
tests/torture/faults.py's FAULTS, with its parameters in plan_faults.
"""

from __future__ import annotations

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
from tests.torture.fault_kinds.kind import FaultKind, Trigger
from tests.torture.faults import FAULTS
from tests.torture.session import RUN_SECONDS

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run

KINDS: tuple[FaultKind, ...] = (
    *coordinator.KINDS,
    *maintenance.KINDS,
    *spark.KINDS,
    *databases.KINDS,
    *operators.KINDS,
    *protocol_writers.KINDS,
    *kafka_topic.KINDS,
    *kafka_records.KINDS,
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
