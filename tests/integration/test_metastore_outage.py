"""PostgreSQL trouble survived: a frozen metastore is answered UNAVAILABLE within seconds, probes and scrapes never
hang on it, a restarted one costs a streaming writer nothing, and everything goes on when it answers again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import psutil
import pytest
from pyiceberg.catalog import load_catalog

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.log.database import normalize_url
from coordinator_service.log.embedded import start_embedded_postgres, stop_embedded_postgres
from coordinator_service.runtime import migrate
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet
from tests.fixtures.postgres import query
from tests.fixtures.postgres_server import PostgresServer, wheel_binaries
from tests.fixtures.streaming_writer import ROWS_PER_EPOCH, StreamingWriter

SCHEMA = ORDERS.serialize().to_pybytes()


@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL server of this test's own, which it may freeze without stopping the session's."""
    root = Path(tempfile.mkdtemp(prefix="sink-coordinator-frozen-"))
    url = start_embedded_postgres(root / "data")
    migrate(normalize_url(url))
    yield url, root / "data"
    stop_embedded_postgres(root / "data")


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    postmaster = next(
        process
        for process in psutil.process_iter(["cmdline"])
        if process.info["cmdline"] and str(data_dir) in " ".join(process.info["cmdline"])
    )
    return [postmaster, *postmaster.children(recursive=True)]


@contextmanager
def frozen(data_dir: Path) -> Iterator[None]:
    """SIGSTOP every process of the server (as a hung host or a stalled disk would), SIGCONT at the end."""
    processes = postgres_processes(data_dir)
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        outcome: object = call()
    except CoordinatorRpcError as error:
        outcome = error
    return outcome, time.monotonic() - started


