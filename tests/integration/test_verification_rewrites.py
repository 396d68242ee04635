"""The verifier's shallow check of maintenance's rewrites of a keyed table (engine/verification/ranges.py on the
snapshots tables/table_audit.py reads), on a real SQL catalog: a compaction that applies position deletes leaves the
deleted rows out, and keeps the live rows."""

from __future__ import annotations

import dataclasses

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.engine.verification.findings import FaultKind, TableVerification
from coordinator_service.engine.verification.ranges import check_snapshots
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_audit
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.iceberg import IcebergGateway
from tests.fixtures.keyed_tables import (
    KEYED,
    TWO_FILES_AND_THEIR_DELETES,
    assert_table_holds,
    commit_each,
)

TABLE = "db.rewritten"
SINK = SinkIdentity("rewritten", "incarnation", 0)


@pytest.fixture
def gateway(catalog: Catalog) -> IcebergGateway:
    gateway = IcebergGateway(catalog)
    gateway.ensure_table(TABLE, KEYED, (), key=("id",))
    return gateway


def test_compactions_that_apply_position_deletes_keep_the_rows(gateway: IcebergGateway, catalog: Catalog) -> None:
    """Two compactions of a keyed table (tests/integration/test_table_maintenance.py's): the first rewrites all but one
    data file and keeps the delete file that also deletes from the file it left live (its deletes into the rewritten
    files applied, not removed), the second rewrites everything and drops the rest. Each leaves out the rows position
    deletes had deleted (fewer rows added than its removed files hold): maintenance keeping the rows, not a foreign
    change (the verifier called both foreign changes, and the torture's upsert runs after every compaction)."""
    commits, model = commit_each(gateway, TABLE, TWO_FILES_AND_THEIR_DELETES)
    table = catalog.load_table(TABLE)
    written = table.current_snapshot()
    assert written is not None
    [first] = commits[0].new_data_files
    others = [data_file for data_file in cp.live_files(table).data if data_file.file_path != first.file_path]
    some = cp.CompactionPlan([[tm.as_small_file(f) for f in others]])
    table = cp.commit_compaction(table, cp.write_compacted(table, some, target_bytes=1 << 20))
    assert len(cp.live_files(table).deletes) == 1  # kept: it deletes from the first file too
    everything = cp.CompactionPlan([[tm.as_small_file(f) for f in cp.live_files(table).data]])
    table = cp.commit_compaction(table, cp.write_compacted(table, everything, target_bytes=1 << 20))
    assert_table_holds(table, model)

    snapshots = table_audit.snapshots_after(table, written.snapshot_id, table_audit.ReadCount())
    assert snapshots is not None
    assert [(s.operation, s.added_records, s.summary["deleted-records"]) for s in snapshots] == [
        ("replace", 11, "13"),  # the second file's 10 rows (2 deleted), the third's and the fourth's
        ("replace", 20, "21"),  # the first file's 10 (1 deleted), the first compaction's 11
    ]
    assert [snapshot.deleted_rows_removed for snapshot in snapshots] == [2, 1]
    verification = TableVerification(TABLE)
    check_snapshots(verification, snapshots, SINK, [])
    assert verification.faults == []

    # The snapshots before the compactions expired and the files only they held deleted, as maintenance does: the
    # first compaction's dropped delete file is gone, so how many rows it left out is not known (noted, no fault).
    table, gone = tm.expire(
        table, [s.snapshot_id for s in table.snapshots() if s.sequence_number <= written.sequence_number]
    )
    for path in gone.data_files:
        table.io.delete(path)
    after_expiry = table_audit.snapshots_after(table, None, table_audit.ReadCount())
    assert after_expiry is not None
    assert [snapshot.deleted_rows_removed for snapshot in after_expiry] == [None, 1]
    verification = TableVerification(TABLE)
    check_snapshots(verification, after_expiry, SINK, [])
    assert verification.faults == []
    assert "how many rows it left out is not known" in verification.notes[0]

    # A rewrite whose rows do not add up (one live row lost, or one deleted row brought back) is a foreign change.
    for wrong in (1, -1):
        changed = dataclasses.replace(snapshots[0], deleted_rows_removed=snapshots[0].deleted_rows_removed + wrong)
        verification = TableVerification(TABLE)
        check_snapshots(verification, [changed], SINK, [])
        assert [fault.kind for fault in verification.faults] == [FaultKind.FOREIGN_CHANGE]
