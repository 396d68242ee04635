"""Deleting a sink (issue 26.10): its log rows, the files of its epochs not committed (through file_deletion, each
proven garbage), and on request its tables; refused while its writer is live, without the name typed again, or
when another sink writes a table it would drop. A refusal changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.engine.writer_requests import PreCommitRequest
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet
from tests.fixtures.postgres import query

LOG_TABLES = ("sinks", "pending_sink_state", "epoch_files", "sink_tables")


def log_rows(database_url: str) -> dict[str, int]:
    """The rows of the log's tables, but the marks of deletions done (they outlive their sink for the grace)."""
    counted = {table: f"SELECT count(*) FROM {table}" for table in LOG_TABLES}
    counted["epoch_files"] += " WHERE deleted_at IS NULL"
    return {table: int(query(database_url, statement)[0][0]) for table, statement in counted.items()}  # type: ignore[call-overload]


def marks_without_a_sink(database_url: str) -> int:
    return int(query(database_url, "SELECT count(*) FROM epoch_files WHERE sink_id IS NULL")[0][0])  # type: ignore[call-overload]


def exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


def regular_files_under(location: str) -> set[str]:
    """The files under a table's location that are not symbolic links."""
    root = Path(location.removeprefix("file://"))
    return {str(path) for path in root.rglob("*") if path.is_file() and not path.is_symlink()}


def writer_silent(database_url: str, name: str, seconds: int) -> None:
    query(
        database_url,
        f"UPDATE sinks SET writer_last_call_at = now() - interval '{seconds} seconds' WHERE name = %s",
        name,
    )


