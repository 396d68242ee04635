"""Table maintenance by the coordinator: expiration, manifest merging, compaction, orphan sweep."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table, TableProperties
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator_service import metrics
from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.views import PreCommitOutcome, Registration
from coordinator_service.engine.verification.verifier import Verifier
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.log import maintenance_log
from coordinator_service.log.models import Sink
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from tests.fixtures.admin import AdminApp, AdminFactory, epoch_metadata, eventually, sink_id_of, sink_identity
from tests.fixtures.coordinator import ORDERS, orders, table_files, table_order_ids, write_parquet
from tests.fixtures.delete_files import commit_equality_deletes, commit_position_deletes
from tests.fixtures.duckdb_reader import duckdb_rows
from tests.fixtures.key_index import assert_answers_as_the_scan
from tests.fixtures.keyed_tables import (
    KEYED,
    Delete,
    Operation,
    Row,
    Upsert,
    apply,
    assert_table_holds,
    epoch_files,
)
from tests.fixtures.postgres import query
from tests.fixtures.reachable_files import missing_reachable_files

NO_COMPACTION = {"compaction_min_files": 1_000_000}


def without_commit_triggers(admin: AdminApp) -> AdminApp:
    """Commits ask for no run (Maintainer.appended), however many small files they leave: the test lays out the files
    a run of the clock or an operator's then finds."""
    admin.runtime.committer.after_append = lambda sink, table: None
    return admin


def rows_digest(table: Table) -> tuple[int, str]:
    """The table's rows as a count and a checksum of their sorted contents (order-independent)."""
    table.refresh()
    rows = table.scan().to_arrow().sort_by([("order_id", "ascending")]).to_pylist()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def existing(uris: object) -> set[str]:
    """The files among `uris` that are on storage."""
    assert isinstance(uris, (set, list, tuple))
    return {uri for uri in uris if Path(str(uri).removeprefix("file://")).exists()}


def metadata_file_uris(directory: Path) -> set[str]:
    return {path.as_uri() for path in directory.glob("*.metadata.json")}


def epoch_metadata_of(database_url: str, epoch: int) -> tuple[DataFileEntry, ...]:
    return epoch_metadata(database_url, epoch).data_files


async def pre_commit_paths(admin: AdminApp, registration: Registration, epoch: int, paths: list[str]) -> None:
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=epoch, writer_term=registration.writer_term, paths=tuple(paths))
    )


async def commit_epochs(admin: AdminApp, sink: str, count: int, first_epoch: int = 0) -> None:
    registration = await admin.register(sink)
    for epoch in range(first_epoch, first_epoch + count):
        await admin.pre_commit(sink, registration, epoch, epoch * 10)
        assert await admin.checkpoint(sink, registration, epoch) == epoch


async def test_expiration_keeps_the_newest_snapshots_and_deletes_only_what_they_do_not_reference(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    admin = await admin_factory(snapshot_max_count=3, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 6)
    table = catalog.load_table("db.orders")
    before = rows_digest(table)
    expired_lists = [snapshot.manifest_list for snapshot in table.snapshots()[:-3]]

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    # A commit past the bound may have asked for a run already (trigger threshold): the runs expired 3 in all.
    assert run.outcome == "ok", run.error
    assert await snapshots_expired(admin) == 3
    table = catalog.load_table("db.orders")
    assert len(table.snapshots()) == 3
    assert rows_digest(table) == before
    assert await asyncio.to_thread(existing, expired_lists) == set()
    referenced = (await asyncio.to_thread(tm.reachable, table.io, table.snapshots())).all()
    assert await asyncio.to_thread(existing, referenced) == referenced


async def snapshots_expired(admin: AdminApp) -> int:
    """The snapshots every maintenance run of the sink expired, whatever triggered it."""
    runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
    return sum(int(run["snapshots_expired"]) for run in runs)


async def test_expiration_keeps_a_marker_the_recovery_walk_still_needs(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """A snapshot whose marker is above the log's committed epoch (appended, not yet marked) is never expired."""
    admin = await admin_factory(snapshot_max_count=1, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 2)
    registration = await admin.register("orders", checkpointed_epoch=1)
    path = await admin.pre_commit("orders", registration, 2, 20)
    entries = (await admin.runtime.coordinator.sink_state("orders")).epochs
    assert [epoch.epoch for epoch in entries] == [2]
    # A committer appended epoch 2 and died before marking it; then another writer appended to the table.
    metadata = epoch_metadata_of(database_url, 2)
    marked = await asyncio.to_thread(
        admin.runtime.iceberg.append, "db.orders", await sink_identity(admin, "orders"), 2, "crashed", metadata
    )
    table = catalog.load_table("db.orders")
    table.append(pa.Table.from_pylist(orders(1000, 5), schema=ORDERS))

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert run.outcome == "ok", run.error
    kept = {snapshot.snapshot_id for snapshot in catalog.load_table("db.orders").snapshots()}
    assert marked in kept
    assert len(kept) == 2  # the protected marker and the head: the rest went
    # The walk still finds epoch 2 in the table: it is marked, not appended twice.
    assert await admin.checkpoint("orders", registration, 2) == 2
    assert table_order_ids(catalog.load_table("db.orders")) == [*range(20), *range(20, 30), *range(1000, 1005)]
    assert path in table_files(catalog.load_table("db.orders"))


async def test_compaction_rewrites_small_files_keeping_the_rows_and_the_markers(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    admin = without_commit_triggers(await admin_factory(compaction_min_files=3))
    await commit_epochs(admin, "orders", 6)
    table = catalog.load_table("db.orders")
    before = rows_digest(table)
    small = table_files(table)

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted, run.files_written) == ("ok", 6, 1), run.error
    table = catalog.load_table("db.orders")
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert len(table_files(table)) == 1 and not table_files(table) & small
    assert rows_digest(table) == before
    assert duckdb_rows(table.metadata_location, "order_id") == [
        (row["order_id"], row["customer"], row["amount"]) for row in orders(0, 60)
    ]
    # The sink goes on: its next epoch is appended once, its earlier ones are not taken for new.
    registration = await admin.register("orders", checkpointed_epoch=5)
    await admin.pre_commit("orders", registration, 6, 60)
    assert await admin.checkpoint("orders", registration, 6) == 6
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(70))


async def test_compaction_works_partition_by_partition(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    admin = without_commit_triggers(await admin_factory(compaction_min_files=2))
    registration = await admin.runtime.coordinator.register_writer(
        "orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes(), partition_by=("customer",)
    )
    location = registration.table_location
    epoch = 0
    for customer in ("a", "b"):
        for first in (0, 10, 20):
            rows = [
                {"order_id": first + i + (100 if customer == "b" else 0), "customer": customer, "amount": 1.0}
                for i in range(10)
            ]
            await pre_commit_paths(admin, registration, epoch, [write_parquet(location, rows)])
            assert await admin.checkpoint("orders", registration, epoch) == epoch
            epoch += 1
    before = rows_digest(catalog.load_table("db.orders"))

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted, run.files_written) == ("ok", 6, 2), run.error
    table = catalog.load_table("db.orders")
    assert rows_digest(table) == before
    partitions = sorted(
        tuple(row["partition"].values()) for row in table.inspect.data_files().select(["partition"]).to_pylist()
    )
    assert partitions == [("a",), ("b",)]


async def test_compaction_never_rewrites_a_file_of_an_epoch_that_is_not_committed(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """A PENDING epoch's file in the table (appended by a committer that died before marking it): the log
    still has to settle it, by that very file, so compaction leaves it as it is."""
    admin = without_commit_triggers(await admin_factory(compaction_min_files=2))
    await commit_epochs(admin, "orders", 3)
    registration = await admin.register("orders", checkpointed_epoch=2)
    pending = await admin.pre_commit("orders", registration, 3, 30)
    await asyncio.to_thread(
        admin.runtime.iceberg.append,
        "db.orders",
        await sink_identity(admin, "orders"),
        3,
        "crashed",
        epoch_metadata_of(database_url, 3),
    )

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted) == ("ok", 3), run.error
    assert pending in table_files(catalog.load_table("db.orders"))
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(40))


