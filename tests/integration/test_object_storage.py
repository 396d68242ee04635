"""The coordinator and the writer's tasks on S3-compatible storage: SeaweedFS (a real S3 server) with a SQL
catalog and with its Iceberg REST catalog, and Glue on moto's server (or all of them on a real endpoint)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.io import InputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.views import Registration
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.file_listing import listed_files, written_by
from coordinator_service.tables.precommit_files import FileChecks, FileFacts
from sink_coordinator_demo.object_store import ObjectStore
from spark_writer.sink.parquet_writer import DataFileTarget, delete_files, task_writer
from spark_writer.sink.storage import Storage
from tests.fixtures.admin import AdminApp, AdminFactory, eventually, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders
from tests.fixtures.object_store import exists, write_parquet_to


def order_ids(catalog: Catalog, table: str) -> list[int]:
    loaded = catalog.load_table(table)
    return sorted(loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())


async def pre_commit(admin: AdminApp, store: ObjectStore, registration: Registration, epoch: int, first: int) -> str:
    uri = await asyncio.to_thread(write_parquet_to, store, registration.table_location, orders(first, 10), ORDERS)
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=epoch, writer_term=registration.writer_term, paths=(uri,))
    )
    return uri


@pytest.fixture(params=["sql", "rest", "glue"])
def catalog_on_store(
    request: pytest.FixtureRequest, s3_warehouse: str, database_url: str
) -> tuple[str, ObjectStore, dict[str, str], str]:
    """A catalog kind, the store its tables live on, its properties and a namespace of the test's own: the SQL and
    REST catalogs on the S3 server, Glue on moto's. The REST and Glue catalogs live as long as the session, so a
    table name used by two tests would be one table."""
    kind = str(request.param)
    store: ObjectStore = request.getfixturevalue("glue_store" if kind == "glue" else "object_store")
    if kind == "rest" and not store.rest_uri:
        pytest.skip("no REST catalog beside the S3 endpoint: set SINK_TEST_REST_URI and SINK_TEST_REST_WAREHOUSE")
    own = s3_warehouse.rsplit("/", 1)[-1]
    return kind, store, store.catalog_properties(kind, store.uri("warehouse", own), database_url), f"db_{kind}_{own}"


async def test_create_append_recover_evolve_and_clean_up_on_object_storage(
    catalog_on_store: tuple[str, ObjectStore, dict[str, str], str], admin_factory: AdminFactory, database_url: str
) -> None:
    kind, object_store, properties, namespace = catalog_on_store
    admin = await admin_factory(catalog_name=f"s3-{kind}", catalog=properties, recovery_files_keep_seconds=0)
    catalog = load_catalog(f"s3-{kind}", **properties)
    table = f"{namespace}.orders"
    first = await admin.register("orders", table=table)
    assert first.table_location.startswith("s3://")
    for epoch in range(2):
        await pre_commit(admin, object_store, first, epoch, epoch * 10)
    assert await admin.checkpoint("orders", first, 1) == 1
    stranded = await pre_commit(admin, object_store, first, 2, 20)

    second = await admin.runtime.coordinator.register_writer(
        "orders", table, 1, arrow_schema=ORDERS.serialize().to_pybytes()
    )
    assert second.aborted_epochs == (2,)
    await pre_commit(admin, object_store, second, 2, 20)  # Spark's re-run of the batch
    assert await admin.checkpoint("orders", second, 2) == 2
    assert order_ids(catalog, table) == list(range(30))

    async def cleaned() -> bool:
        return not await asyncio.to_thread(exists, object_store, stranded)

    await eventually(cleaned, "the aborted attempt's file deleted from the object store")

    # A batch with a new column evolves the table in the catalog, then commits.
    wider = ORDERS.append(pa.field("channel", pa.string()))
    rows = [{**row, "channel": "web"} for row in orders(30, 10)]
    uri = await asyncio.to_thread(write_parquet_to, object_store, second.table_location, rows, wider)
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(sink="orders", epoch=3, writer_term=second.writer_term, paths=(uri,), evolve_schema=True)
    )
    assert await admin.checkpoint("orders", second, 3) == 3
    assert "channel" in catalog.load_table(table).schema().column_names
    assert order_ids(catalog, table) == list(range(40))

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))
    assert (run.outcome, run.swept) == ("ok", True), run.error
    assert order_ids(catalog, table) == list(range(40))


def test_the_writer_s_task_writes_and_deletes_its_files_on_object_storage(
    object_store: ObjectStore, s3_warehouse: str
) -> None:
    storage = Storage(object_store.properties)
    target = DataFileTarget(f"{s3_warehouse}/db/orders", 3, ORDERS, (), 1 << 20, storage)
    (written,) = task_writer(target)(iter([pa.RecordBatch.from_pylist(orders(0, 50), schema=ORDERS)]))
    (entry,) = written.to_pylist()
    assert entry["path"].startswith(f"{s3_warehouse}/db/orders/data/00000003/00000003-")
    filesystem, path = storage.filesystem(entry["path"])
    assert filesystem.get_file_info(path).size == entry["size_bytes"]
    table = pq.read_table(path, filesystem=filesystem)
    assert table.column("order_id").to_pylist() == list(range(50))
    assert pq.read_metadata(pa.BufferReader(entry["parquet_footer"])).num_rows == 50  # the footer sent

    delete_files([entry["path"]], storage)
    assert not exists(object_store, entry["path"])
    delete_files([entry["path"]], storage)  # already gone: fine


class CountingFileIO(PyArrowFileIO):
    """pyiceberg's FileIO, counting the files it is asked to open or stat one by one."""

    opened: list[str]

    def new_input(self, location: str) -> InputFile:
        self.opened.append(location)
        return super().new_input(location)


