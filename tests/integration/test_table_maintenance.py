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
)

TABLE = "db.keyed"


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

    rewrite = cp.write_compacted(table, [[tm.as_small_file(f) for f in others]], target_bytes=1 << 20)
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

    groups = cp.compaction_plan(
        cp.compaction_input(committed),
        set(),
        target_bytes=1 << 20,
        min_files=1_000,
        max_bytes=1 << 30,
        spec_id=tm.default_spec_id(committed),
        delete_files=1,
        deleted_rows_ratio=1.0,
    )
    compacted = cp.commit_compaction(committed, cp.write_compacted(committed, groups, target_bytes=1 << 20))

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
        groups = cp.compaction_plan(
            cp.compaction_input(table),
            set(),
            target_bytes=1 << 20,
            min_files=1_000,
            max_bytes=one_file,  # one file a run
            spec_id=tm.default_spec_id(table),
            delete_files=1,
            deleted_rows_ratio=1.0,
        )
        table = cp.commit_compaction(table, cp.write_compacted(table, groups, target_bytes=1 << 20))
        runs += 1
        assert_table_holds(table, model)

    assert (runs, cp.live_files(table).deletes) == (2, [])