async def test_the_orphan_sweep_deletes_only_old_files_that_nothing_references_or_holds(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    admin = await admin_factory(orphan_grace_seconds=3600, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 2)
    registration = await admin.register("orders", checkpointed_epoch=1)
    location = registration.table_location
    two_hours_ago = time.time() - 7200

    def backdate(uri: str) -> str:
        os.utime(uri.removeprefix("file://"), (two_hours_ago, two_hours_ago))
        return uri

    killed_executor = backdate(write_parquet(location, orders(500, 3)))  # written, never pre-committed
    in_flight = write_parquet(location, orders(600, 3))  # a batch being written right now
    pending = backdate(await admin.pre_commit("orders", registration, 2, 20))  # held by a PENDING epoch
    stray_manifest = Path(location.removeprefix("file://"), "metadata", "stray-m0.avro")
    await asyncio.to_thread(stray_manifest.write_bytes, b"left by a failed commit")
    backdate(stray_manifest.as_uri())
    before = rows_digest(catalog.load_table("db.orders"))
    table = catalog.load_table("db.orders")
    referenced = (await asyncio.to_thread(tm.reachable, table.io, table.snapshots())).all()

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.swept, run.orphans_deleted) == ("ok", True, 2), run.error
    assert await asyncio.to_thread(existing, [killed_executor, stray_manifest.as_uri()]) == set()
    assert await asyncio.to_thread(existing, [in_flight, pending]) == {in_flight, pending}
    assert await asyncio.to_thread(existing, referenced) == referenced
    assert rows_digest(catalog.load_table("db.orders")) == before


async def test_superseded_metadata_files_are_deleted_by_the_sweep_alone(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """A table whose owners asked Iceberg to delete the metadata files its log drops at each commit (keeping 2):
    the coordinator's commits delete nothing outside its proof ("Deletion is proven, never assumed"); the files the
    log no longer names are orphans, which the sweep deletes once they are older than the grace."""
    admin = await admin_factory(orphan_grace_seconds=3600, **NO_COMPACTION)
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    with catalog.load_table("db.orders").transaction() as transaction:
        transaction.set_properties(
            {
                TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
                TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "2",
            }
        )
    metadata_directory = Path(registration.table_location.removeprefix("file://"), "metadata")
    written: set[str] = set()
    for epoch in range(1, 6):
        written |= await asyncio.to_thread(metadata_file_uris, metadata_directory)
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch
    table = catalog.load_table("db.orders")
    dropped = {tm.same_file(uri) for uri in written} - {tm.same_file(uri) for uri in tm.metadata_files(table)}
    assert len(dropped) >= 3
    assert await asyncio.to_thread(existing, sorted(dropped)) == dropped  # no commit deleted them
    assert table.metadata.properties[TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED] == "false"
    two_hours_ago = time.time() - 7200
    for uri in dropped:
        os.utime(uri.removeprefix("file://"), (two_hours_ago, two_hours_ago))

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.swept) == ("ok", True), run.error
    assert run.orphans_deleted >= len(dropped)
    assert await asyncio.to_thread(existing, sorted(dropped)) == set()
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(60))