def http_json(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as error:
        return dict(json.load(error))


def test_a_frozen_metastore_is_answered_unavailable_within_seconds(
    own_postgres: tuple[str, Path], tmp_path: Path
) -> None:
    """On-call review: a frozen PostgreSQL hung /readyz for more than 10 s and gave writers DEADLINE_EXCEEDED after
    30 s (the client retries only UNAVAILABLE)."""
    url, data_dir = own_postgres
    coordinator = CoordinatorProcess(database_url=url, data_dir=tmp_path / "coordinator").start(
        SINK_COORDINATOR_METASTORE_STALL_SECONDS="1"
    )
    try:
        with coordinator.client(retry_seconds=0, timeout_seconds=30) as client:
            writer = client.register_writer("orders", "db.orders", -1, arrow_schema=SCHEMA)
            client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
            later = write_parquet(writer.table_location, orders(5, 5))
            with frozen(data_dir):
                outcome, seconds = timed(lambda: client.pre_commit("orders", 1, writer.writer_term, [later]))
                assert isinstance(outcome, CoordinatorRpcError), outcome
                assert outcome.code == grpc.StatusCode.UNAVAILABLE and seconds < 5, (outcome, seconds)
                outcome, seconds = timed(lambda: client.sink_state("orders"))
                assert isinstance(outcome, CoordinatorRpcError) and seconds < 5, (outcome, seconds)
                started = time.monotonic()
                ready = http_json(f"{coordinator.http_url}/readyz")
                assert time.monotonic() - started < 5
                # A blip: still ready (every replica shares it), saying so.
                assert ready["ready"] is True and "not answering" in str(ready["checks"]), ready
            # It answers again: the writer's retry goes through.
            with coordinator.client(retry_seconds=30) as retrying:
                assert retrying.pre_commit("orders", 1, writer.writer_term, [later]).outcome.value == "PERSISTED"
                assert retrying.commit_checkpoint("orders", 1, writer.writer_term, wait=True).committed_epoch == 1
    finally:
        coordinator.stop()


@pytest.fixture
def stopped_postgres() -> Iterator[PostgresServer]:
    """A migrated PostgreSQL server of this test's own, stopped: the metastore is down when the coordinator starts."""
    server = PostgresServer(wheel_binaries())
    try:
        server.start()
        migrate(normalize_url(server.url))
        server.stop()
        yield server
    finally:
        server.remove()


def test_a_metastore_down_at_start_is_waited_for_and_served_once_it_is_up(
    stopped_postgres: PostgresServer, tmp_path: Path
) -> None:
    """On-call review: PostgreSQL refused at start, the process exited after 2 s with a 157-line traceback, and the
    pod crash-looped, down for the restart's back-off after PostgreSQL was back. Now it listens first: live, not
    ready, writers answered UNAVAILABLE (which they retry), every attempt one log line; ready once it is up."""
    coordinator = CoordinatorProcess(database_url=stopped_postgres.url, data_dir=tmp_path / "coordinator")
    coordinator.start(wait_serving=False)
    try:
        retrying = coordinator.wait_for_log("the metastore (or the catalog) is not reachable yet; retrying", attempt=2)
        assert retrying["level"] == "warning" and "refused" in retrying["error"], retrying
        assert http_json(f"{coordinator.http_url}/healthz") == {"status": "ok"}
        ready = http_json(f"{coordinator.http_url}/readyz")
        assert ready["ready"] is False and "not reachable yet" in str(ready["checks"]), ready
        assert "sink_coordinator_metastore_up 0.0" in http_text(f"{coordinator.http_url}/metrics")
        with coordinator.client(retry_seconds=0, timeout_seconds=10) as client:
            outcome, seconds = timed(lambda: client.sink_state("orders"))
            assert isinstance(outcome, CoordinatorRpcError), outcome
            assert outcome.code == grpc.StatusCode.UNAVAILABLE and seconds < 2, (outcome, seconds)
            assert "the coordinator is starting: its metastore is not reachable yet" in outcome.message

        stopped_postgres.start()
        coordinator.wait_serving()
        assert http_json(f"{coordinator.http_url}/readyz")["ready"] is True
        with coordinator.client() as client:
            writer = client.register_writer("orders", "db.orders", -1, arrow_schema=SCHEMA)
            client.pre_commit("orders", 0, writer.writer_term, [write_parquet(writer.table_location, orders(0, 5))])
            assert client.commit_checkpoint("orders", 0, writer.writer_term, wait=True).committed_epoch == 0
    finally:
        coordinator.stop()
    assert coordinator.process is not None and coordinator.process.returncode == 0
    lines = coordinator.drain_logs()
    assert not [line for line in lines if "Traceback" in json.dumps(line)], lines
    assert [line["event"] for line in lines if line.get("level") in ("error", "critical")] == []


def test_a_metastore_restarted_under_a_streaming_writer_costs_it_no_call_longer_than_5_s_and_no_epoch(
    stopped_postgres: PostgresServer, tmp_path: Path
) -> None:
    """Issue 27.2's goal, failover: PostgreSQL (the metastore, and the SQL catalog in it) stopped and started again on
    the same port while a writer keeps calling through the real client: every call is answered, or refused
    UNAVAILABLE within 5 s (which the writer makes again); the coordinator process never exits; every epoch the
    writer wrote is committed once once PostgreSQL is back."""
    stopped_postgres.start()
    coordinator = CoordinatorProcess(database_url=stopped_postgres.url, data_dir=tmp_path / "coordinator").start()
    pid = coordinator.process.pid if coordinator.process else None
    try:
        with coordinator.client(retry_seconds=0, timeout_seconds=30) as client:
            writer = StreamingWriter(client).start()
            writer.wait_for(lambda w: w.epochs >= 3, "epochs before the restart")
            stopped_postgres.stop()
            # Down long enough for the watch to say so: the calls are refused at once from then on.
            coordinator.wait_for_log("the metastore does not answer")
            refused = len(writer.unavailable())
            writer.wait_for(lambda w: len(w.unavailable()) > refused, "a call refused while the metastore is down")
            stopped_postgres.start()
            back = writer.epochs
            writer.wait_for(lambda w: w.epochs >= back + 3, "epochs once PostgreSQL is back")
            epochs = writer.stop()
        assert writer.failure is None, writer.failure
        assert coordinator.process is not None and coordinator.process.poll() is None
        assert coordinator.process.pid == pid
        slowest = max(writer.calls, key=lambda call: call.seconds)
        assert slowest.seconds < 5, slowest
        assert {call.code for call in writer.calls} <= {None, grpc.StatusCode.UNAVAILABLE}, writer.calls
        with coordinator.client() as client:
            last = client.commit_checkpoint("orders", epochs - 1, writer.writer_term, wait=True)
        assert last.committed_epoch == epochs - 1
        catalog = load_catalog(
            "default",
            type="sql",
            uri=stopped_postgres.url,
            warehouse=(tmp_path / "coordinator" / "warehouse").as_uri(),
        )
        assert table_order_ids(catalog.load_table("db.orders")) == list(range(epochs * ROWS_PER_EPOCH))
    finally:
        coordinator.stop()
    assert coordinator.process.returncode == 0


def test_a_metastore_frozen_at_start_fails_each_attempt_in_seconds(
    own_postgres: tuple[str, Path], tmp_path: Path
) -> None:
    """On-call review: with a frozen PostgreSQL the start took 132 s to fail (its checks had no connect timeout).
    Each attempt now gives up after DATABASE_CONNECT_TIMEOUT_SECONDS, the probes answer meanwhile, and the
    process serves once the server thaws."""
    url, data_dir = own_postgres
    coordinator = CoordinatorProcess(database_url=url, data_dir=tmp_path / "coordinator")
    with frozen(data_dir):
        started = time.monotonic()
        coordinator.start(wait_serving=False, SINK_COORDINATOR_DATABASE_CONNECT_TIMEOUT_SECONDS="2")
        try:
            retrying = coordinator.wait_for_log(
                "the metastore (or the catalog) is not reachable yet; retrying", timeout=30, attempt=2
            )
            assert time.monotonic() - started < 20, retrying
            assert http_json(f"{coordinator.http_url}/healthz") == {"status": "ok"}
            assert http_json(f"{coordinator.http_url}/readyz")["ready"] is False
        except BaseException:
            coordinator.stop()
            raise
    try:
        coordinator.wait_serving()
        assert http_json(f"{coordinator.http_url}/readyz")["ready"] is True
    finally:
        coordinator.stop()


def test_a_start_no_retry_can_fix_is_one_json_line_and_a_failure(stopped_postgres: PostgresServer) -> None:
    """A metastore at a schema this release cannot run on is no outage: the start ends at once, in one JSON line
    where JSON logs were asked for (a log pipeline reads it), exit 1."""
    stopped_postgres.start()
    query(stopped_postgres.url, "UPDATE alembic_version SET version_num = '0001'")
    result = subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", "serve", "--grpc-port", "0", "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "SINK_COORDINATOR_DATABASE_URL": stopped_postgres.url,
            "SINK_COORDINATOR_LOG_FORMAT": "json",
        },
    )
    assert result.returncode == 1, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line JSON: no traceback
    assert lines[-1]["event"] == "cannot serve" and lines[-1]["level"] == "error", lines
    assert "run `sink-coordinator migrate`" in lines[-1]["error"], lines[-1]


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())
