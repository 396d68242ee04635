"""The one place that deletes files (coordinator_service.engine.file_deletion) proves each one garbage as it deletes it.

Whatever asks (a writer's aborted epoch, the orphan sweep, an interrupted deletion), a file is deleted only when it
lies under the data (or metadata) directory of a table it belongs to, reached through no link and inside no other
table, no metadata of that table reaches it, and the log marked it with nothing claiming it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service import metrics
from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.engine.file_deletion import DroppedTable, FileDeleter
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.log import commit_lock
from coordinator_service.log.path_claims import CleanupDelays, MarkRule
from coordinator_service.tables.precommit_files import FileFacts
from coordinator_service.tables.table_maintenance import referenced_files
from tests.fixtures.admin import AdminApp, AdminFactory, commit_lock_held, eventually, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders, table_files, table_order_ids, write_parquet
from tests.fixtures.postgres import query
from tests.fixtures.reachable_files import missing_reachable_files

TWO_HOURS = 7200.0
NO_COMPACTION = {"compaction_min_files": 1_000_000}


def exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


def backdate_tree(directory: Path, seconds: float) -> None:
    then = time.time() - seconds
    for root, _, names in os.walk(directory):
        for name in names:
            os.utime(os.path.join(root, name), (then, then), follow_symlinks=False)


def refused_count(sink: str) -> float:
    return metrics.DELETIONS_REFUSED.labels(sink)._value.get()  # type: ignore[attr-defined,no-any-return]


async def committed_sink(admin: AdminApp, sink: str = "orders", table: str = "db.orders", epochs: int = 2) -> str:
    registration = await admin.runtime.coordinator.register_writer(
        sink, table, -1, arrow_schema=ORDERS.serialize().to_pybytes()
    )
    for epoch in range(epochs):
        await admin.pre_commit(sink, registration, epoch, epoch * 10)
        assert await admin.checkpoint(sink, registration, epoch) == epoch
    return registration.table_location


async def test_a_writer_cannot_have_the_tables_metadata_file_deleted(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """Security review: a writer pre-committed the table's current metadata.json (with a footer, so it was never
    read), had the epoch aborted, and the cleaner deleted it: the table could not be loaded any more."""
    # A sink name of its own: the sink series are the process's, and a runtime of an earlier test that knew a sink
    # "orders" in its own database could take this one's series out when it next looks at the log.
    sink = "guarded-metadata"
    await committed_sink(admin, sink)
    table = catalog.load_table("db.orders")
    metadata = table.metadata_location
    # A footer sent with the path: the coordinator never reads the file, so it need not be Parquet.
    footer = pa.BufferOutputStream()
    pq.read_metadata(next(iter(table_files(table))).removeprefix("file://")).write_metadata_file(footer)
    size = await asyncio.to_thread(os.path.getsize, metadata.removeprefix("file://"))
    facts = FileFacts(footer.getvalue().to_pybytes(), size)
    term = (await admin.runtime.coordinator.sink_state(sink)).writer_term
    with pytest.raises(InvalidArgument, match="outside the table's data directory"):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(sink, 2, term, (metadata,), file_facts={metadata: facts})
        )

    # What a release before this one may have left in the log: the path given up, due for the cleaner.
    query(
        database_url,
        "INSERT INTO epoch_files (path, sink_id, discarded_at) VALUES (%s, %s, now() - interval '1 day')",
        metadata,
        sink_id_of(database_url, sink),
    )
    before = refused_count(sink)

    async def refused() -> bool:
        # The runtime's own cleaner, or maintenance after the commits, may hold the sink's lock at this moment: then
        # this pass leaves the sink to the next (CI saw it: the claim untouched, the counter unmoved).
        await admin.runtime.cleaner.clean()
        return query(database_url, "SELECT count(*) FROM epoch_files WHERE path = %s", metadata) == [(0,)]

    await eventually(refused, "the claim on the metadata file refused and forgotten by a cleaner")
    assert await asyncio.to_thread(exists, metadata)
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))
    assert refused_count(sink) == before + 1


async def test_the_sweep_never_follows_a_link_into_another_tables_files(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """Security review: a symbolic link under one table's data directory to another's; the first table's sweep
    followed it and deleted the other table's live data files."""
    admin = await admin_factory(orphan_grace_seconds=3600, **NO_COMPACTION)
    orders = Path((await committed_sink(admin, "orders", "db.orders")).removeprefix("file://"))
    other = Path((await committed_sink(admin, "other", "db.other")).removeprefix("file://"))
    (orders / "data" / "link").symlink_to(other / "data", target_is_directory=True)
    (orders / "data" / "file-link.parquet").symlink_to(next((other / "data").iterdir()))
    await asyncio.to_thread(backdate_tree, orders, TWO_HOURS)
    await asyncio.to_thread(backdate_tree, other, TWO_HOURS)

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert (run.outcome, run.swept, run.orphans_deleted) == ("ok", True, 0), run.error
    assert table_order_ids(catalog.load_table("db.other")) == list(range(20))
    assert missing_reachable_files(catalog.load_table("db.other")) == []
    assert (orders / "data" / "file-link.parquet").is_symlink()


