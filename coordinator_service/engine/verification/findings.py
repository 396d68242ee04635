"""What a verification finds: each fault names the table, the epoch and the first offsets or keys at fault."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# A Kafka topic-partition, and offsets by topic-partition.
TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


class FaultKind(StrEnum):
    OVERLAP = "overlap"  # an epoch's range starts before the previous one ended: records read twice
    GAP = "gap"  # an epoch's range starts after the previous one ended: records never read
    END_MISMATCH = "end-mismatch"  # the newest snapshot's end offsets are not where the epochs end
    TOO_MANY_ROWS = "too-many-rows"  # an epoch's files hold more rows than its range has offsets
    FOREIGN_CHANGE = "foreign-change"  # a snapshot the coordinator did not write added or deleted rows
    SNAPSHOT_ROWS = "snapshot-rows"  # a snapshot of the sink added other rows than its epochs' files hold
    DUPLICATE_POSITION = "duplicate-position"  # one (topic, partition, offset) among the live rows twice
    OUTSIDE_RANGE = "outside-range"  # a live row from an offset outside the committed range
    DUPLICATE_KEY = "duplicate-key"  # one key among a keyed table's live rows twice
    MISSING_RECORD = "missing-record"  # an offset the topic has in the committed range is in no live row
    ROWS_NOT_READ = "rows-not-read"  # an epoch's files hold other rows than the records its writer read


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    table: str
    # The epoch at fault, when one is (None: a change outside the coordinator, a key of rows of several epochs).
    epoch: int | None
    detail: str

    def __str__(self) -> str:
        epoch = "" if self.epoch is None else f", epoch {self.epoch}"
        return f"{self.kind.value} in {self.table}{epoch}: {self.detail}"


@dataclass
class TableVerification:
    """One table's verification: its faults, what could not be proven (notes) and how far it reached."""

    table: str
    faults: list[Fault] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The newest snapshot verified (None: the table has none) and the newest epoch of the sink it holds.
    snapshot_id: int | None = None
    verified_epoch: int = -1
    deep: bool = False
    kafka: bool = False
    rows_read: int = 0
    files_read: int = 0
    manifests_read: int = 0

    def fault(self, kind: FaultKind, epoch: int | None, detail: str) -> None:
        self.faults.append(Fault(kind, self.table, epoch, detail))


@dataclass
class Verification:
    """A sink's verification: every table's, and the sink's end offsets it reached."""

    sink: str
    incremental: bool
    tables: list[TableVerification] = field(default_factory=list)
    end_offsets: Offsets = field(default_factory=dict)

    @property
    def faults(self) -> list[Fault]:
        return [fault for table in self.tables for fault in table.faults]

    @property
    def ok(self) -> bool:
        return not self.faults

    @property
    def verified_epoch(self) -> int:
        return min((table.verified_epoch for table in self.tables), default=-1)


def describe_offsets(offsets: Offsets) -> str:
    return ", ".join(f"{topic}-{partition}@{offset}" for (topic, partition), offset in sorted(offsets.items()))


def first(values: list[str], limit: int = 5) -> str:
    """The first values at fault, and how many more there are."""
    more = f" (+{len(values) - limit} more)" if len(values) > limit else ""
    return ", ".join(values[:limit]) + more
