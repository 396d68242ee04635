"""What the operators' actions answer (the admin API maps each to its schema), and who asked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.engine.commit_state import CommitterHealth
from coordinator_service.log.models import EpochRecord, MaintenanceRun, Sink
from coordinator_service.log.precommit_metadata import PreCommitMetadata
from coordinator_service.log.sink_rows import EpochCounts
from coordinator_service.log.sink_tables import RecordedTable
from coordinator_service.settings.maintenance import MaintenancePolicy

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Operator:
    """Who asked: the token's identity ('admin', or 'anonymous' when no admin token is configured) and from where."""

    identity: str
    address: str

    def __str__(self) -> str:
        return f"{self.identity} from {self.address}"


@dataclass(frozen=True)
class SinkOverview:
    sink: Sink
    counts: EpochCounts
    # None: this process has not run the sink's committer yet (another replica may have).
    health: CommitterHealth | None
    # Its tables, its own first (fan-out: then the others by name).
    tables: Sequence[RecordedTable]
    # The other sinks writing each of its tables that others write too, by name.
    also_written_by: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Why the sink does not advance (its oldest PENDING epoch waited STALLED_AFTER_SECONDS); None while it does.
    stalled: str | None = None


@dataclass(frozen=True)
class EpochDetail:
    row: EpochRecord
    metadata: PreCommitMetadata


@dataclass(frozen=True)
class AbortOutcome:
    row: EpochRecord
    # False when the epoch was ABORTED already (the request changed nothing).
    changed: bool
    # Set when a checkpointed epoch was aborted (force): what the operator gave up.
    warning: str | None = None


@dataclass(frozen=True)
class ResetOutcome:
    sink: SinkOverview
    aborted_epochs: tuple[int, ...]


@dataclass(frozen=True)
class GivenUp:
    """An epoch's files in a table removed from its sink: their records will not reach any table."""

    epoch: int
    files: int
    records: int


@dataclass(frozen=True)
class TableRemoved:
    table: str
    sink: SinkOverview
    given_up: tuple[GivenUp, ...]

    def summary(self) -> str:
        """One line for people (the console's notice)."""
        epochs, records = len(self.given_up), sum(each.records for each in self.given_up)
        return (
            f"table {self.table} removed from sink {self.sink.sink.name}: {epochs} epoch{'' if epochs == 1 else 's'} "
            f"given up ({records} records), the writer fenced: restart it with routes that no longer name the table"
        )


@dataclass(frozen=True)
class SinkDeleted:
    """What deleting a sink did: the records of its epochs not committed that no table will get, the files proven
    garbage and deleted (those its epochs gave up, and those the tables it dropped reached), those left on storage
    (not provably garbage: a table gone, one that references them, a file under another table's location or reached
    through a link, one another sink claims), and the tables dropped from their catalog."""

    sink: str
    given_up: tuple[GivenUp, ...]
    files_deleted: int
    files_kept: int
    tables_dropped: tuple[str, ...]

    def summary(self) -> str:
        """One line for people (the console's notice, the command line's answer)."""
        epochs, files = len(self.given_up), self.files_deleted
        records = sum(each.records for each in self.given_up)
        return (
            f"sink {self.sink} deleted: {epochs} epoch{'' if epochs == 1 else 's'} given up ({records} records), "
            f"{files} file{'' if files == 1 else 's'} deleted, {self.files_kept} left, "
            f"{', '.join(self.tables_dropped) or 'no table'} dropped"
        )


@dataclass(frozen=True)
class Reconciled:
    sink: SinkOverview
    # The restart point: every table holds the epochs up to it; a new writer starts from its end offsets.
    restart_epoch: int
    # The newest epoch each table holds; those above restart_epoch are read again by a writer started from it.
    tables: dict[str, int]


@dataclass(frozen=True)
class SuspendedReconciled:
    """What a reconcile of several suspended sinks did: each sink reconciled, and each refused with why (nothing of
    it changed), in the order asked."""

    reconciled: tuple[Reconciled, ...]
    refused: tuple[tuple[str, CoordinatorError], ...]

    def summary(self) -> list[str]:
        """One line a sink, for people (the command line's answer)."""
        lines = [
            f"sink {each.sink.sink.name} reconciled: restart epoch {each.restart_epoch}, tables "
            + ", ".join(f"{table} at {epoch}" for table, epoch in each.tables.items())
            for each in self.reconciled
        ]
        lines += [f"sink {name} not reconciled: {error.message}" for name, error in self.refused]
        return lines or ["no sink is suspended: nothing to reconcile"]


@dataclass(frozen=True)
class MaintenanceView:
    """A sink's table maintenance: the policy in force, the sink's overrides of the defaults, the last runs."""

    policy: MaintenancePolicy
    overrides: dict[str, object]
    runs: Sequence[MaintenanceRun]
