"""Starting, configuring and inspecting the service as a user would: CLI, schema checks, defaults."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from pyiceberg.catalog import load_catalog

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.log.database import normalize_url
from coordinator_service.log.schema import head_revision
from coordinator_service.runtime import migrate
from coordinator_service.settings import Settings
from sink_coordinator_demo.ports import free_port
from tests.fixtures.coordinator import (
    ORDERS,
    CoordinatorProcess,
    coordinator_cli,
    orders,
    table_order_ids,
    write_parquet,
)
from tests.fixtures.duckdb_reader import duckdb_rows
from tests.fixtures.postgres import query

SCHEMA = ORDERS.serialize().to_pybytes()


def test_embedded_default_needs_no_configuration(embedded_tmp_path: Path) -> None:
    """No database URL: an embedded PostgreSQL and a local SQL catalog under ./.sink-coordinator."""
    process = CoordinatorProcess(database_url=None, data_dir=embedded_tmp_path / ".sink-coordinator")
    process.start(cwd=embedded_tmp_path)
    try:
        ready = httpx.get(f"{process.http_url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"metastore": "ok", "catalog": "ok", "warehouse": "ok"}
        with process.client() as client:
            writer = client.register_writer("local", "demo.orders", -1, arrow_schema=SCHEMA)
            assert writer.table_location.startswith((embedded_tmp_path / ".sink-coordinator" / "warehouse").as_uri())
            client.pre_commit("local", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
            assert client.commit_checkpoint("local", 0, writer.writer_term, wait=True).committed_epoch == 0
        assert (embedded_tmp_path / ".sink-coordinator" / "postgres" / "PG_VERSION").exists()
    finally:
        process.stop()
    assert process.process is not None and process.process.returncode == 0


def test_serve_refuses_an_unmigrated_metastore(database_url: str, tmp_path: Path) -> None:
    result = coordinator_cli(
        "serve", "--grpc-port", "0", "--http-port", "0", SINK_COORDINATOR_DATABASE_URL=database_url
    )
    assert result.returncode == 1
    assert "run `sink-coordinator migrate`" in " ".join(result.stderr.split())
    assert query(database_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_serve_refuses_failpoints_without_their_switch(database_url: str) -> None:
    """Failpoints kill or stall the process on purpose: armed by mistake, the service does not start."""
    result = coordinator_cli(
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
    # Any free ports: what this test is about comes after the ports' check, and other tests serve on the defaults.
    result = coordinator_cli(
        "serve", "--grpc-port", "0", "--http-port", "0", SINK_COORDINATOR_DATABASE_URL=database_url
    )
    assert result.returncode == 1
    assert "newer than this release knows" in " ".join(result.stderr.split())


def test_a_second_coordinator_on_the_same_grpc_port_is_refused(
    coordinator: CoordinatorProcess, database_url: str, tmp_path: Path
) -> None:
    """grpcio binds with SO_REUSEPORT unless told not to: a second coordinator on another metastore would listen
    beside the first and take some of its writers' calls. It is refused in one line naming the port."""
    started = time.monotonic()
    result = coordinator_cli(
        "serve",
        "--grpc-port",
        str(coordinator.grpc_port),
        "--http-port",
        str(free_port()),
        timeout=30,
        SINK_COORDINATOR_DATABASE_URL=database_url,
        SINK_COORDINATOR_DATA_DIR=str(tmp_path / "second"),
    )
    assert time.monotonic() - started < 5
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"cannot serve: the gRPC port 127.0.0.1:{coordinator.grpc_port} is in use (another coordinator?): stop "
        "what listens there, or choose another port with --grpc-port or SINK_COORDINATOR_GRPC_PORT"
    ]
    with coordinator.client() as client:  # the first one still answers, alone
        client.wait_serving(5)


def test_an_http_port_in_use_is_one_line_naming_it(
    coordinator: CoordinatorProcess, database_url: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    result = coordinator_cli(
        "serve",
        "--grpc-port",
        str(free_port()),
        "--http-port",
        str(coordinator.http_port),
        timeout=30,
        SINK_COORDINATOR_DATABASE_URL=database_url,
        SINK_COORDINATOR_DATA_DIR=str(tmp_path / "second"),
    )
    assert time.monotonic() - started < 5
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"cannot serve: the HTTP port 127.0.0.1:{coordinator.http_port} is in use (another coordinator?): stop "
        "what listens there, or choose another port with --http-port or SINK_COORDINATOR_HTTP_PORT"
    ]


