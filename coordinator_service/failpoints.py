"""Named failure-injection points on the commit path, off unless SINK_COORDINATOR_FAILPOINTS names them.

Tests use them to kill the process (SIGKILL, as `kill -9` would), raise, or
stall the step forever (holding whatever it holds, as a hung process would)
exactly between two steps, e.g. `precommit.after_persist=kill`.
"""

from __future__ import annotations

import asyncio
import os
import signal
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)


class Failpoint(StrEnum):
    # The PreCommit row is committed in PostgreSQL, the writer not yet answered.
    PRECOMMIT_AFTER_PERSIST = "precommit.after_persist"
    # The checkpoint is recorded, no Iceberg commit started.
    CHECKPOINT_AFTER_RECORD = "checkpoint.after_record"
    # The Iceberg snapshot is committed, the epochs not yet marked COMMITTED.
    COMMIT_AFTER_APPEND = "commit.after_append"
    # The epochs are marked COMMITTED, older rows not yet pruned.
    COMMIT_AFTER_MARK = "commit.after_mark"
    # RegisterWriter's transaction is committed, the writer not yet answered.
    REGISTER_AFTER_RECOVERY = "register.after_recovery"
    # An aborted epoch's files are deleted, files_cleaned not yet set.
    CLEANUP_AFTER_DELETE = "cleanup.after_delete"


class Action(StrEnum):
    KILL = "kill"
    ERROR = "error"
    PAUSE = "pause"


class FailpointError(RuntimeError):
    pass


_armed: dict[Failpoint, Action] = {}


def parse(spec: str) -> dict[Failpoint, Action]:
    """Parse 'name=action,name=action'; raise ValueError naming a bad entry."""
    armed: dict[Failpoint, Action] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        try:
            armed[Failpoint(name)] = Action(action or Action.KILL)
        except ValueError:
            raise ValueError(
                f"failpoint {item!r} is not 'name=action' with a name in {[p.value for p in Failpoint]} "
                f"and an action in {[a.value for a in Action]}"
            ) from None
    return armed


def configure(spec: str) -> None:
    """Arm exactly the points of the spec."""
    armed = parse(spec)
    _armed.clear()
    _armed.update(armed)
    if armed:
        log.warning("failpoints armed", failpoints={k.value: v.value for k, v in armed.items()})


async def hit(point: Failpoint) -> None:
    action = _armed.get(point)
    if action is None:
        return
    log.warning("failpoint hit", failpoint=point.value, action=action.value)
    if action is Action.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if action is Action.PAUSE:
        await asyncio.Event().wait()  # until the task is cancelled at shutdown
    raise FailpointError(f"failpoint {point.value}")
