"""One sink's committer in this process, in one object (Kafka Connect's CommitState): its task and what wakes it,
what the admin API shows of it, what it committed here last; and the epoch numbering a commit belongs to."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from coordinator_service.log.models import Sink

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TableFailure:
    """Why the last commit to one of a sink's tables failed, and whether retrying can fix it (when not, the committer
    stops until an operator acts: the sink is stuck)."""

    error: str
    retryable: bool


@dataclass
class CommitterHealth:
    """What the admin API shows of one sink's committer."""

    retrying: bool = False
    attempts: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None
    # Set when a commit failed in a way no retry can fix: the committer waits for an operator's resume.
    stuck: str | None = None
    # The sink's resumes in the log when it stuck (None: not recorded there): a resume through any process or
    # replica counts one more, and this committer follows it.
    stuck_at_resumes: int | None = None
    # Fan-out: the tables whose last commit failed while the others committed, with why.
    failing_tables: dict[str, TableFailure] = field(default_factory=dict)


def stuck_reason(health: CommitterHealth | None, sink: Sink) -> str | None:
    """Why the sink's commits are stuck, here or in any process or replica (the log); None when they are not, or
    were resumed since (through any process: a committer stuck here follows the resume at its next wake)."""
    if sink.committer_stuck_reason is not None:
        return sink.committer_stuck_reason
    if health is None or health.stuck is None:
        return None
    if health.stuck_at_resumes is not None and sink.resumes > health.stuck_at_resumes:
        return None
    return health.stuck


@dataclass
class SinkCommitState:
    """One sink's committer in this process (Kafka Connect's CommitState): its task and what wakes it, what the
    admin API shows of it, and what it committed here last."""

    # The sink's name, once a pass read it (log lines and metrics before that say its id).
    name: str | None = None
    # Set from the first time the sink is driven here: the admin API shows it (absent: idle here).
    health: CommitterHealth | None = None
    task: asyncio.Task[None] | None = None
    # Set to start a pass; the flush request (a writer waiting for its commit) skips the rest of the interval.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    flush: asyncio.Event = field(default_factory=asyncio.Event)
    # The committed epoch this process's last COMMITTED transaction recorded, and in which numbering (a reset
    # starts another), so that a waiter it wakes need not read the sink again.
    committed_here: tuple[Numbering, int] | None = None
    # When this process last committed the sink (time.monotonic()), for the commit interval.
    last_commit: float | None = None
    # Passes finished (whatever their outcome), and that count when the sink was last resumed.
    passes_done: int = 0
    # This process's passes and commits of the sink that ended (a writer waiting for its commit reads the log again
    # after each).
    progress: int = 0
    resumed_at: int | None = None

    def label(self, sink_id: int) -> str:
        return self.name or f"id {sink_id}"

    def healthy(self) -> CommitterHealth:
        """The sink's health, created on first use (the sink is no longer idle here)."""
        if self.health is None:
            self.health = CommitterHealth()
        return self.health


# The epoch numbering a sink row is in: its incarnation and generation (a reset starts a new one).
Numbering = tuple[uuid.UUID, int]


def numbering_of(sink: Sink) -> Numbering:
    return (sink.incarnation, sink.generation)