def test_serve_refuses_a_local_warehouse_for_writers_on_other_machines(database_url: str, tmp_path: Path) -> None:
    """No catalog: the warehouse is DATA_DIR/warehouse, which executors on other machines cannot write and which goes
    with this machine. Listening beyond loopback with it is refused, before anything starts, unless allowed.
    192.0.2.1 (TEST-NET-1) is no address of this machine: allowed, the start goes on to fail at the bind."""
    env = {"SINK_COORDINATOR_DATABASE_URL": database_url, "SINK_COORDINATOR_DATA_DIR": str(tmp_path / "data")}
    started = time.monotonic()
    result = coordinator_cli("serve", "--bind-host", "192.0.2.1", timeout=30, **env)
    assert time.monotonic() - started < 5
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("invalid configuration: no catalog is configured, so the tables would go to a SQL catalog")
    assert "listens on 192.0.2.1" in line
    assert line.endswith("or set SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE=true if every writer shares this file system")
    assert not (tmp_path / "data").exists()

    allowed = coordinator_cli("serve", "--bind-host", "192.0.2.1", "--allow-local-warehouse", timeout=30, **env)
    assert allowed.returncode == 1, allowed.stderr
    [line] = allowed.stderr.strip().splitlines()
    assert line.startswith("cannot serve: the HTTP port 192.0.2.1:8080 cannot be listened on")


def test_migrate_is_idempotent(database_url: str) -> None:
    for _ in range(2):
        result = coordinator_cli("migrate", "--database-url", database_url)
        assert result.returncode == 0, result.stderr
    assert query(database_url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]


def test_bad_configuration_is_reported_not_raised(database_url: str) -> None:
    result = coordinator_cli("serve", "--grpc-port", "not-a-port", SINK_COORDINATOR_DATABASE_URL=database_url)
    assert result.returncode == 2
    assert "Invalid value for '--grpc-port'" in result.stderr
    assert "Traceback" not in result.stderr
    result = coordinator_cli(
        "serve", SINK_COORDINATOR_DATABASE_URL=database_url, SINK_COORDINATOR_GRPC_PORT="not-a-port"
    )
    assert result.returncode == 2
    assert "SINK_COORDINATOR_GRPC_PORT='not-a-port'" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_bad_settings_are_one_json_line_where_json_logs_were_asked_for(database_url: str) -> None:
    """On-call review: a start-up refusal was a plain line among JSON log lines (the chart asks for JSON)."""
    result = coordinator_cli(
        "serve",
        SINK_COORDINATOR_DATABASE_URL=database_url,
        SINK_COORDINATOR_GRPC_PORT="99999",
        SINK_COORDINATOR_LOG_FORMAT="json",
    )
    assert result.returncode == 2
    [line] = [json.loads(line) for line in result.stderr.splitlines()]
    assert line["event"] == "invalid configuration" and line["level"] == "error", line
    assert "SINK_COORDINATOR_GRPC_PORT='99999'" in line["error"], line


def test_status_shows_sinks_and_open_epochs(coordinator: CoordinatorProcess, database_url: str) -> None:
    with coordinator.client() as client:
        writer = client.register_writer("status-sink", "shop.orders", -1, arrow_schema=SCHEMA)
        for epoch in range(3):
            client.pre_commit(
                "status-sink", epoch, writer.writer_term, [write_parquet(writer.table_location, orders(epoch * 10, 10))]
            )
        client.commit_checkpoint("status-sink", 0, writer.writer_term, wait=True)
    result = coordinator_cli("status", "--database-url", database_url, COLUMNS="200")
    assert result.returncode == 0, result.stderr
    sink_line = next(line for line in result.stdout.splitlines() if "status-sink" in line and "shop.orders" in line)
    # writer, checkpointed, committed, pending, aborted
    cells = [cell.strip() for cell in sink_line.split("│")[4:9]]
    assert re.fullmatch(r"term 1, \d+ s ago", cells[0])
    assert cells[1:] == ["0", "0", "2", "0"]
    pending_lines = [line for line in result.stdout.splitlines() if "PENDING" in line]
    assert [cell.strip() for line in pending_lines for cell in line.split("│")[2:3]] == ["1", "2"]


def test_status_names_every_sink_whole_at_80_columns_and_logs_nothing(
    coordinator: CoordinatorProcess, database_url: str
) -> None:
    """Issue 26.12: four sinks of a demo showed as four identical `demo-orde…` rows, under a JSON log line."""
    names = [f"demo-orders-20261125_1540{second:02d}" for second in range(4)]
    with coordinator.client() as client:
        for name in names:
            client.register_writer(name, f"demo.orders_{name[-15:]}", -1, arrow_schema=SCHEMA)
    result = coordinator_cli("status", "--database-url", database_url, COLUMNS="80")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout
    assert [next(line for line in lines if name in line) for name in names]  # each name whole, on a line


