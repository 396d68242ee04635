"""What a fault kind registers: the function that injects it, how it is triggered, and its hooks into a run.

A fault kind is a function taking the run and its FaultRecord (`act`), and a
trigger that says when the dispatcher calls it, from the fault's own thread:

- `AT_BATCH`: once the run's drivers pre-committed `plan.trigger_batch`
  batches, `plan.delay_seconds` later; under the run's lock (faults act one at
  a time, never on a half-started driver) unless `locked=False`, and not once
  the job drained the topic.
- `OWN_MOMENT`: at once; the function awaits its own moment (a failpoint's
  hit, the last batch's pre-commit, the first registration).
- `SUPERVISOR`: no thread; the fault is the run's shape (its writers, its
  records, its settings) or the supervisor's doing (a kill point in the job's
  first start), through the hooks below.

The hooks are called by the run at each stage of its life cycle, for the kinds
it drew, in FAULTS order: `configure` as the run is created (the coordinator's
settings, the job's options, a query that stays up idle), `prepare` once the
topic exists, `plan_writers` before the job starts, `first_job` for the job's
first start, `after_failure` when a job failed, `after_drive` once the job and
the writers ended, `before_check` and `check` once the system settled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from tests.fixtures.kafka_broker import ProducedRecord
    from tests.torture.checks import Findings
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run
    from tests.torture.writers import ProtocolWriter

    Act = Callable[[Run, FaultRecord], None]


@dataclass(frozen=True)
class RunShape:
    """What a fault's parameters may depend on: the run's batches, the writer's call deadline, and whether its
    stream is keyed (an upsert stream: tests/torture/upserts.py)."""

    batches: int
    call_deadline: float
    keyed: bool = False


class Trigger(Enum):
    AT_BATCH = "at a batch, then a delay"
    OWN_MOMENT = "awaits its own moment"
    SUPERVISOR = "the run's shape or the supervisor's"


@dataclass(frozen=True)
class FaultKind:
    name: str  # as in fault_kinds.FAULTS
    trigger: Trigger
    act: Act | None = None  # None only with Trigger.SUPERVISOR
    locked: bool = True  # AT_BATCH: under the run's lock (topic_recreated awaits the job's re-run: not)
    configure: Act | None = None
    # The topic just created: the records it produced, when the fault produces the run's orders itself.
    prepare: Callable[[Run, FaultRecord], list[ProducedRecord] | None] | None = None
    plan_writers: Callable[[Run, FaultRecord], list[ProtocolWriter]] | None = None
    # The job's first start: its exit code, or None to leave that start to another fault or the plain job.
    first_job: Callable[[Run, FaultRecord], int | None] | None = None
    # A failed job (exit code 1) with the error it logged: True when the fault caused it and applied its remedy.
    after_failure: Callable[[Run, FaultRecord, str], bool] | None = None
    after_drive: Act | None = None
    before_check: Callable[[Run, FaultRecord, psycopg.Connection[Any]], None] | None = None
    check: Callable[[Run, FaultRecord, psycopg.Connection[Any], Findings], None] | None = None
    # Its parameters, drawn from the run's generator when the run is planned (None: it has none).
    plan: Callable[[random.Random, RunShape], dict[str, Any]] | None = None
    # Faults a run that draws this one drops (their checks assume what this one changes).
    excludes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if (self.act is None) != (self.trigger is Trigger.SUPERVISOR):
            raise ValueError(f"fault kind {self.name}: an act, unless the supervisor or the run's shape is the fault")


def begin(record: FaultRecord) -> None:
    """The fault lands now."""
    record.triggered = True
    record.started_at = time.time()
