"""What the coordinator writes into a table's snapshots, and how it reads them back: the marker of a sink's epoch
(sink, incarnation, generation, epoch, commit id) and the fence of a destructive operator action. In the contract:
a reader of the tables outside the coordinator (spark_writer.fresh) tells a sink's snapshots by them too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class Summary(Protocol):
    """A snapshot's summary as pyiceberg gives it (the contract names no table library)."""

    @property
    def additional_properties(self) -> Mapping[str, str]: ...


class Snapshot(Protocol):
    """A snapshot as pyiceberg gives it: what snapshot_properties reads of it."""

    @property
    def summary(self) -> Summary | None: ...


MARKER_SINK = "sink-coordinator.sink"


MARKER_EPOCH = "sink-coordinator.epoch"


MARKER_COMMIT_ID = "sink-coordinator.commit-id"


# Absent on snapshots written before generations existed: those count as generation 0.
MARKER_GENERATION = "sink-coordinator.generation"


# The sink row's incarnation (a UUID); absent on snapshots written before incarnations existed.
MARKER_SINK_ID = "sink-coordinator.sink-id"


# A fence snapshot (no row changed) an operator's abort or reset committed, by which sink and why.
FENCE_SINK = "sink-coordinator.fence"


FENCE_SINK_ID = "sink-coordinator.fence.sink-id"


FENCE_REASON = "sink-coordinator.fence.reason"


def snapshot_properties(snapshot: Snapshot) -> dict[str, str]:
    """The snapshot's summary properties (its operation aside) as a plain mapping, the one way the coordinator reads
    them: pyiceberg's Summary answers None for a key it lacks, so `key in summary` is always true and
    `summary.get(key, default)` never gives the default."""
    return {} if snapshot.summary is None else dict(snapshot.summary.additional_properties)


@dataclass(frozen=True)
class SinkIdentity:
    """Which markers are a sink's own: its name, incarnation and generation (see sink_markers)."""

    name: str
    incarnation: str
    generation: int
    # Markers without an incarnation (written before incarnations existed) count as this sink's.
    legacy_markers: bool = False

    def owns(self, summary: Mapping[str, str]) -> bool | None:
        """True: this sink's marker; False: the marker of an earlier incarnation or generation of its
        name (nothing older is its own); None: not a marker of this name."""
        if summary.get(MARKER_SINK) != self.name:
            return None
        incarnation = summary.get(MARKER_SINK_ID)
        if incarnation is None and not self.legacy_markers:
            return False
        if incarnation is not None and incarnation != self.incarnation:
            return False
        return int(str(summary.get(MARKER_GENERATION, "0"))) == self.generation

    def marker(self, epoch: int, commit_id: str) -> dict[str, str]:
        return {
            MARKER_SINK: self.name,
            MARKER_SINK_ID: self.incarnation,
            MARKER_EPOCH: str(epoch),
            MARKER_COMMIT_ID: commit_id,
            MARKER_GENERATION: str(self.generation),
        }


@dataclass(frozen=True)
class Marker:
    """A snapshot the coordinator wrote for a sink: every epoch up to `epoch` is in it or below it."""

    epoch: int
    snapshot_id: int
