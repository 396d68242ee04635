"""Compaction of a keyed table's files at the table level (coordinator_service.tables.table_maintenance), on a real SQL
catalog: the position deletes applied by the rewrite, and a delete file dropped only when no data file it deletes
from stays live; the table read by pyiceberg and DuckDB compared with the model."""

from __future__ import annotations

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_index_reads import SnapshotChanges, snapshot_changes
from coordinator_service.tables.position_deletes import deleted_positions
from tests.fixtures.keyed_tables import (
    KEYED,
    TWO_FILES_AND_THEIR_DELETES,
    Operation,
    Row,
    Upsert,
    apply,
    assert_table_holds,
    commit_each,
    commit_epochs,
    planned_compaction,
)

TABLE = "db.keyed"
BY_REGION = "db.keyed_by_region"
# A data file with any row deleted is due for a rewrite.
ANY_DELETED_ROW = 1e-9


@pytest.fixture
def gateway(catalog: Catalog) -> IcebergGateway:
    gateway = IcebergGateway(catalog)
    gateway.ensure_table(TABLE, KEYED, (), key=("id",))
    return gateway


def test_a_delete_file_stays_while_a_data_file_it_deletes_from_stays_live(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    """A rewrite that leaves a data file out (held by an epoch, or beyond the run's bytes) keeps every delete file that
    deletes rows of it: dropping one would bring its deleted rows back. A delete file of rewritten files only goes,
    recorded DELETED in the snapshot's own manifests (what the key index's catch-up reads)."""
    commits, model = commit_each(gateway, TABLE, TWO_FILES_AND_THEIR_DELETES)
    table = catalog.load_table(TABLE)
    [first] = commits[0].new_data_files
    others = [data_file for data_file in cp.live_files(table).data if data_file.file_path != first.file_path]
    [both] = commits[2].delete_files
    [second_only] = commits[3].delete_files

    plan = cp.CompactionPlan([[tm.as_small_file(f) for f in others]])
    rewrite = cp.write_compacted(table, plan, target_bytes=1 << 20)
    committed = cp.commit_compaction(table, rewrite)

    assert [f.file_path for f in rewrite.deletes_dropped] == [second_only]
    assert [f.file_path for f in cp.live_files(committed).deletes] == [both]
    assert_table_holds(committed, model)
    snapshot = committed.current_snapshot()
    assert snapshot is not None
    changes = snapshot_changes(committed, snapshot.snapshot_id)
    assert isinstance(changes, SnapshotChanges)
    assert [f.file_path for f in changes.removed_deletes] == [second_only]
    assert {f.file_path for f in changes.removed_data} == {f.file_path for f in others}

    plan = planned_compaction(committed, deleted_rows_ratio=ANY_DELETED_ROW)
    compacted = cp.commit_compaction(committed, cp.write_compacted(committed, plan, target_bytes=1 << 20))

    # The delete files are all applied and gone; a clean file larger than the rest together is not rewritten with
    # them (tests/unit/test_compaction_groups.py).
    assert cp.live_files(compacted).deletes == []
    assert_table_holds(compacted, model)


def test_runs_short_of_bytes_rewrite_the_files_delete_files_refer_to_first(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    """A partition due for its deletes that one run cannot rewrite whole (COMPACTION_MAX_BYTES_PER_RUN): each run
    rewrites files its delete files delete from, not the smallest ones (the rewritten clean files, again and again,
    while the delete files stayed), so the runs get the delete files dropped."""
    model: dict[int, Row] = {}
    epochs: list[list[Operation]] = [
        [Upsert(key, "eu", "a") for key in range(10)],
        [Upsert(key, "eu", "b") for key in range(10, 20)],
        [Upsert(1, "us", "c"), Upsert(11, "us", "c")],  # one delete file, deleting from the first two files
    ]
    commits = []
    for operations in epochs:
        commits.append(commit_epochs(gateway, TABLE, [operations]))
        apply(model, operations)
    table = catalog.load_table(TABLE)
    one_file = max(data_file.file_size_in_bytes for data_file in cp.live_files(table).data)
    runs = 0
    while cp.live_files(table).deletes and runs < 6:
        plan = planned_compaction(table, deleted_rows_ratio=ANY_DELETED_ROW, max_bytes=one_file)  # a file a run
        table = cp.commit_compaction(table, cp.write_compacted(table, plan, target_bytes=1 << 20))
        runs += 1
        assert_table_holds(table, model)

    assert (runs, cp.live_files(table).deletes) == (2, [])


def test_a_partitions_delete_files_are_merged_into_one_that_deletes_the_same_live_rows(
    gateway: IcebergGateway, catalog: Catalog
) -> None:
    """A partition with COMPACTION_DELETE_FILES_MIN delete files has them merged into one in the run's snapshot, with
    the rows they deleted of the data files still live after it (those of a file the same run rewrites are applied
    by the rewrite, and left out); a partition with fewer is left as it is. Both readers see the same rows before and
    after, and the snapshot records the merged files DELETED and the new one ADDED (what the key index follows)."""
    epochs: list[list[Operation]] = [
        [Upsert(key, "eu", "a") for key in range(10)],
        [Upsert(key, "eu", "b") for key in range(10, 20)],
        [Upsert(key, "us", "c") for key in range(20, 25)],
        [Upsert(1, "eu", "d"), Upsert(11, "eu", "d")],
        [Upsert(2, "eu", "e"), Upsert(21, "us", "e")],
        [Upsert(3, "eu", "f"), Upsert(12, "eu", "f")],
        [Upsert(13, "eu", "g")],
    ]
    gateway.ensure_table(BY_REGION, KEYED, ("region",), key=("id",))
    commits, model = commit_each(gateway, BY_REGION, epochs)
    table = catalog.load_table(BY_REGION)
    first = commits[0].new_data_files[0]
    # The first file has 3 of its 10 rows deleted; the second 3 of its 10; us's 1 of 5: the ratio picks the first.
    # The first file only.
    plan = planned_compaction(table, delete_files=3, deleted_rows_ratio=0.3, max_bytes=first.file_size_in_bytes)
    eu_deletes = {f.file_path for f in cp.live_files(table).deletes if f.partition[0] == "eu"}
    assert [small.path for group in plan.groups for small in group] == [first.file_path]
    assert [{small.path for small in merge} for merge in plan.merges] == [eu_deletes]

    rewrite = cp.write_compacted(table, plan, target_bytes=1 << 20)
    compacted = cp.commit_compaction(table, rewrite)

    assert_table_holds(compacted, model)
    [merged] = rewrite.deletes_written
    assert {f.file_path for f in rewrite.deletes_dropped} == eu_deletes
    deleted = {path: rows.tolist() for path, rows in deleted_positions(compacted.io, merged).items()}
    second = commits[1].new_data_files[0].file_path
    assert deleted.keys() == {second}  # none of the rewritten first file's
    assert len(deleted[second]) == 3
    live_deletes = cp.live_files(compacted).deletes
    assert sorted(f.partition[0] for f in live_deletes) == ["eu", "us"]
    snapshot = compacted.current_snapshot()
    assert snapshot is not None
    changes = snapshot_changes(compacted, snapshot.snapshot_id)
    assert isinstance(changes, SnapshotChanges)
    assert {f.file_path for f in changes.removed_deletes} == eu_deletes
    assert [f.file_path for f in changes.added_deletes] == [merged.file_path]
    assert snapshot.summary is not None and snapshot.summary.operation.value == "replace"
