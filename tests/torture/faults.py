"""The faults a torture run injects, each planned from the run's seed before anything starts.

A plan fixes everything random about a fault (its trigger: the k-th batch
pre-committed by the run's drivers, then a delay; its parameters: how long a
server stays down, which failpoint, which process). The moment it lands in the
system's own timeline varies, which is the point; the seed replays the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
