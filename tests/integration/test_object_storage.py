"""The coordinator and the writer's tasks on S3-compatible storage: SeaweedFS (a real S3 server) with a SQL
catalog and with its Iceberg REST catalog, and Glue on moto's server (or all of them on a real endpoint)."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.io import InputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

from coordinator_service.errors import InvalidArgument
from coordinator_service.precommit_files import FileChecks, FileFacts
from coordinator_service.protocol import PreCommitRequest
from coordinator_service.views import Registration
from sink_coordinator_demo.object_store import ObjectStore
from spark_writer.parquet_writer import DataFileTarget, delete_files, task_writer
from spark_writer.storage import Storage
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
) -> tuple[str, ObjectStore, dict[str, str]]:
    """A catalog kind, the store its tables live on, and its properties: the SQL and REST catalogs on the S3
    server, Glue on moto's."""
    kind = str(request.param)
    store: ObjectStore = request.getfixturevalue("glue_store" if kind == "glue" else "object_store")
    if kind == "rest" and not store.rest_uri:
        pytest.skip("no REST catalog beside the S3 endpoint: set SINK_TEST_REST_URI and SINK_TEST_REST_WAREHOUSE")
    warehouse = store.uri("warehouse", s3_warehouse.rsplit("/", 1)[-1])
    return kind, store, store.catalog_properties(kind, warehouse, database_url)


async def test_create_append_recover_evolve_and_clean_up_on_object_storage(
    catalog_on_store: tuple[str, ObjectStore, dict[str, str]], admin_factory: AdminFactory, database_url: str
) -> None:
    kind, object_store, properties = catalog_on_store
    admin = await admin_factory(catalog_name=f"s3-{kind}", catalog=properties, recovery_files_keep_seconds=0)
    catalog = load_catalog(f"s3-{kind}", **properties)
    table = f"db_{kind}.orders"
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
