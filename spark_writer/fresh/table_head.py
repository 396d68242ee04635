"""The table a fresh read starts from: its current snapshot, and where in Kafka the sink's epochs it holds end.

Every snapshot the coordinator appends for a sink carries its marker (contract.markers) and the end offsets of its
newest epoch (contract.source_positions); maintenance's snapshots (compaction, expiry) and an operator's fences carry
none and change no record's presence. So the current snapshot holds exactly the records below the end offsets of
the newest of its ancestors that is the sink's own (its name, incarnation and generation). Where no ancestor carries
the sink's name, the sink has committed nothing to the table yet; where the newest that does is an earlier
incarnation's or generation's (the sink was deleted and created again, or reset), which records the table holds of
the sink's is not said by any snapshot, and the read is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from coordinator_service.contract.markers import MARKER_EPOCH, SinkIdentity, snapshot_properties
from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
from spark_writer.kafka.offsets import Offsets, offsets_from_json

# A fresh read's Arrow schema metadata: the snapshot it read the table at (absent for a table without one).
SNAPSHOT_ID_METADATA = "sink-coordinator.snapshot-id"


class TableHeadError(ValueError):
    """The table's snapshots do not say which of the sink's records it holds."""


@dataclass(frozen=True)
class TableHead:
    """The table's current snapshot (None: it has none) and the end offsets of the sink's epochs it holds (None: it
    holds none of them), with the newest of those epochs."""

    table: Table
    snapshot_id: int | None
    end_offsets: Offsets | None
    epoch: int | None

    def rows(self) -> pa.Table:
        """The table's rows at its current snapshot."""
        if self.snapshot_id is None:
            return self.table.schema().as_arrow().empty_table()
        return self.table.scan(snapshot_id=self.snapshot_id).to_arrow()


def table_head(table: Table, sink: SinkIdentity) -> TableHead:
    """Where `table` stands for `sink` (the module's rule); TableHeadError when its snapshots cannot say."""
    current = table.current_snapshot()
    if current is None:
        return TableHead(table, None, None, None)
    for snapshot in ancestors_of(current, table.metadata):
        summary = snapshot_properties(snapshot)
        owned = sink.owns(summary)
        if owned is None:
            continue  # maintenance's, a fence, another sink's
        if not owned:
            raise TableHeadError(
                f"the newest snapshot of sink {sink.name} in the table ({snapshot.snapshot_id}, epoch "
                f"{summary.get(MARKER_EPOCH)}) is an earlier incarnation's or generation's: the sink was created "
                "again or reset and has committed nothing since, so no snapshot says which of its records the table "
                "holds. Read again once its first epoch is committed"
            )
        if SNAPSHOT_END_OFFSETS not in summary:
            raise TableHeadError(
                f"snapshot {snapshot.snapshot_id} of sink {sink.name} does not say where its epoch ended in Kafka "
                f"({SNAPSHOT_END_OFFSETS}): its writer did not send kafka.end-offsets (a DataFrame that is not "
                "the Kafka source's, or too many partitions), so a fresh read cannot tell the table's records from "
                "the topic's"
            )
        offsets = offsets_from_json(_parsed(summary[SNAPSHOT_END_OFFSETS], snapshot.snapshot_id))
        return TableHead(table, current.snapshot_id, offsets, int(summary[MARKER_EPOCH]))
    return TableHead(table, current.snapshot_id, None, None)


def _parsed(raw: str, snapshot_id: int) -> dict[str, dict[str, int]]:
    try:
        offsets = json.loads(raw)
    except json.JSONDecodeError:
        offsets = None
    if not isinstance(offsets, dict) or not all(isinstance(parts, dict) for parts in offsets.values()):
        raise TableHeadError(f"snapshot {snapshot_id}'s {SNAPSHOT_END_OFFSETS} is not end offsets: {raw[:200]!r}")
    return offsets