async def test_the_sweep_never_walks_into_a_table_nested_in_its_location(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """A table whose location lies inside another's data directory (a route value with a '/', a nested namespace
    on a REST catalog, a location set by hand): the outer table's sweep deleted every file of the inner one."""
    admin = await admin_factory(orphan_grace_seconds=3600, **NO_COMPACTION)
    location = await committed_sink(admin)
    nested = catalog.create_table("db.nested", schema=ORDERS, location=f"{location}/data/nested")
    nested.append(pa.Table.from_pylist(orders(500, 5), schema=ORDERS))
    await asyncio.to_thread(backdate_tree, Path(location.removeprefix("file://")), TWO_HOURS)
    stray = write_parquet(location, orders(900, 3))  # a real orphan of db.orders, swept
    await asyncio.to_thread(os.utime, stray.removeprefix("file://"), (time.time() - TWO_HOURS,) * 2)

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.orphans_deleted) == ("ok", 1), run.error
    assert not await asyncio.to_thread(exists, stray)
    assert table_order_ids(catalog.load_table("db.nested")) == list(range(500, 505))
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


async def test_an_interrupted_deletion_is_finished_by_the_cleaner_and_its_mark_expires(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """A process died between marking paths and deleting them: the marks keep every claim away until the sink's
    cleaner proves and deletes the files; then each mark stays ORPHAN_GRACE_SECONDS, and goes."""
    admin = await admin_factory(orphan_grace_seconds=3600, **NO_COMPACTION)
    location = await committed_sink(admin)
    orphan = write_parquet(location, orders(900, 3), name="task-7-attempt-0")
    sink_id = sink_id_of(database_url, "orders")
    registration = await admin.register("orders", checkpointed_epoch=1)
    # The process that marked it is gone, but its commit lock not yet: nobody finishes the deletion meanwhile.
    async with commit_lock_held(database_url, sink_id):
        query(
            database_url, "INSERT INTO epoch_files (path, sink_id, deleting_at) VALUES (%s, %s, now())", orphan, sink_id
        )
        with pytest.raises(InvalidArgument, match="is being deleted"):
            await admin.runtime.coordinator.pre_commit(
                PreCommitRequest("orders", 2, registration.writer_term, (orphan,))
            )

    async def deleted() -> bool:
        # The file goes first, then its mark records the deletion: the test waits for both.
        [(recorded,)] = query(database_url, "SELECT deleted_at IS NOT NULL FROM epoch_files WHERE path = %s", orphan)
        return recorded is True and not await asyncio.to_thread(exists, orphan)

    await eventually(deleted, "the cleaner finished the interrupted deletion and recorded it")

    query(database_url, "UPDATE epoch_files SET deleted_at = now() - interval '2 hours' WHERE path = %s", orphan)

    async def forgotten() -> bool:
        # The runtime's own cleaner may hold the sink's lock at this moment: then this pass leaves it the work.
        await admin.runtime.cleaner.clean()
        return query(database_url, "SELECT count(*) FROM epoch_files WHERE path = %s", orphan) == [(0,)]

    await eventually(forgotten, "the expired mark forgotten by the cleaner")
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


async def test_a_given_up_path_the_table_references_is_kept(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """The log gave a path up (an older numbering's, say) while the table references it: it stays, counted as an
    anomaly, and the log stops deciding it."""
    sink = "given-up-kept"  # a name of its own: the sink series are the process's (see the metadata file's test)
    await committed_sink(admin, sink)
    [referenced, *_] = sorted(table_files(catalog.load_table("db.orders")))
    query(
        database_url,
        "UPDATE epoch_files SET epoch = NULL, attempt = NULL, discarded_at = now() WHERE path = %s",
        referenced,
    )

    def anomalies() -> float:
        return metrics.COMMIT_ANOMALIES.labels(sink, "given_up_files_in_table")._value.get()  # type: ignore[attr-defined, no-any-return]

    async def settled() -> bool:
        # The runtime's own cleaner may hold the sink's lock at this moment: then this pass leaves it the work, and
        # counts the anomaly once its transaction that forgets the path has committed (so the count is awaited too).
        await admin.runtime.cleaner.clean()
        forgotten = query(database_url, "SELECT count(*) FROM epoch_files WHERE path = %s", referenced) == [(0,)]
        return forgotten and anomalies() >= 1

    await eventually(settled, "the given-up path settled by a cleaner, and counted as an anomaly")
    assert await asyncio.to_thread(exists, referenced)
    assert anomalies() >= 1
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(20))


async def test_a_dropped_tables_files_are_proven_against_the_catalog_and_the_log(
    admin_factory: AdminFactory, catalog: Catalog, database_url: str
) -> None:
    """The files a dropped table reached: a table created again under its name (at the same location) is judged as
    it is now, so a file it references stays; a file another sink's COMMITTED epoch holds is never marked; the rest,
    under the dropped table's directories, is deleted."""
    admin = await admin_factory(**NO_COMPACTION)
    await committed_sink(admin, "orders", "db.orders")
    await committed_sink(admin, "other", "db.other")
    orders_id, other_id = sink_id_of(database_url, "orders"), sink_id_of(database_url, "other")
    before_drop = catalog.load_table("db.orders")
    reached = sorted(referenced_files(before_drop))
    adopted, *_ = sorted(table_files(before_drop))
    manifest = next(path for path in reached if path.endswith(".avro"))
    # What the log holds when another sink's epoch committed the manifest's path (a table it wrote references it).
    query(database_url, "UPDATE epoch_files SET path = %s WHERE sink_id = %s AND epoch = 0", manifest, other_id)
    catalog.drop_table("db.orders")
    again = catalog.create_table("db.orders", schema=ORDERS)
    assert again.location() == before_drop.location()
    again.add_files([adopted])
    deleter = FileDeleter(admin.runtime.database, admin.runtime.iceberg, CleanupDelays(0.0, 0.0))

    async with commit_lock.holding(admin.runtime.database, orders_id, 5.0, "test") as lock:
        done = await deleter.delete(
            "orders",
            orders_id,
            lock,
            [DroppedTable("db.orders", before_drop)],
            reached,
            MarkRule.DROPPED,
            metadata_files=True,
        )

    assert (done.referenced, done.claimed, done.refused) == ([adopted], [manifest], {})
    assert sorted(done.deleted) == sorted(set(reached) - {adopted, manifest})
    assert not any([await asyncio.to_thread(exists, path) for path in done.deleted])
    adopted_ids = pq.read_table(adopted.removeprefix("file://")).column("order_id").to_pylist()
    assert table_order_ids(catalog.load_table("db.orders")) == sorted(adopted_ids)
    assert table_order_ids(catalog.load_table("db.other")) == list(range(20))
