"""Named failure-injection points on the commit path, off unless SINK_COORDINATOR_FAILPOINTS names them.

Settings refuse a non-empty FAILPOINTS unless SINK_COORDINATOR_ENABLE_FAILPOINTS is true, so that a
production process cannot be armed by a stray variable; configure() logs the armed points as a warning.

Tests use them to kill the process (SIGKILL, as `kill -9` would), raise, or
stall the step forever (holding whatever it holds, as a hung process would)
exactly between two steps, e.g. `precommit.after_persist=kill`. `name=kill@3` acts on the third
hit only (the earlier ones pass), so a test can crash at a random moment of a run (tests/torture).
"""

from __future__ import annotations

import asyncio
import os
import signal
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)


class Failpoint(StrEnum):
    # The footers are read and the row is built, nothing is written to PostgreSQL yet.
    PRECOMMIT_BEFORE_PERSIST = "precommit.before_persist"
    # The PreCommit row is committed in PostgreSQL, the writer not yet answered.
    PRECOMMIT_AFTER_PERSIST = "precommit.after_persist"
    # The checkpoint is recorded, no Iceberg commit started.
    CHECKPOINT_AFTER_RECORD = "checkpoint.after_record"
    # The committer holds the sink's advisory lock, nothing read yet.
    COMMIT_AFTER_LOCK = "commit.after_lock"
    # The markers are walked and the epochs are not in the table: the append is next.
    COMMIT_BEFORE_APPEND = "commit.before_append"
    # Fan-out: one table's snapshot of the group is committed, another table of the sink is next.
    COMMIT_BETWEEN_TABLES = "commit.between_tables"
    # The Iceberg snapshot (one per table with files) is committed, the epochs not yet marked COMMITTED.
    COMMIT_AFTER_APPEND = "commit.after_append"
    # The epochs are marked COMMITTED (and rows past the retention pruned in the same transaction).
    COMMIT_AFTER_MARK = "commit.after_mark"
    # RegisterWriter made sure of the table; its transaction (term, aborts, checkpoint) has not started.
    REGISTER_BEFORE_RECOVERY = "register.before_recovery"
    # RegisterWriter's transaction is committed, the writer not yet answered.
    REGISTER_AFTER_RECOVERY = "register.after_recovery"
    # An aborted epoch's files are deleted, files_cleaned not yet set.
    CLEANUP_AFTER_DELETE = "cleanup.after_delete"
    # Snapshots are expired in the table's metadata; the files only they referenced are not deleted yet.
    MAINTENANCE_AFTER_EXPIRE = "maintenance.after_expire"
    # Compacted files are written under the table location; the replace snapshot is not committed yet.
    MAINTENANCE_BEFORE_COMPACTION_COMMIT = "maintenance.before_compaction_commit"
    # The replace snapshot is committed; the run is not recorded yet.
    MAINTENANCE_AFTER_COMPACTION_COMMIT = "maintenance.after_compaction_commit"
    # Some orphan files are deleted, the others not yet.
    MAINTENANCE_DURING_SWEEP = "maintenance.during_sweep"


class Action(StrEnum):
    KILL = "kill"
    ERROR = "error"
    PAUSE = "pause"


class FailpointError(RuntimeError):
    pass


_armed: dict[Failpoint, Action] = {}
# Hits still to let pass before the action (name=action@N arms the Nth hit: N-1 pass).
_passes: dict[Failpoint, int] = {}


def _parse_with_hits(spec: str) -> dict[Failpoint, tuple[Action, int]]:
    armed: dict[Failpoint, tuple[Action, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action_spec = item.partition("=")
        action, _, nth = action_spec.partition("@")
        try:
            hits = int(nth) if nth else 1
            if hits < 1:
                raise ValueError
            armed[Failpoint(name)] = (Action(action or Action.KILL), hits)
        except ValueError:
            raise ValueError(
                f"failpoint {item!r} is not 'name=action' or 'name=action@N' (N >= 1) with a name in "
                f"{[p.value for p in Failpoint]} and an action in {[a.value for a in Action]}"
            ) from None
    return armed


def parse(spec: str) -> dict[Failpoint, Action]:
    """Parse 'name=action,name=action@N'; raise ValueError naming a bad entry."""
    return {point: action for point, (action, _) in _parse_with_hits(spec).items()}


def configure(spec: str) -> None:
    """Arm exactly the points of the spec."""
    armed = _parse_with_hits(spec)
    _armed.clear()
    _passes.clear()
    _armed.update({point: action for point, (action, _) in armed.items()})
    _passes.update({point: hits - 1 for point, (_, hits) in armed.items()})
    if armed:
        log.warning("failpoints armed", failpoints={k.value: f"{a.value}@{n}" for k, (a, n) in armed.items()})


async def hit(point: Failpoint) -> None:
    action = _armed.get(point)
    if action is None:
        return
    if _passes.get(point, 0) > 0:
        _passes[point] -= 1
        return
    log.warning("failpoint hit", failpoint=point.value, action=action.value)
    if action is Action.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if action is Action.PAUSE:
        await asyncio.Event().wait()  # until the task is cancelled at shutdown
    raise FailpointError(f"failpoint {point.value}")
