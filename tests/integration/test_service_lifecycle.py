"""Starting, configuring and inspecting the service as a user would: CLI, schema checks, defaults."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from pyiceberg.catalog import load_catalog

from coordinator_service.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.database import normalize_url
from coordinator_service.runtime import migrate
from coordinator_service.schema import head_revision
from coordinator_service.views import PreCommitOutcome
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet
from tests.fixtures.postgres import query

SCHEMA = ORDERS.serialize().to_pybytes()


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **env},
    )


def test_embedded_default_needs_no_configuration(tmp_path: Path) -> None:
    """No database URL: an embedded PostgreSQL and a local SQL catalog under ./.sink-coordinator."""
    process = CoordinatorProcess(database_url=None, data_dir=tmp_path / ".sink-coordinator")
    process.start(cwd=tmp_path)
    try:
        ready = httpx.get(f"{process.http_url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"metastore": "ok", "catalog": "ok"}
        with process.client() as client:
            writer = client.register_writer("local", "demo.orders", -1, arrow_schema=SCHEMA)
            assert writer.table_location.startswith((tmp_path / ".sink-coordinator" / "warehouse").as_uri())
            client.pre_commit("local", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
            assert client.commit_checkpoint("local", 0, writer.writer_term, wait=True).committed_epoch == 0
        assert (tmp_path / ".sink-coordinator" / "postgres" / "PG_VERSION").exists()
    finally:
        process.stop()
    assert process.process is not None and process.process.returncode == 0


def test_serve_refuses_an_unmigrated_metastore(database_url: str, tmp_path: Path) -> None:
    result = cli("serve", "--grpc-port", "0", "--http-port", "0", SINK_COORDINATOR_DATABASE_URL=database_url)
    assert result.returncode == 1
    assert "run `sink-coordinator migrate`" in " ".join(result.stderr.split())
    assert query(database_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_serve_refuses_failpoints_without_their_switch(database_url: str) -> None:
    """Failpoints kill or stall the process on purpose: armed by mistake, the service does not start."""
    result = cli(
        "serve",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        SINK_COORDINATOR_DATABASE_URL=database_url,
        SINK_COORDINATOR_FAILPOINTS="commit.after_append=kill",
    )
    assert result.returncode == 2, result.stderr
    stderr = " ".join(result.stderr.split())
    assert "SINK_COORDINATOR_FAILPOINTS='commit.after_append=kill':" in stderr
    assert "set SINK_COORDINATOR_ENABLE_FAILPOINTS=true to arm them" in stderr


def test_serve_refuses_a_newer_schema(database_url: str) -> None:
    migrate(normalize_url(database_url))
    query(database_url, "UPDATE alembic_version SET version_num = '9999'")
    # A newer release's migration that this release's code does not fit (it contracts what this code uses).
    query(database_url, "UPDATE schema_compatibility SET oldest_compatible_code = '9999'")
    result = cli("serve", SINK_COORDINATOR_DATABASE_URL=database_url)
    assert result.returncode == 1
    assert "newer than this release knows" in " ".join(result.stderr.split())


def test_migrate_is_idempotent(database_url: str) -> None:
    for _ in range(2):
        result = cli("migrate", "--database-url", database_url)
        assert result.returncode == 0, result.stderr
    assert query(database_url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]


def test_bad_configuration_is_reported_not_raised(database_url: str) -> None:
    result = cli("serve", "--grpc-port", "not-a-port", SINK_COORDINATOR_DATABASE_URL=database_url)
    assert result.returncode == 2
    assert "Invalid value for '--grpc-port'" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("serve", SINK_COORDINATOR_DATABASE_URL=database_url, SINK_COORDINATOR_GRPC_PORT="not-a-port")
    assert result.returncode == 2
    assert "SINK_COORDINATOR_GRPC_PORT='not-a-port'" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_status_shows_sinks_and_open_epochs(coordinator: CoordinatorProcess, database_url: str) -> None:
    with coordinator.client() as client:
        writer = client.register_writer("status-sink", "shop.orders", -1, arrow_schema=SCHEMA)
        for epoch in range(3):
            client.pre_commit(
                "status-sink", epoch, writer.writer_term, [write_parquet(writer.table_location, orders(epoch * 10, 10))]
            )
        client.commit_checkpoint("status-sink", 0, writer.writer_term, wait=True)
    result = cli("status", "--database-url", database_url, COLUMNS="200")
    assert result.returncode == 0, result.stderr
    sink_line = next(line for line in result.stdout.splitlines() if "status-sink" in line and "shop.orders" in line)
    # term, checkpointed, committed, pending, aborted
    assert [cell.strip() for cell in sink_line.split("│")[3:8]] == ["1", "0", "0", "2", "0"]
    pending_lines = [line for line in result.stdout.splitlines() if "PENDING" in line]
    assert [cell.strip() for line in pending_lines for cell in line.split("│")[2:3]] == ["1", "2"]


def test_configured_catalog_is_used(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str, tmp_path: Path
) -> None:
    """CATALOG_NAME and CATALOG__<key> go to pyiceberg's load_catalog as they are."""
    warehouse = tmp_path / "lake"
    warehouse.mkdir()
    process = coordinator_factory(
        SINK_COORDINATOR_CATALOG_NAME="lake",
        SINK_COORDINATOR_CATALOG__TYPE="sql",
        SINK_COORDINATOR_CATALOG__URI=database_url,
        SINK_COORDINATOR_CATALOG__WAREHOUSE=warehouse.as_uri(),
    )
    with process.client() as client:
        writer = client.register_writer("lake-sink", "lake_ns.events", -1, arrow_schema=SCHEMA)
        assert writer.table_location.startswith(warehouse.as_uri())
        client.pre_commit("lake-sink", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 4))])
        client.commit_checkpoint("lake-sink", 0, writer.writer_term, wait=True)
        assert client.sink_state("lake-sink").catalog == "lake"
    lake = load_catalog("lake", type="sql", uri=database_url, warehouse=warehouse.as_uri())
    assert table_order_ids(lake.load_table("lake_ns.events")) == [0, 1, 2, 3]