async def a_sink_with_a_pending_epoch(admin: AdminApp) -> str:
    """orders: epoch 0 committed (10 rows in db.orders), epoch 1 pre-committed (its file); returns epoch 1's file."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    return await admin.pre_commit("orders", registration, 1, 10)


async def delete(admin: AdminApp, name: str, **body: Any) -> Any:
    return await admin.post(f"/api/v1/sinks/{name}/delete", json={"confirm": name, "reason": "a trial run", **body})


async def test_deleting_a_sink_takes_its_log_and_its_uncommitted_files_and_keeps_its_table(
    admin: AdminApp, database_url: str, catalog: Catalog
) -> None:
    pending_file = await a_sink_with_a_pending_epoch(admin)
    writer_silent(database_url, "orders", 3600)
    before = log_rows(database_url)

    response = await delete(admin, "orders")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "sink": "orders",
        "given_up": [{"epoch": 1, "files": 1, "records": 10}],
        "files_deleted": 1,
        "files_kept": 0,
        "tables_dropped": [],
    }
    assert before["sinks"] == 1 and log_rows(database_url) == dict.fromkeys(LOG_TABLES, 0)
    assert marks_without_a_sink(database_url) == 1  # the deleted file's, until the grace is over
    assert not exists(pending_file)
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10))  # what was committed stays
    assert (await admin.get("/api/v1/sinks/orders")).status_code == 404
    assert 'sink="orders"' not in (await admin.get("/metrics")).text.split("# HELP sink_coordinator_metastore_up")[1]
    # The name is free again: a new sink, a new incarnation, which takes no marker of the old one as its own.
    assert (await admin.register("orders")).writer_term == 1


async def test_a_sink_is_not_deleted_under_a_live_writer_or_without_its_name(
    admin: AdminApp, database_url: str
) -> None:
    pending_file = await a_sink_with_a_pending_epoch(admin)
    writer_silent(database_url, "orders", 5)
    before = log_rows(database_url)

    live = await delete(admin, "orders")
    assert live.status_code == 409
    assert re.match(
        r"sink orders: its writer \(term 1\) called [56] s ago: stop it first", live.json()["error"]["message"]
    )
    for body, status in (
        ({"confirm": "order"}, 422),
        ({"confirm": ""}, 422),
        ({"confirm": "orders" * 60}, 422),
        ({"reason": ""}, 422),
        ({"reason": "nul\x00"}, 422),
        ({"drop_tables": "yes"}, 422),
        ({"drop_tables": 1}, 422),
        ({"extra": True}, 422),
    ):
        refused = await admin.post(
            "/api/v1/sinks/orders/delete", json={"confirm": "orders", "reason": "a trial run", **body}
        )
        assert refused.status_code == status, (body, refused.text)
    assert (
        await admin.post("/api/v1/sinks/nobody/delete", json={"confirm": "nobody", "reason": "x"})
    ).status_code == 404
    assert (
        await admin.post("/api/v1/sinks/..%2Forders/delete", json={"confirm": "x", "reason": "x"})
    ).status_code == 404
    assert log_rows(database_url) == before and exists(pending_file)


async def test_dropping_its_tables_drops_them_unless_another_sink_writes_one(
    admin: AdminApp, database_url: str, catalog: Catalog
) -> None:
    await a_sink_with_a_pending_epoch(admin)
    narrower = pa.schema([pa.field("order_id", pa.int64(), nullable=False)]).serialize().to_pybytes()
    await admin.runtime.coordinator.register_writer("orders-replay", "db.orders", -1, arrow_schema=narrower)
    for name in ("orders", "orders-replay"):
        writer_silent(database_url, name, 3600)

    shared = await delete(admin, "orders", drop_tables=True)
    assert shared.status_code == 409
    assert shared.json()["error"]["message"].startswith(
        "sink orders: table db.orders is also written by sink orders-replay"
    )
    assert catalog.table_exists("db.orders") and log_rows(database_url)["sinks"] == 2

    assert (await delete(admin, "orders-replay")).json()["tables_dropped"] == []
    dropped = await delete(admin, "orders", drop_tables=True)
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["tables_dropped"] == ["db.orders"]
    assert not catalog.table_exists("db.orders")
    assert log_rows(database_url) == dict.fromkeys(LOG_TABLES, 0)


async def test_dropping_a_table_deletes_only_files_under_its_own_directories(
    admin: AdminApp, database_url: str, catalog: Catalog, tmp_path: Path
) -> None:
    """The sink's table also references a data file of another table (pyiceberg add_files, as a table an operator
    adopted may) and a symbolic link under its own data directory to another of that table's files: dropping it
    removes its catalog entry and deletes, through file_deletion, only the files under its own directories; the
    other table stays whole and the files left are counted."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    own = catalog.load_table("db.orders")
    other = catalog.create_table("db.other", schema=ORDERS)
    shared, linked = (write_parquet(other.location(), orders(first, 5)) for first in (100, 200))
    other.add_files([shared, linked])
    link = Path(own.location().removeprefix("file://")) / "data" / "linked.parquet"
    link.symlink_to(linked.removeprefix("file://"))
    own.add_files([shared, link.as_uri()])
    own_files = regular_files_under(own.location())
    writer_silent(database_url, "orders", 3600)

    dropped = await delete(admin, "orders", drop_tables=True)
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["tables_dropped"] == ["db.orders"]
    assert not catalog.table_exists("db.orders")
    assert table_order_ids(catalog.load_table("db.other")) == [*range(100, 105), *range(200, 205)]
    assert exists(shared) and exists(linked) and link.is_symlink()
    # Its own files (data, manifests, manifest lists, metadata files, and the metadata file and manifest list of the
    # fence the deletion committed first) are gone; the link and the other table's file, which it reached too, are
    # kept and counted.
    assert regular_files_under(own.location()) == set()
    assert (dropped.json()["files_deleted"], dropped.json()["files_kept"]) == (len(own_files) + 2, 2)


