"""A newcomer's first hour on the coordinator's side, replayed as a shell session (the goal of issue 26): the
README's commands in a fresh directory, then the mistakes and mishaps of a first day. Each failure is answered in
under 5 s, its cause and its fix on one line (the last), and nothing looks healthy while it is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from coordinator_service.contract.client import CoordinatorClient
from sink_coordinator_demo.ports import free_port
from tests.fixtures.coordinator import ORDERS, orders, write_parquet


class Shell:
    """Commands as the README types them, in one directory, with the environment a newcomer has."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(Path.home()),
            "COLUMNS": "120",
        }

    def run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def fails(self, *command: str, code: int) -> str:
        """Run a command that must fail with `code` (not retry until the timeout); its last line of stderr."""
        result = self.run(*command, timeout=30)
        assert result.returncode == code, (command, result.returncode, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        return result.stderr.strip().splitlines()[-1]

    def serve(self, grpc_port: int, http_port: int) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            ["sink-coordinator", "serve", "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        with CoordinatorClient(f"127.0.0.1:{grpc_port}") as client:
            client.wait_serving(120, lambda: _alive(process))
        return process


def _alive(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        raise RuntimeError(f"the coordinator exited with {process.returncode}")


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    """A fresh directory: the embedded PostgreSQL that `serve` starts there stops with the last process using it."""
    return Shell(tmp_path)


def test_a_newcomers_first_hour_with_the_coordinator(shell: Shell) -> None:
    grpc_port, http_port = free_port(), free_port()
    # make serve, then the README's checks from another terminal.
    coordinator = shell.serve(grpc_port, http_port)
    try:
        ready = httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=10).json()
        assert ready == {"ready": True, "checks": {"metastore": "ok", "catalog": "ok", "warehouse": "ok"}}
        with CoordinatorClient(f"127.0.0.1:{grpc_port}") as client:
            writer = client.register_writer("orders", "shop.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
            client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
            client.commit_checkpoint("orders", 0, writer.writer_term, wait=True)
        status = shell.run("sink-coordinator", "status")
        assert status.returncode == 0, status.stderr
        assert status.stderr == ""  # no JSON log line: its answer is what it prints
        assert "orders" in status.stdout and "shop.orders" in status.stdout
        catalog = shell.run("sink-coordinator", "catalog", "shop.orders")
        assert catalog.returncode == 0 and "iceberg_scan(" in catalog.stdout, catalog.stderr

        # A typo in a flag.
        assert shell.fails("sink-coordinator", "serve", "--grpc-prot", "1", code=2) == (
            "Error: No such option: --grpc-prot (Possible options: --grpc-port, --http-port)"
        )
        # A bad value.
        last = shell.fails("sink-coordinator", "serve", "--http-port", "99999", code=2)
        assert "--http-port" in last and "99999" in last
        # A second coordinator on the same ports (a second terminal running make serve).
        last = shell.fails("sink-coordinator", "serve", "--grpc-port", str(grpc_port), code=1)
        assert last.startswith("cannot serve: the HTTP port 127.0.0.1:8080") or f":{grpc_port} is in use" in last
        last = shell.fails(
            "sink-coordinator", "serve", "--grpc-port", str(grpc_port), "--http-port", str(free_port()), code=1
        )
        assert f"the gRPC port 127.0.0.1:{grpc_port} is in use" in last and "--grpc-port" in last
        # A metastore that is not there (a wrong URL, PostgreSQL down).
        last = shell.fails(
            "sink-coordinator", "status", "--database-url", "postgresql+psycopg://u:p@127.0.0.1:1/db", code=1
        )
        assert last.startswith("cannot reach the metastore postgresql+psycopg://u:***@127.0.0.1:1/db")
        assert "is PostgreSQL running" in last and "SINK_COORDINATOR_DATABASE_URL" in last
        # Listening for writers on other machines with the warehouse on this one.
        last = shell.fails("sink-coordinator", "serve", "--bind-host", "192.0.2.1", code=2)
        assert "SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE=true" in last
        # kill -9 and a restart: the same sinks, committed as they were.
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=30)
        coordinator = shell.serve(grpc_port, http_port)
        sink = httpx.get(f"http://127.0.0.1:{http_port}/api/v1/sinks/orders", timeout=10).json()
        assert (sink["committed_epoch"], sink["committer"]["state"]) == (0, "idle")
        assert sink["last_commit_at"] is not None  # the log's, though this process committed nothing yet
    finally:
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)
    # With the coordinator down, status still reads the metastore.
    status = shell.run("sink-coordinator", "status")
    assert status.returncode == 0 and "orders" in status.stdout, status.stderr
    assert os.listdir(shell.cwd / ".sink-coordinator") != []