def batch_files(store: ObjectStore, location: str, count: int) -> tuple[str, list[dict[str, Any]]]:
    """The files one task of batch 3 writes (small target size: `count` files), and the batch's directory."""
    rows = orders(0, 200 * count)
    target = DataFileTarget(location, 3, ORDERS, (), 1, Storage(store.properties))
    batches = [pa.RecordBatch.from_pylist(rows[i : i + 200], schema=ORDERS) for i in range(0, len(rows), 200)]
    (written,) = task_writer(target)(iter(batches))
    return target.files_directory, written.to_pylist()


def test_the_files_of_a_batch_directory_are_checked_by_one_listing(
    object_store: ObjectStore, s3_warehouse: str
) -> None:
    io = CountingFileIO(object_store.properties)
    io.opened = []
    directory, files = batch_files(object_store, f"{s3_warehouse}/db/orders", 5)
    assert directory == f"{s3_warehouse}/db/orders/data/00000003" and len(files) == 5
    assert all(entry["path"].startswith(f"{directory}/00000003-") for entry in files)
    paths = [entry["path"] for entry in files]
    facts = {entry["path"]: FileFacts(entry["parquet_footer"], entry["size_bytes"]) for entry in files}
    checks = FileChecks(orphan_grace_seconds=3600)

    listed = checks.check(io, paths, facts, directory)
    assert io.opened == []  # no request per file
    assert [(file.path, file.size) for file in listed] == [(p, facts[p].file_size_in_bytes) for p in paths]
    one_by_one = checks.check(io, paths, facts)
    assert sorted(io.opened) == sorted(paths)
    assert [file.size for file in one_by_one] == [file.size for file in listed]

    # The listing does not show it: checked on its own, and refused as missing.
    missing = f"{directory}/never-written.parquet"
    with pytest.raises(InvalidArgument, match="does not exist"):
        checks.check(io, [*paths, missing], {**facts, missing: facts[paths[0]]}, directory)
    # The listing shows another size than the writer sent.
    wrong = {**facts, paths[1]: FileFacts(facts[paths[1]].parquet_footer, facts[paths[1]].file_size_in_bytes + 1)}
    with pytest.raises(InvalidArgument, match="the size the writer sent"):
        checks.check(io, paths, wrong, directory)