async def test_the_marks_of_a_deleted_sinks_deletions_stay_for_the_grace(admin: AdminApp, database_url: str) -> None:
    """A sink's deletion deleted a file it gave up, then its rows, whose cascade took the file's mark at once: a
    pre-commit that had read a file of that name before could claim it right after, and its table would point at a
    missing file. The mark stays ORPHAN_GRACE_SECONDS, without a sink, as every deletion's does."""
    pending_file = await a_sink_with_a_pending_epoch(admin)
    writer_silent(database_url, "orders", 3600)
    assert (await delete(admin, "orders")).status_code == 200
    mark = "SELECT sink_id, deleted_at IS NOT NULL FROM epoch_files WHERE path = %s"
    assert query(database_url, mark, pending_file) == [(None, True)]

    # A sink registered under the name again; its writer names a file as the deleted one was named.
    registration = await admin.register("orders")
    name = Path(pending_file.removeprefix("file://")).stem
    assert write_parquet(registration.table_location, orders(0, 10), name=name) == pending_file
    request = PreCommitRequest("orders", 0, registration.writer_term, (pending_file,))
    with pytest.raises(InvalidArgument, match="is being deleted"):
        await admin.runtime.coordinator.pre_commit(request)

    query(database_url, "UPDATE epoch_files SET deleted_at = now() - interval '2 days' WHERE path = %s", pending_file)
    await admin.runtime.cleaner.clean()
    assert query(database_url, mark, pending_file) == []
    assert (await admin.runtime.coordinator.pre_commit(request)).outcome == PreCommitOutcome.PERSISTED


async def test_a_sink_whose_table_is_gone_is_deleted_all_the_same(
    admin: AdminApp, database_url: str, catalog: Catalog
) -> None:
    """A trial run whose table someone dropped by hand: its files cannot be proven garbage, and are left."""
    await a_sink_with_a_pending_epoch(admin)
    writer_silent(database_url, "orders", 3600)
    catalog.drop_table("db.orders")
    admin.runtime.iceberg.forget("db.orders")

    response = await delete(admin, "orders")
    assert response.status_code == 200, response.text
    assert (response.json()["files_deleted"], response.json()["files_kept"]) == (0, 1)
    assert log_rows(database_url) == dict.fromkeys(LOG_TABLES, 0)


@pytest.mark.parametrize("path", ["/api/v1/sinks/orders/delete"])
async def test_deleting_needs_the_admin_token(admin_factory: Any, database_url: str, path: str) -> None:
    admin = await admin_factory(admin_token="deletion-admin-token-Zq3vX9pL2mN8rT5w")
    await a_sink_with_a_pending_epoch(admin)
    writer_silent(database_url, "orders", 3600)
    refused = await admin.post(path, json={"confirm": "orders", "reason": "x"})
    assert refused.status_code == 401
    assert log_rows(database_url)["sinks"] == 1


def test_the_command_line_deletes_a_sink_as_the_api_does(
    coordinator: CoordinatorProcess, database_url: str, tmp_path: Path
) -> None:
    with coordinator.client() as client:
        writer = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
    env = {"SINK_COORDINATOR_DATABASE_URL": database_url, "SINK_COORDINATOR_DATA_DIR": str(coordinator.data_dir)}

    def delete_command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coordinator_service.cli", "delete", "orders", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **env},
        )

    live = delete_command("--confirm", "orders", "--reason", "a trial run")
    assert live.returncode == 1
    [line] = live.stderr.strip().splitlines()
    assert re.match(r"cannot delete: sink orders: its writer \(term 1\) called \d+ s ago: stop it first", line)
    coordinator.stop()  # its notes of the writer's calls written
    writer_silent(database_url, "orders", 3600)
    mistyped = delete_command("--confirm", "order", "--reason", "a trial run")
    assert mistyped.returncode == 2
    assert mistyped.stderr.strip().splitlines() == [
        "cannot delete: confirm must repeat the sink name 'orders' exactly, got 'order'"
    ]
    assert log_rows(database_url)["sinks"] == 1

    done = delete_command("--confirm", "orders", "--reason", "a trial run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "sink orders deleted: 1 epoch given up (5 records), 1 file deleted, 0 left, no table dropped"
    ]
    assert log_rows(database_url) == dict.fromkeys(LOG_TABLES, 0)