def test_multi_writer_epoch_waits_for_every_writer(coordinator: CoordinatorProcess, database_url: str) -> None:
    with coordinator.client(retry_seconds=0) as client:
        writer = client.register_writer("wide", "shop.wide", -1, writer_count=2, arrow_schema=SCHEMA)
        files = [write_parquet(writer.table_location, orders(i * 10, 10)) for i in range(2)]
        # One writer alone is not enough: its call waits (here until its deadline) and nothing persists.
        with pytest.raises(CoordinatorRpcError) as raised:
            client.pre_commit("wide", 0, writer.writer_term, [files[0]], writer_id=0, timeout_seconds=1.0)
        assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert query(database_url, "SELECT count(*) FROM pending_sink_state") == [(0,)]
        answers: dict[int, bool] = {}

        def send(writer_id: int) -> None:
            answers[writer_id] = (
                client.pre_commit("wide", 0, writer.writer_term, [files[writer_id]], writer_id=writer_id).outcome
                is PreCommitOutcome.PERSISTED
            )

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert answers == {0: True, 1: True}
        assert query(database_url, "SELECT file_count, record_count FROM pending_sink_state") == [(2, 20)]
        # Each writer's repeat is recognised as its own part.
        assert (
            client.pre_commit("wide", 0, writer.writer_term, [files[1]], writer_id=1).outcome
            is PreCommitOutcome.PERSISTED
        )


def test_multi_writer_epoch_completes_across_replicas(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str
) -> None:
    """The writers of one epoch reach different replicas: the parts meet in the metastore, not in a process."""
    first, second = coordinator_factory(), coordinator_factory()
    with first.client() as one, second.client() as other:
        writer = one.register_writer("wide", "shop.wide", -1, writer_count=2, arrow_schema=SCHEMA)
        files = [write_parquet(writer.table_location, orders(i * 10, 10)) for i in range(2)]
        answers: dict[int, bool] = {}

        def send(writer_id: int, client: CoordinatorClient) -> None:
            answers[writer_id] = (
                client.pre_commit("wide", 0, writer.writer_term, [files[writer_id]], writer_id=writer_id).outcome
                is PreCommitOutcome.PERSISTED
            )

        threads = [threading.Thread(target=send, args=args) for args in ((0, one), (1, other))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert answers == {0: True, 1: True}
        assert query(database_url, "SELECT file_count, record_count FROM pending_sink_state") == [(2, 20)]
        assert query(database_url, "SELECT count(*) FROM epoch_parts") == [(0,)]
        assert other.commit_checkpoint("wide", 0, writer.writer_term, wait=True).committed_epoch == 0