def _older_than(store: ObjectStore, uris: list[str], seconds: float) -> Callable[[], Awaitable[bool]]:
    """Whether every one of these objects is older than `seconds` by the store's own modification time, read as
    the sweep reads it (a whole second stands for its last moment)."""

    def check() -> bool:
        io = PyArrowFileIO(store.properties)
        infos = [io.fs_by_scheme("s3", None).get_file_info(uri.removeprefix("s3://")) for uri in uris]
        written = [written_by(info.mtime_ns) for info in infos]
        return all(moment is not None and time.time_ns() - moment > seconds * 1e9 for moment in written)

    async def older() -> bool:
        return await asyncio.to_thread(check)

    return older


async def test_the_orphan_sweep_and_a_fan_out_on_object_storage(
    catalog_on_store: tuple[str, ObjectStore, dict[str, str], str], admin_factory: AdminFactory, database_url: str
) -> None:
    """On the S3 server (its listing, its directory entries, its modification times): the sweep deletes the old
    files nothing references or holds and nothing else, and a fan-out epoch lands in both its tables."""
    kind, store, properties, namespace = catalog_on_store
    admin = await admin_factory(
        catalog_name=f"s3-{kind}", catalog=properties, orphan_grace_seconds=1, compaction_min_files=1_000_000
    )
    catalog = load_catalog(f"s3-{kind}", **properties)
    own, other = f"{namespace}.orders", f"{namespace}.returns"
    registration = await admin.register("orders", table=own)
    (ensured,) = (
        await admin.runtime.coordinator.ensure_tables(
            "orders", registration.writer_term, [TableRequest(other, ORDERS.serialize().to_pybytes())]
        )
    ).tables
    for epoch in range(2):
        await pre_commit(admin, store, registration, epoch, epoch * 10)
    routed = await asyncio.to_thread(write_parquet_to, store, ensured.location, orders(100, 5), ORDERS)
    own_file = await asyncio.to_thread(write_parquet_to, store, registration.table_location, orders(20, 10), ORDERS)
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest("orders", 2, registration.writer_term, (own_file, routed), file_tables={routed: other})
    )
    assert await admin.checkpoint("orders", registration, 2) == 2
    assert order_ids(catalog, own) == list(range(30))
    assert order_ids(catalog, other) == list(range(100, 105))

    pending = await pre_commit(admin, store, registration, 3, 30)  # held by a PENDING epoch
    killed_executor = await asyncio.to_thread(
        write_parquet_to, store, registration.table_location, orders(500, 3), ORDERS
    )
    stray_manifest = f"{registration.table_location.rstrip('/')}/metadata/stray-m0.avro"
    with PyArrowFileIO(store.properties).new_output(stray_manifest).create() as stream:
        stream.write(b"left by a failed commit")
    await eventually(_older_than(store, [pending, killed_executor, stray_manifest], 1.5), "the files past the grace")
    in_flight = await asyncio.to_thread(write_parquet_to, store, registration.table_location, orders(600, 3), ORDERS)
    table = catalog.load_table(own)
    referenced = (await asyncio.to_thread(tm.reachable, table.io, table.snapshots())).all()

    run = await admin.runtime.maintainer.run_now(sink_id_of(database_url, "orders"))

    assert (run.outcome, run.swept, run.orphans_deleted) == ("ok", True, 2), run.error
    assert not any(exists(store, uri) for uri in (killed_executor, stray_manifest))
    assert all(exists(store, uri) for uri in (pending, in_flight, *referenced))
    assert order_ids(catalog, own) == list(range(30))
    assert order_ids(catalog, other) == list(range(100, 105))


def _oauth_token(store: ObjectStore) -> str:
    """A bearer token from the REST catalog's OAuth endpoint (client credentials), as an operator gets one."""
    form = urllib.parse.urlencode(
        {"grant_type": "client_credentials", "client_id": store.access_key_id, "client_secret": store.secret_access_key}
    ).encode()
    with urllib.request.urlopen(f"{store.rest_uri.rstrip('/')}/v1/oauth/tokens", form, timeout=10) as response:
        return str(json.load(response)["access_token"])


