"""What a maintenance step is: its name, the policy fields it reads, the counters of a run it adds to, when a run
takes it, and its work on one table under the sink's commit lock (coordinator_service.engine.maintenance runs the
registered steps, in order, on each of a sink's tables)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from coordinator_service.engine.file_deletion import FileDeleter
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.models import MaintenanceRun, MaintenanceTrigger, Sink
from coordinator_service.settings import Settings
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables.format import TableFormat


@dataclass(frozen=True)
class StepContext:
    """What every step works with: the log, the tables, the one way files are deleted, the coordinator's settings."""

    database: Database
    tables: TableFormat
    deleter: FileDeleter
    settings: Settings


@dataclass(frozen=True)
class RunOccasion:
    """Why and when a run happens: what started it, and when the sink's tables were last swept (None: never)."""

    trigger: MaintenanceTrigger
    last_sweep: datetime | None


class MaintenanceStep(Protocol):
    # As the logs name it.
    name: str
    # The MaintenancePolicy fields it reads (the admin API's overrides of them reach it through the policy).
    policy_fields: tuple[str, ...]
    # The columns of maintenance_runs it adds to (log.maintenance_counters.RUN_COUNTERS).
    counters: tuple[str, ...]

    def wanted(self, policy: MaintenancePolicy, occasion: RunOccasion) -> bool:
        """Whether this run takes the step: every run, unless the step keeps a clock of its own."""
        return True

    async def run(
        self,
        context: StepContext,
        sink: Sink,
        identifier: str,
        policy: MaintenancePolicy,
        lock: CommitLock,
        run: MaintenanceRun,
    ) -> None:
        """The step's work on one of the sink's tables, its counts added to `run`."""