async def test_commits_merge_manifests_so_that_their_number_stays_bounded(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    admin = await admin_factory(manifest_merge_min_count=4, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 12)
    table = catalog.load_table("db.orders")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert len(snapshot.manifests(table.io)) <= 4
    assert table_order_ids(table) == list(range(120))
    assert table.metadata.properties[TableProperties.MANIFEST_MERGE_ENABLED] == "true"


async def test_operators_see_set_and_trigger_a_sinks_maintenance(admin_factory: AdminFactory, catalog: Catalog) -> None:
    token = "maintenance-admin-token-Zq3vX9pL2mN8"
    admin = await admin_factory(admin_token=token, admin_read_requires_token=False)
    auth = {"Authorization": f"Bearer {token}"}
    await commit_epochs(admin, "orders", 4)

    shown = (await admin.get("/api/v1/sinks/orders/maintenance")).json()
    assert shown["overrides"] == {} and shown["runs"] == []
    assert shown["policy"]["snapshot_max_count"] == 500

    refused = await admin.put(
        "/api/v1/sinks/orders/maintenance", json={"overrides": {"snapshot_max_count": 0}}, headers=auth
    )
    assert refused.status_code == 422
    assert "snapshot_max_count" in refused.json()["error"]["message"]
    unknown = await admin.put("/api/v1/sinks/orders/maintenance", json={"overrides": {"nope": 1}}, headers=auth)
    assert unknown.status_code == 422 and "nope" in unknown.json()["error"]["message"]
    assert (await admin.get("/api/v1/sinks/orders/maintenance")).json()["overrides"] == {}

    overrides = {"snapshot_max_count": 2, "compaction_min_files": 2}
    changed = await admin.put("/api/v1/sinks/orders/maintenance", json={"overrides": overrides}, headers=auth)
    assert changed.status_code == 200, changed.text
    assert changed.json()["overrides"] == overrides
    assert changed.json()["policy"]["snapshot_max_count"] == 2

    assert (await admin.post("/api/v1/sinks/orders/maintenance/run")).status_code == 401
    run = await admin.post("/api/v1/sinks/orders/maintenance/run", headers=auth)
    assert run.status_code == 200, run.text
    body = run.json()
    assert (body["outcome"], body["trigger"], body["files_compacted"], body["swept"]) == ("ok", "operator", 4, True)
    assert body["snapshots_expired"] == 2  # of 4: expiration comes before the compaction adds its snapshot
    runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
    assert [item["id"] for item in runs] == [body["id"]]
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(40))

    cleared = await admin.put("/api/v1/sinks/orders/maintenance", json={"overrides": {}}, headers=auth)
    assert cleared.json()["overrides"] == {} and cleared.json()["policy"]["snapshot_max_count"] == 500


async def test_maintenance_runs_by_itself_when_due(admin_factory: AdminFactory, catalog: Catalog) -> None:
    admin = without_commit_triggers(await admin_factory(maintenance_interval_seconds=0.5, compaction_min_files=3))
    await commit_epochs(admin, "orders", 3)

    async def compacted() -> bool:
        runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
        return any(run["trigger"] == "schedule" and run["files_compacted"] == 3 for run in runs)

    await eventually(compacted, "a scheduled run compacting the table's three small files")
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(30))


async def test_a_pre_commit_refuses_a_file_older_than_the_orphan_grace(
    admin_factory: AdminFactory, database_url: str
) -> None:
    """The sweep may be deleting such a file: refusing it closes the race between the sweep and a pre-commit."""
    admin = await admin_factory(orphan_grace_seconds=3600)
    registration = await admin.register("orders")
    stale = write_parquet(registration.table_location, orders(0, 3))
    day_ago = time.time() - 86400
    os.utime(stale.removeprefix("file://"), (day_ago, day_ago))
    with pytest.raises(InvalidArgument) as refused:
        await pre_commit_paths(admin, registration, 0, [stale])
    assert "ORPHAN_GRACE_SECONDS" in refused.value.message
    assert (await admin.runtime.coordinator.sink_state("orders")).epochs == ()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("maintenance_interval_seconds", 1e15),
        ("orphan_sweep_interval_seconds", 1e300),
        ("snapshot_max_age_seconds", "1e309"),  # JSON's text of a number beyond a double: infinity
        ("orphan_grace_seconds", 1e18),
        ("snapshot_max_count", 2**63),
        ("orphan_max_files_per_run", 10**12),
    ],
)
async def test_an_override_the_code_cannot_live_with_is_refused(
    admin: AdminApp, catalog: Catalog, setting: str, value: float | str
) -> None:
    """Defect: 1e15 s was accepted (200) and then overflowed timedelta in the scheduler's due-check."""
    await commit_epochs(admin, "orders", 1)
    body = f'{{"overrides": {{"{setting}": {value}}}}}'
    refused = await admin.put(
        "/api/v1/sinks/orders/maintenance", content=body, headers={"Content-Type": "application/json"}
    )
    assert refused.status_code == 422, refused.text
    assert setting in refused.json()["error"]["message"]
    assert (await admin.get("/api/v1/sinks/orders/maintenance")).json()["overrides"] == {}


