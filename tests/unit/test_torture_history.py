"""The torture harness's reading of a sink's log history (tests.torture.audit.read_history).

The rows are those of a run (seed 9001, operator_abort then operator_reset) in which the harness
reported the records of an epoch an operator had aborted with force as missing from the table: the
first registration after the reset deleted the old generation's rows, and the deleted ABORTED row
was read as PRUNED, that is as committed.
"""

from __future__ import annotations

import json

from coordinator_service.log import precommit_metadata
from coordinator_service.log.precommit_metadata import DataFileEntry, PreCommitMetadata
from tests.torture.audit import read_history


def _metadata(epoch: int, generation: int) -> bytes:
    end = {"orders": {"0": 10 * (epoch + 1)}}
    entry = DataFileEntry(f"file:///data/{generation}-{epoch}.parquet", 0, 10, 100, 0)
    properties = {"spark.end_offsets": json.dumps([end])}
    return precommit_metadata.encode(PreCommitMetadata("torture.orders", (entry,), properties))


def _row(op: str, epoch: int, status: str, checkpoint: int | None, generation: int, cause: str | None = None) -> tuple:
    metadata = None if op == "DELETE" else _metadata(epoch, generation)
    return (op, epoch, status, None if op == "DELETE" else 1, metadata, checkpoint, generation, cause)


AUDIT = [
    _row("INSERT", 0, "PENDING", -1, 0),
    _row("UPDATE", 0, "COMMITTED", 0, 0),
    _row("INSERT", 1, "PENDING", 0, 0),
    _row("UPDATE", 1, "ABORTED", 0, 0, "OPERATOR"),  # forced abort
    _row("UPDATE", 1, "ABORTED", 1, 0, "OPERATOR"),  # its files cleaned
    _row("INSERT", 2, "PENDING", 1, 0),
    _row("UPDATE", 2, "COMMITTED", 2, 0),
    # the reset, then the new writer's registration deletes generation 0's rows (the sink is at generation 1)
    _row("DELETE", 0, "COMMITTED", None, 1),
    _row("DELETE", 1, "ABORTED", None, 1),
    _row("DELETE", 2, "COMMITTED", None, 1),
    _row("INSERT", 0, "PENDING", -1, 1),
    _row("UPDATE", 0, "COMMITTED", 0, 1),
]


def test_an_operator_abort_stays_lost_by_design_after_the_reset_deleted_its_row() -> None:
    history = read_history(AUDIT)
    assert history.latest[(0, 1)] == ("ABORTED", "OPERATOR")
    assert history.aborted == {(0, 1, 1)}


def test_committed_rows_deleted_after_a_reset_are_pruned_and_the_new_generation_is_its_own() -> None:
    history = read_history(AUDIT)
    assert history.latest == {
        (0, 0): ("PRUNED", None),
        (0, 1): ("ABORTED", "OPERATOR"),
        (0, 2): ("PRUNED", None),
        (1, 0): ("COMMITTED", None),
    }
    assert history.paths_by_attempt[(1, 0, 1)] == {"file:///data/1-0.parquet"}
    assert history.anomalies == []


def test_a_commit_above_the_recorded_checkpoint_is_an_anomaly() -> None:
    history = read_history([_row("INSERT", 0, "PENDING", -1, 0), _row("UPDATE", 0, "COMMITTED", -1, 0)])
    assert history.anomalies == ["epoch 0 was marked COMMITTED while the recorded checkpoint was -1 (invariant 3)"]