def test_status_shows_liveness_stalls_last_commits_and_shared_tables(
    coordinator: CoordinatorProcess, database_url: str
) -> None:
    """Issues 26.4 and 26.5, as `status` says them: the writer's term and last call, stalled, the last commit from
    the log, and the sinks writing one table."""
    with coordinator.client() as client:
        writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=SCHEMA)
        client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
        client.commit_checkpoint("orders", 0, writer.writer_term, wait=True)
        client.pre_commit("orders", 1, writer.writer_term, [write_parquet(writer.table_location, orders(5, 5))])
        client.register_writer("orders-replay", "shop.orders", -1, arrow_schema=SCHEMA)
    coordinator.stop()  # its last notes of the writers' calls written: status reads the metastore alone
    query(database_url, "UPDATE pending_sink_state SET updated_at = now() - interval '1 hour' WHERE epoch = 1")
    query(database_url, "UPDATE sinks SET writer_last_call_at = now() - interval '2 hours' WHERE name = 'orders'")
    result = coordinator_cli("status", "--database-url", database_url, "--stalled-after-seconds", "600", COLUMNS="250")
    assert result.returncode == 0, result.stderr
    sinks_lines = result.stdout.split("epochs not committed")[0].splitlines()
    [orders_line] = [line for line in sinks_lines if "│ orders " in line]
    cells = [cell.strip() for cell in orders_line.split("│")[1:-1]]
    assert cells[:3] == ["orders", "shop.orders (shared with orders-replay)", "stalled"]
    assert cells[3] == "term 1, 2 h ago"
    assert cells[4:8] == ["0", "0", "1", "0"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[8])
    said = " ".join(result.stdout.split())
    assert re.search(r"orders is stalled: epoch 1 was pre-committed 36\d\d s ago and its checkpoint has not come", said)
    [replay_line] = [line for line in sinks_lines if "│ orders-replay " in line]
    replay = [cell.strip() for cell in replay_line.split("│")[1:-1]]
    assert replay[4:6] == ["none", "none"] and replay[8] == "\N{EN DASH}"


def test_each_commands_help_fits_120_columns_with_its_flags_and_variables_whole() -> None:
    """Issue 26.12: `serve --help` cut flag and variable names at 120 columns, and `status --help` listed every
    flag of the server (408 lines)."""
    serve = coordinator_cli("serve", "--help", COLUMNS="120")
    assert serve.returncode == 0
    assert "…" not in serve.stdout and max(len(line) for line in serve.stdout.splitlines()) <= 120
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in serve.stdout, name
        assert f"SINK_COORDINATOR_{name.upper()}" in serve.stdout, name
    status = coordinator_cli("status", "--help", COLUMNS="120")
    assert status.returncode == 0
    assert "--database-url" in status.stdout and "--stalled-after-seconds" in status.stdout
    assert "--grpc-port" not in status.stdout and "--compaction-min-files" not in status.stdout
    assert len(status.stdout.splitlines()) < 40


def test_the_catalog_command_prints_lines_that_read_the_table(
    coordinator: CoordinatorProcess, database_url: str
) -> None:
    """Issue 26.8: nothing said how to read one's table. The lines it prints for pyiceberg and DuckDB read it."""
    with coordinator.client() as client:
        writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=SCHEMA)
        client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
        client.commit_checkpoint("orders", 0, writer.writer_term, wait=True)
    env = {"SINK_COORDINATOR_DATABASE_URL": database_url, "SINK_COORDINATOR_DATA_DIR": str(coordinator.data_dir)}

    shown = coordinator_cli("catalog", "shop.orders", "--show-secrets", **env)
    assert shown.returncode == 0, shown.stderr
    sections = shown.stdout.split("\n\n")
    pyiceberg = [line.strip() for line in sections[1].splitlines()[1:]]
    read: dict[str, Any] = {}
    exec("\n".join(pyiceberg[:2]), read)  # the lines as a reader pastes them
    assert table_order_ids(read["catalog"].load_table("shop.orders")) == [0, 1, 2, 3, 4]
    [scan] = re.findall(r"iceberg_scan\('([^']+)'\)", sections[2])
    assert len(duckdb_rows(scan, "order_id")) == 5
    assert "spark.sql.catalog.default.catalog-impl=org.apache.iceberg.jdbc.JdbcCatalog" in sections[3]

    missing = coordinator_cli("catalog", "shop.nothing", **env)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "cannot read the table: table 'shop.nothing' does not exist in catalog default"
    ]
    bad = coordinator_cli("catalog", "no/such table", **env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


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