async def test_a_rest_catalog_with_a_token_that_refuses_a_stale_commit_as_a_conflict(
    admin_factory: AdminFactory, object_store: ObjectStore, s3_warehouse: str
) -> None:
    """The REST catalog with a bearer token instead of client credentials; another writer commits to the table
    between two of the coordinator's commits: the catalog refuses the coordinator's append on its remembered table
    as a conflict (409), and the coordinator walks the current table and commits; both writers' rows are there."""
    if not object_store.rest_uri:
        pytest.skip("no REST catalog beside the S3 endpoint: set SINK_TEST_REST_URI and SINK_TEST_REST_WAREHOUSE")
    properties = {
        key: value
        for key, value in object_store.catalog_properties("rest", "").items()
        if key not in ("credential", "oauth2-server-uri")
    }
    properties["token"] = await asyncio.to_thread(_oauth_token, object_store)
    admin = await admin_factory(catalog_name="s3-rest-token", catalog=properties)
    catalog = load_catalog("s3-rest-token", **properties)
    table = f"db_token_{s3_warehouse.rsplit('/', 1)[-1]}.orders"
    registration = await admin.register("orders", table=table)
    await pre_commit(admin, object_store, registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0

    other = await asyncio.to_thread(catalog.load_table, table)
    await asyncio.to_thread(other.append, pa.Table.from_pylist(orders(1000, 3), schema=ORDERS))
    await pre_commit(admin, object_store, registration, 1, 10)
    assert await admin.checkpoint("orders", registration, 1) == 1

    assert order_ids(catalog, table) == [*range(20), 1000, 1001, 1002]
    history = [entry.snapshot_id for entry in catalog.load_table(table).history()]
    assert len(history) == 3  # the coordinator's, the other writer's, the coordinator's: nothing overwritten


def test_no_file_looks_written_before_it_was(object_store: ObjectStore, s3_warehouse: str) -> None:
    """S3 keeps whole seconds: a file written at 10.9 s says 10 s, and would look 0.9 s older than it is to the
    orphan grace and a pre-commit's age check. The listing and a file's own metadata say the latest moment it may
    have been written, never a moment before it was."""
    io = PyArrowFileIO(object_store.properties)
    directory = f"{s3_warehouse}/db/orders/data"
    before: dict[str, int] = {}
    for _ in range(5):
        started = time.time_ns()
        uri = write_parquet_to(object_store, f"{s3_warehouse}/db/orders", orders(0, 1), ORDERS)
        before[uri] = started
    listed = listed_files(io, directory)
    assert listed is not None and set(listed) == set(before)
    checked = FileChecks(orphan_grace_seconds=3600).check(io, list(before), {})
    for file in checked:
        assert listed[file.path].mtime_ns is not None and listed[file.path].mtime_ns >= before[file.path]
        assert file.mtime_ns is not None and file.mtime_ns >= before[file.path]


async def test_a_catalog_that_refuses_the_credentials_makes_the_replica_unready_at_once(
    admin_factory: AdminFactory, object_store: ObjectStore
) -> None:
    """A wrong or expired token is no blip of a shared dependency: no wait fixes it, so readiness says so at once
    (whatever READINESS_DEPENDENCY_GRACE_SECONDS), in words an operator acts on, instead of 'unreachable'."""
    if not object_store.rest_uri:
        pytest.skip("no REST catalog beside the S3 endpoint: set SINK_TEST_REST_URI and SINK_TEST_REST_WAREHOUSE")
    properties = {
        key: value
        for key, value in object_store.catalog_properties("rest", "").items()
        if key not in ("credential", "oauth2-server-uri")
    }
    properties["token"] = "expired-or-wrong"
    admin = await admin_factory(
        catalog_name="s3-rest-refused", catalog=properties, readiness_dependency_grace_seconds=3600
    )

    response = await admin.get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"]["catalog"] == (
        "credentials refused: check the catalog's credential or token (CATALOG__*)"
    )