async def test_one_sinks_bad_maintenance_state_does_not_stop_the_others(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Defect: one sink's overrides that overflowed the due-check stopped the scheduled maintenance of every sink.
    Here the bad overrides reach the log behind the API's back (an older release, a hand edit)."""
    admin = without_commit_triggers(await admin_factory(maintenance_interval_seconds=0.5, compaction_min_files=3))
    await commit_epochs(admin, "broken", 1)
    query(
        database_url,
        "UPDATE sinks SET maintenance_overrides = %s WHERE name = 'broken'",
        '{"maintenance_interval_seconds": 1e15}',
    )
    registration = await admin.runtime.coordinator.register_writer(
        "orders", "db.other", -1, arrow_schema=ORDERS.serialize().to_pybytes()
    )
    for epoch in range(3):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch

    async def compacted() -> bool:
        runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
        return any(run["trigger"] == "schedule" and run["files_compacted"] == 3 for run in runs)

    await eventually(compacted, "the healthy sink's scheduled run")


async def test_compaction_leaves_alone_a_partition_with_equality_delete_files(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Another engine deleted a row with an equality delete file: compaction, which does not apply them (pyiceberg
    cannot read them), rewriting the partition's files without it would bring the row back."""
    admin = without_commit_triggers(await admin_factory(compaction_min_files=3, compaction_delete_files_min=1))
    await commit_epochs(admin, "orders", 4)
    await asyncio.to_thread(commit_equality_deletes, catalog.load_table("db.orders"), "order_id", [0])
    files = table_files(catalog.load_table("db.orders"))
    assert len(duckdb_rows(catalog.load_table("db.orders").metadata_location, "order_id")) == 39

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted) == ("ok", 0), run.error
    assert table_files(catalog.load_table("db.orders")) == files
    assert len(duckdb_rows(catalog.load_table("db.orders").metadata_location, "order_id")) == 39


async def test_compaction_rewrites_small_files_with_another_engines_position_deletes_applied(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Another engine deleted a row with a position delete file: the small files are compacted with it applied (the
    row stays deleted), and the delete file, whose data file is rewritten, is dropped in the same snapshot."""
    admin = without_commit_triggers(await admin_factory(compaction_min_files=3))
    await commit_epochs(admin, "orders", 4)
    table = catalog.load_table("db.orders")
    [first, *_] = sorted(cp.live_files(table).data, key=lambda data_file: data_file.file_path)
    await asyncio.to_thread(commit_position_deletes, table, first, [0])
    before = rows_digest(catalog.load_table("db.orders"))
    assert before[0] == 39

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted) == ("ok", 4), run.error
    table = catalog.load_table("db.orders")
    assert cp.live_files(table).deletes == []
    assert rows_digest(table) == before
    assert len(duckdb_rows(table.metadata_location, "order_id")) == 39


async def test_compaction_of_small_files_whose_every_row_is_deleted_writes_no_file(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Found by the key index's state machine (an unpartitioned table, every row of a group deleted): the rewrite
    handed pyiceberg's writer an empty table, which divides by its row count (ZeroDivisionError), so the run failed
    every time and the table kept its small files and delete files for good. A group with no row left is replaced by
    nothing: the files and the delete files that only they needed are dropped, and the rows read stay the same."""
    admin = without_commit_triggers(await admin_factory(compaction_min_files=3))
    await commit_epochs(admin, "orders", 3)
    table = catalog.load_table("db.orders")
    for data_file in cp.live_files(table).data:
        await asyncio.to_thread(commit_position_deletes, table, data_file, list(range(data_file.record_count)))
        table = catalog.load_table("db.orders")
    assert rows_digest(table)[0] == 0

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.files_compacted, run.files_written) == ("ok", 3, 0), run.error
    table = catalog.load_table("db.orders")
    assert cp.live_files(table).data == [] and cp.live_files(table).deletes == []
    assert rows_digest(table)[0] == 0
    assert duckdb_rows(table.metadata_location, "order_id") == []


async def test_a_tables_own_retention_properties_win_over_the_coordinators(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Security review: any table a sink names came under the coordinator's maintenance, which ignored the table's
    own history.expire.* properties and expired what its owners keep."""
    admin = await admin_factory(snapshot_max_count=1, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 2)
    with catalog.load_table("db.orders").transaction() as transaction:
        transaction.set_properties({tm.MIN_SNAPSHOTS_TO_KEEP: "4"})
    registration = await admin.register("orders", checkpointed_epoch=1)
    for epoch in range(2, 6):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch
    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert run.outcome == "ok", run.error
    assert await snapshots_expired(admin) == 2  # of 6 snapshots (by this run, or one a commit triggered)
    assert len(catalog.load_table("db.orders").snapshots()) == 4

    with catalog.load_table("db.orders").transaction() as transaction:
        transaction.set_properties({tm.GC_ENABLED: "false", tm.MIN_SNAPSHOTS_TO_KEEP: "1"})
    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert (run.outcome, run.snapshots_expired, run.orphans_deleted) == ("ok", 0, 0), run.error
    assert await snapshots_expired(admin) == 2
    assert len(catalog.load_table("db.orders").snapshots()) == 4
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(60))


async def test_a_commit_past_the_snapshot_bound_triggers_maintenance_whatever_the_clock(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """On-call review: SNAPSHOT_MAX_COUNT promised a bound, but maintenance ran only on its clock; a commit per epoch
    had 1,309 live snapshots at commit 1,750. A commit that takes a table a tenth past the bound asks for a run."""
    # The snapshot bound's runs come at once, whatever MAINTENANCE_RATE_LIMIT_SECONDS (60 s).
    admin = await admin_factory(snapshot_max_count=4, maintenance_interval_seconds=3600, **NO_COMPACTION)
    await commit_epochs(admin, "orders", 16)

    async def bounded() -> bool:
        runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
        snapshots = len(catalog.load_table("db.orders").snapshots())
        return snapshots <= 5 and any(run["trigger"] == "threshold" for run in runs)

    await eventually(bounded, "the table back within its bound by a run a commit triggered")
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(160))


async def test_a_commit_past_the_compaction_threshold_triggers_maintenance_whatever_the_clock(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    """Issue 27.7: only the snapshot bound asked for a run, so small files piled up between runs of the clock (at a
    commit a second, 300 in a partition between two runs at the default interval). A commit after which a compaction
    would merge files (COMPACTION_MIN_FILES small files of a partition, as the run counts them) asks for one."""
    admin = await admin_factory(
        compaction_min_files=3, maintenance_interval_seconds=3600, maintenance_rate_limit_seconds=0
    )
    await commit_epochs(admin, "orders", 3)

    async def compacted() -> bool:
        runs = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
        return any(run["trigger"] == "threshold" and run["files_compacted"] == 3 for run in runs)

    await eventually(compacted, "the small files compacted by a run a commit triggered")
    table = catalog.load_table("db.orders")
    assert len(table_files(table)) == 1
    assert table_order_ids(table) == list(range(30))


async def test_the_runs_commits_ask_for_come_once_per_rate_limit_and_merge_the_commits_between(
    admin_factory: AdminFactory, catalog: Catalog
) -> None:
    """Capacity: at a commit every 10 s of ten one-file epochs, every commit left small files past
    COMPACTION_MIN_FILES and asked for a run: a compaction snapshot after each append, and the coordinator's CPU for a
    run per commit. A run a commit asks for starts no sooner than MAINTENANCE_RATE_LIMIT_SECONDS after the sink's last
    run started (Iceberg's Flink TableMaintenance rateLimit), and one run then merges what the commits between left."""
    limit = 3.0
    admin = await admin_factory(
        compaction_min_files=3, maintenance_interval_seconds=3600, maintenance_rate_limit_seconds=limit
    )

    runs: list[dict[str, Any]] = []

    async def threshold_runs(count: int) -> bool:
        nonlocal runs
        listed = (await admin.get("/api/v1/sinks/orders/maintenance")).json()["runs"]
        runs = [run for run in listed if run["trigger"] == "threshold" and run["finished_at"] is not None]
        runs.sort(key=lambda run: datetime.fromisoformat(run["started_at"]))
        return len(runs) >= count

    await commit_epochs(admin, "orders", 3)
    await eventually(functools.partial(threshold_runs, 1), "the run the third commit asked for")
    [first] = runs
    assert first["files_compacted"] == 3
    registration = await admin.register("orders", checkpointed_epoch=2)
    for epoch in range(3, 9):  # each commit leaves small files a compaction would merge
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch
    await eventually(functools.partial(threshold_runs, 2), "the run the next commits asked for")
    first_again, second = runs
    assert first_again["started_at"] == first["started_at"]
    apart = datetime.fromisoformat(second["started_at"]) - datetime.fromisoformat(first["started_at"])
    assert apart.total_seconds() >= limit - 0.01, apart
    assert second["files_compacted"] >= 6  # the six commits' files, in one run
    table = catalog.load_table("db.orders")
    assert len(table_files(table)) == 1
    assert table_order_ids(table) == list(range(90))


async def test_sinks_with_no_run_within_the_rate_limit_spread_their_runs_over_it(admin_factory: AdminFactory) -> None:
    """Sinks started together (a deployment, a restart, the capacity bench) at the same phase had their rate-limited
    runs in the same seconds of each limit: a hundred sinks' compactions of a minute's files at once, their writers
    1.16 s behind (p99). A sink with no run within the limit has its run at a random moment within it; one with a run
    started has it one limit after that start."""
    admin = without_commit_triggers(await admin_factory(maintenance_interval_seconds=3600))
    maintainer = admin.runtime.maintainer
    loop = asyncio.get_running_loop()
    limit = 600.0
    before = loop.time()
    for sink_id in range(1_000, 1_020):
        maintainer.want(sink_id, rate_limit=limit)
    times = [maintainer._wanted[sink_id] - before for sink_id in range(1_000, 1_020)]
    assert all(0 <= time <= limit + (loop.time() - before) for time in times), times
    assert max(times) - min(times) > limit / 4, times  # 20 uniform draws: false with a chance of about 1e-10
    maintainer._not_before[2_000] = before + 42.0  # a run of the sink started 558 s ago
    maintainer.want(2_000, rate_limit=limit)
    assert maintainer._wanted[2_000] == before + 42.0
    maintainer.want(2_000)  # past the snapshot bound: at once
    assert maintainer._wanted[2_000] <= loop.time()


async def test_the_runs_commits_ask_for_start_without_a_look_through_every_sink(
    admin_factory: AdminFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity defect: each run a commit asked for woke the schedule, which read every sink and the start of its last
    run (to find the due ones) before starting it. At N busy sinks a commit interval brings N runs asked for, so the
    schedule read N * N rows per interval: four times the work at twice the sinks. The look for due sinks comes on the
    clock (POLL_INTERVAL_SECONDS) alone; a run asked for starts at once."""
    admin = without_commit_triggers(await admin_factory(poll_interval_seconds=600, maintenance_rate_limit_seconds=0))
    maintainer = admin.runtime.maintainer
    looks = 0
    look = maintenance_log.maintenance_candidates

    async def counted_look(session: AsyncSession) -> Sequence[tuple[Sink, datetime | None, datetime | None]]:
        nonlocal looks
        looks += 1
        return await look(session)

    monkeypatch.setattr(maintenance_log, "maintenance_candidates", counted_look)
    names = [f"busy{number}" for number in range(4)]
    for name in names:
        await commit_epochs(admin, name, 1)
    sink_ids = [sink_id_of(database_url, name) for name in names]
    for rounds in range(1, 4):
        for sink_id in sink_ids:
            maintainer.want(sink_id)

        async def ran(expected: int = rounds * len(sink_ids)) -> bool:
            [(finished,)] = query(
                database_url,
                "SELECT count(*) FROM maintenance_runs WHERE trigger = 'threshold' AND finished_at IS NOT NULL",
            )
            return finished == expected and not maintainer._runs

        await eventually(ran, f"round {rounds} of the runs asked for")
    assert looks <= 1  # the schedule's first look, if it came after the counting began


async def test_a_commit_asks_for_a_run_only_when_a_compaction_would_merge_files(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's check counts the small files as the run does: below COMPACTION_MIN_FILES, or in a partition with
    another engine's equality delete files (which compaction leaves alone), a commit asks for no run (it would compact
    nothing, after every commit)."""
    admin = await admin_factory(compaction_min_files=3, maintenance_interval_seconds=3600)
    commits_checked = await commits_wanted(admin, monkeypatch)
    await commit_epochs(admin, "orders", 2)
    assert await commits_checked() == []
    registration = await admin.register("orders", checkpointed_epoch=1)
    await admin.pre_commit("orders", registration, 2, 20)
    assert await admin.checkpoint("orders", registration, 2) == 2
    assert await commits_checked() == [sink_id_of(database_url, "orders")]

    (await commits_checked()).clear()
    await asyncio.to_thread(commit_equality_deletes, catalog.load_table("db.orders"), "order_id", [0])
    for epoch in (3, 4):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, epoch) == epoch
    assert await commits_checked() == []


async def test_sinks_are_maintained_side_by_side_and_falling_behind_shows(
    admin_factory: AdminFactory, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On-call review: one serial loop per process (0.19 s per tiny table) took 285 s of a 300 s interval at 1,500
    sinks, with nothing saying it fell behind."""
    admin = await admin_factory(maintenance_interval_seconds=0.5, maintenance_concurrency=2, **NO_COMPACTION)
    for sink in ("first", "second", "third"):
        registration = await admin.runtime.coordinator.register_writer(
            sink, f"db.{sink}", -1, arrow_schema=ORDERS.serialize().to_pybytes()
        )
        await admin.pre_commit(sink, registration, 0, 0)
        assert await admin.checkpoint(sink, registration, 0) == 0
    maintainer = admin.runtime.maintainer
    run = maintainer._run
    running: set[int] = set()
    together = asyncio.Event()

    async def slow_run(sink_id: int, trigger: str, lock: Any) -> Any:
        running.add(sink_id)
        if len(running) >= 2:
            together.set()
        await asyncio.sleep(1.5)  # a slow table
        running.discard(sink_id)
        return await run(sink_id, trigger, lock)

    monkeypatch.setattr(maintainer, "_run", slow_run)
    async with asyncio.timeout(15):
        await together.wait()

    async def behind() -> bool:
        return metrics.MAINTENANCE_BEHIND_SECONDS._value.get() > 0  # type: ignore[attr-defined,no-any-return]

    await eventually(behind, "the gauge of how far maintenance is behind")


async def test_a_hung_maintenance_run_holds_back_its_own_sink_alone_and_shows_as_falling_behind(
    admin_factory: AdminFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule waited for every run of a round before it looked again: one run that hung (a catalog call
    without an answer) stopped every sink's maintenance in the process, and froze the gauge of how far it was
    behind at its last value."""
    admin = await admin_factory(maintenance_interval_seconds=0.5, maintenance_concurrency=2, **NO_COMPACTION)
    for sink in ("hung", "second", "third"):
        await admin.runtime.coordinator.register_writer(
            sink, f"db.{sink}", -1, arrow_schema=ORDERS.serialize().to_pybytes()
        )
    hung = sink_id_of(database_url, "hung")
    maintainer = admin.runtime.maintainer
    run = maintainer._run
    finished: dict[int, int] = {}
    never = asyncio.Event()

    async def hanging_or_counted(sink_id: int, trigger: str, lock: Any) -> Any:
        if sink_id == hung:
            await never.wait()
        done = await run(sink_id, trigger, lock)
        finished[sink_id] = finished.get(sink_id, 0) + 1
        return done

    monkeypatch.setattr(maintainer, "_run", hanging_or_counted)

    async def others_maintained_again_and_behind_shows() -> bool:
        behind = metrics.MAINTENANCE_BEHIND_SECONDS._value.get()  # type: ignore[attr-defined]
        return len(finished) == 2 and min(finished.values()) >= 3 and behind > 1.0

    await eventually(others_maintained_again_and_behind_shows, "the other sinks maintained run after run")
    assert hung not in finished


# A keyed sink (issue 29): its epochs are committed as row deltas, each update or delete a position delete file.
KEYED_SINK = "keyed"
KEYED_TABLE = "db.keyed"
# Every snapshot kept (the tests that expire set their own bounds).
KEYED_NO_EXPIRY: dict[str, Any] = {"snapshot_max_count": 1_000_000}
# Four epochs of upserts, updates and deletes of overlapping keys: the last three each add a position delete file.
KEYED_EPOCHS: list[list[Operation]] = [
    [Upsert(key, "eu", "a") for key in range(20)],
    [*(Upsert(key, "us", "b") for key in range(5)), Delete(5), Delete(6), Delete(7)],
    [Upsert(3, "eu", "c"), *(Upsert(key, "us", "c") for key in range(10, 13)), Delete(0), Delete(99)],
    [Upsert(30, "eu", "d"), Upsert(4, "us", "d"), Delete(19)],
]


async def register_keyed(admin: AdminApp) -> Registration:
    return await admin.runtime.coordinator.register_writer(
        KEYED_SINK, KEYED_TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=("id",)
    )


async def commit_keyed(
    admin: AdminApp, registration: Registration, epoch: int, operations: list[Operation], model: dict[int, Row]
) -> None:
    """One keyed epoch pre-committed and committed through the coordinator, and applied to the model."""
    paths, keys = epoch_files(registration.table_location, operations)
    answer = await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(KEYED_SINK, epoch, registration.writer_term, paths, key_paths=keys)
    )
    assert answer.outcome is PreCommitOutcome.PERSISTED, answer
    assert await admin.checkpoint(KEYED_SINK, registration, epoch) == epoch
    apply(model, operations)


async def keyed_sink_with_epochs(admin: AdminApp) -> tuple[Registration, dict[int, Row]]:
    """The keyed sink registered and KEYED_EPOCHS committed; its registration, and the model its table holds."""
    registration = await register_keyed(admin)
    model: dict[int, Row] = {}
    for epoch, operations in enumerate(KEYED_EPOCHS):
        await commit_keyed(admin, registration, epoch, operations, model)
    return registration, model


def backdate_tree(location: str, seconds: float) -> None:
    """Every file under the location modified `seconds` ago (older than an orphan sweep's grace)."""
    then = time.time() - seconds
    for path in Path(location.removeprefix("file://")).rglob("*"):
        os.utime(path, (then, then))


def delete_file_paths(table: Table) -> set[str]:
    return {delete_file.file_path for delete_file in cp.live_files(table).deletes}


async def test_compaction_applies_a_keyed_tables_position_deletes_and_the_key_index_follows_it(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Issue 29.5: a keyed table's data files are rewritten with their position deletes applied and the delete files
    dropped in the same `replace` snapshot; both readers see the model, the key index catches up with the compaction
    (not rebuilt) and answers as the scan, and the next epoch's updates land on the rewritten files."""
    admin = without_commit_triggers(
        await admin_factory(compaction_min_files=1_000_000, compaction_deleted_rows_ratio=0.01, **KEYED_NO_EXPIRY)
    )
    registration, model = await keyed_sink_with_epochs(admin)
    table = catalog.load_table(KEYED_TABLE)
    assert len(delete_file_paths(table)) == 3
    data_files = len(cp.live_files(table).data)
    [(built_at,)] = query(database_url, "SELECT built_at FROM key_index_tables")

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, KEYED_SINK))

    assert (run.outcome, run.files_compacted, run.files_written) == ("ok", data_files, 1), run.error
    table = catalog.load_table(KEYED_TABLE)
    assert delete_file_paths(table) == set()
    assert_table_holds(table, model)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert (snapshot.summary.operation.value, snapshot.summary[cp.COMPACTION_MARKER]) == ("replace", "compaction")
    assert snapshot.summary["total-position-deletes"] == "0"
    await assert_answers_as_the_scan(admin.runtime.committer.keyed.key_index, table, [(key,) for key in range(40)])
    assert query(database_url, "SELECT snapshot_id, built_at FROM key_index_tables") == [
        (snapshot.snapshot_id, built_at)
    ]

    await commit_keyed(admin, registration, 4, [Upsert(1, "eu", "e"), Delete(2), Upsert(40, "us", "e")], model)
    assert_table_holds(catalog.load_table(KEYED_TABLE), model)


async def test_a_keyed_tables_delete_files_are_merged_and_the_key_index_and_verifier_follow(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Issue 29.5: a partition with COMPACTION_DELETE_FILES_MIN position delete files has them merged into one by a
    maintenance run, no data file rewritten (none has COMPACTION_DELETED_ROWS_RATIO of its rows deleted): both
    readers see the model, the key index catches up without a rebuild, the verifier finds the rows kept, and the next
    epochs' updates and deletes land."""
    admin = without_commit_triggers(
        await admin_factory(
            compaction_min_files=1_000_000,
            compaction_delete_files_min=2,
            compaction_deleted_rows_ratio=1.0,
            **KEYED_NO_EXPIRY,
        )
    )
    registration, model = await keyed_sink_with_epochs(admin)
    table = catalog.load_table(KEYED_TABLE)
    data_files = {data_file.file_path for data_file in cp.live_files(table).data}
    before = delete_file_paths(table)
    [(built_at,)] = query(database_url, "SELECT built_at FROM key_index_tables")

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, KEYED_SINK))

    assert (run.outcome, run.files_compacted, run.files_written) == ("ok", 0, 0), run.error
    table = catalog.load_table(KEYED_TABLE)
    assert {data_file.file_path for data_file in cp.live_files(table).data} == data_files
    after = delete_file_paths(table)
    assert after.isdisjoint(before) and len(after) < len(before)
    assert run.delete_files_merged == len(before)
    [shown] = (await admin.get(f"/api/v1/sinks/{KEYED_SINK}/maintenance")).json()["runs"]
    assert shown["delete_files_merged"] == len(before)
    assert_table_holds(table, model)
    await assert_answers_as_the_scan(admin.runtime.committer.keyed.key_index, table, [(key,) for key in range(40)])
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert query(database_url, "SELECT snapshot_id, built_at FROM key_index_tables") == [
        (snapshot.snapshot_id, built_at)
    ]
    verification = await Verifier(admin.runtime.database, admin.runtime.iceberg).verify(KEYED_SINK)
    assert verification.ok, verification.faults

    await commit_keyed(admin, registration, 4, [Upsert(1, "eu", "e"), Delete(2), Upsert(40, "us", "e")], model)
    await commit_keyed(admin, registration, 5, [Upsert(3, "eu", "f"), Delete(4)], model)
    assert_table_holds(catalog.load_table(KEYED_TABLE), model)
    assert query(database_url, "SELECT built_at FROM key_index_tables") == [(built_at,)]


async def test_a_commit_that_leaves_as_many_delete_files_as_the_bound_asks_for_a_run(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29.5: a keyed commit's position delete files slow every reader down until compaction applies them; a
    commit that leaves COMPACTION_DELETE_FILES_MIN of them in a partition asks for a run, whatever the clock and
    however few small files there are."""
    admin = await admin_factory(
        compaction_min_files=1_000_000,
        compaction_delete_files_min=3,
        compaction_deleted_rows_ratio=1.0,
        maintenance_interval_seconds=3600,
    )
    wanted = await commits_wanted(admin, monkeypatch)
    registration = await register_keyed(admin)
    model: dict[int, Row] = {}
    asked = []
    for epoch, operations in enumerate(KEYED_EPOCHS):
        await commit_keyed(admin, registration, epoch, operations, model)
        asked.append(len(await wanted()))
    assert asked == [0, 0, 0, 1]
    assert len(delete_file_paths(catalog.load_table(KEYED_TABLE))) == 3


async def test_a_commit_that_deletes_the_bounds_share_of_the_rows_asks_for_a_run(
    admin_factory: AdminFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29.5: a partition whose delete files delete COMPACTION_DELETED_ROWS_RATIO of its data files' rows is
    read at that much waste; the commit that takes it there asks for a run, however few its delete files."""
    admin = await admin_factory(
        compaction_min_files=1_000_000,
        compaction_delete_files_min=1_000_000,
        compaction_deleted_rows_ratio=0.5,
        maintenance_interval_seconds=3600,
    )
    wanted = await commits_wanted(admin, monkeypatch)
    registration = await register_keyed(admin)
    model: dict[int, Row] = {}
    epochs: list[list[Operation]] = [
        [Upsert(key, "eu", "a") for key in range(10)],
        [Delete(0), Delete(1)],  # 2 of 10 rows deleted
        [Delete(2), Delete(3), Delete(4)],  # 5 of 10
    ]
    asked = []
    for epoch, operations in enumerate(epochs):
        await commit_keyed(admin, registration, epoch, operations, model)
        asked.append(len(await wanted()))
    assert asked == [0, 0, 1]


async def commits_wanted(admin: AdminApp, monkeypatch: pytest.MonkeyPatch) -> Callable[[], Awaitable[list[int]]]:
    """The sinks whose runs the commits asked for (Maintainer.want), once the checks of the commits so far are done."""
    maintainer = admin.runtime.maintainer
    wanted: list[int] = []

    def want(sink_id: int, at: float | None = None, *, rate_limit: float = 0.0) -> None:
        wanted.append(sink_id)

    monkeypatch.setattr(maintainer, "want", want)

    async def checked() -> list[int]:
        await asyncio.gather(*maintainer._compaction_checks.values())
        return wanted

    return checked


async def test_the_sweep_keeps_a_keyed_tables_delete_files_and_expiry_deletes_them_once_nothing_reaches_them(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Issue 29.5: a delete file a snapshot references is never an orphan, however old; expiring the snapshot that
    added it leaves it while a snapshot kept still reaches it, and deletes it once none does (after the compaction
    that dropped it)."""
    token = "keyed-maintenance-token-Zq3vX9pL2mN8"
    admin = without_commit_triggers(
        await admin_factory(
            admin_token=token,
            orphan_grace_seconds=3600,
            orphan_sweep_interval_seconds=1,
            compaction_min_files=1_000_000,
            compaction_delete_files_min=1_000_000,
            compaction_deleted_rows_ratio=1.0,
            **KEYED_NO_EXPIRY,
        )
    )
    registration, model = await keyed_sink_with_epochs(admin)
    table = catalog.load_table(KEYED_TABLE)
    deletes = delete_file_paths(table)
    assert len(deletes) == 3
    await asyncio.to_thread(backdate_tree, registration.table_location, 7200)
    sink_id = sink_id_of(database_url, KEYED_SINK)

    swept = await admin.runtime.maintainer.run_now(sink_id)

    assert (swept.outcome, swept.swept, swept.orphans_deleted) == ("ok", True, 0), swept.error
    assert await asyncio.to_thread(existing, deletes) == deletes
    assert missing_reachable_files(catalog.load_table(KEYED_TABLE)) == []
    assert_table_holds(catalog.load_table(KEYED_TABLE), model)

    # Every snapshot but the newest expired (each added a delete file but the first); then compaction applies and
    # drops them.
    auth = {"Authorization": f"Bearer {token}"}
    overrides = {"snapshot_max_count": 1, "compaction_deleted_rows_ratio": 0.01}
    changed = await admin.put(f"/api/v1/sinks/{KEYED_SINK}/maintenance", json={"overrides": overrides}, headers=auth)
    assert changed.status_code == 200, changed.text
    compacted = await admin.runtime.maintainer.run_now(sink_id)

    assert (compacted.outcome, compacted.snapshots_expired) == ("ok", 3), compacted.error
    assert compacted.files_compacted > 0
    table = catalog.load_table(KEYED_TABLE)
    assert delete_file_paths(table) == set()
    assert await asyncio.to_thread(existing, deletes) == deletes  # the snapshot kept before the compaction has them
    assert missing_reachable_files(table) == []

    expired = await admin.runtime.maintainer.run_now(sink_id)

    assert (expired.outcome, expired.snapshots_expired) == ("ok", 1), expired.error
    assert await asyncio.to_thread(existing, deletes) == set()
    table = catalog.load_table(KEYED_TABLE)
    assert missing_reachable_files(table) == []
    assert_table_holds(table, model)
