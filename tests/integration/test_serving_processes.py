"""Several serving processes behind one pair of ports (PROCESSES > 1, coordinator_service.supervisor): real processes on
the test's PostgreSQL, writers reaching them through one port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog import Catalog
from sqlalchemy.engine import make_url

from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from tests.fixtures.coordinator import (
    ORDERS,
    CoordinatorProcess,
    coordinator_cli,
    orders,
    table_order_ids,
    write_parquet,
)
from tests.fixtures.postgres import query
from tests.fixtures.service_proxy import ServiceProxy

SCHEMA = ORDERS.serialize().to_pybytes()
PROCESSES = 2
# The kernel hands each new connection to one of the processes, by a hash of its addresses: a fixed number of them
# can all land on one (ten: once in 512 runs, more often when gRPC keeps a closed channel's connection for the next).
# A test that must see every process take its calls goes on with more epochs until they have, at most this many.
MOST_EPOCHS = 60


def start_processes(factory: Callable[..., CoordinatorProcess], **env: str) -> CoordinatorProcess:
    """A coordinator of PROCESSES serving processes, each of them serving."""
    coordinator = factory(SINK_COORDINATOR_PROCESSES=str(PROCESSES), **env)
    for index in range(PROCESSES):
        coordinator.wait_for_log("sink-coordinator serving", timeout=60, process=index)
    return coordinator


def serving_pids(coordinator: CoordinatorProcess) -> dict[int, int]:
    """The pid of each serving process, as the supervisor last started it."""
    return {
        record["process"]: record["pid"]
        for record in coordinator.drain_logs()
        if record.get("event") == "serving process started"
    }


def logged_by(coordinator: CoordinatorProcess, event: str, sink: str) -> set[int]:
    """The processes that logged `event` of `sink`."""
    return {
        record["process"]
        for record in coordinator.drain_logs()
        if record.get("event") == event and record.get("sink") == sink
    }


def epochs_until_every_process(
    coordinator: CoordinatorProcess, event: str, sink: str, run_epoch: Callable[[int], object], least: int
) -> int:
    """Run epochs 0, 1, ... with `run_epoch`: at least `least`, then until every process has logged `event` of
    `sink`. The number of epochs run."""
    epoch = 0
    while epoch < least or logged_by(coordinator, event, sink) != set(range(PROCESSES)):
        assert epoch < MOST_EPOCHS, f"{event!r} of {sink} after {epoch} epochs: {logged_by(coordinator, event, sink)}"
        run_epoch(epoch)
        epoch += 1
    return epoch


def stream(coordinator: CoordinatorProcess, sink: str, epochs: range, term: int, location: str) -> None:
    """Each epoch's pre-commit and checkpoint over a connection of their own: the kernel hands each connection to
    one of the processes, so one writer's consecutive calls land on any of them."""
    for epoch in epochs:
        with coordinator.client() as client:
            client.pre_commit(sink, epoch, term, [write_parquet(location, orders(epoch * 10, 10))])
        with coordinator.client() as client:
            client.commit_checkpoint(sink, epoch, term, wait=epoch % 5 == 4)


def register(coordinator: CoordinatorProcess, sink: str) -> tuple[int, str]:
    with coordinator.client() as client:
        writer = client.register_writer(sink, f"shop.{sink}", -1, arrow_schema=SCHEMA)
    return writer.writer_term, writer.table_location


def test_processes_serve_one_writer_through_one_port(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog
) -> None:
    """Both processes take connections, and a writer whose calls alternate between them streams exactly once."""
    coordinator = start_processes(coordinator_factory)
    term, location = register(coordinator, "spread")
    epochs = epochs_until_every_process(
        coordinator,
        "pre-commit persisted",
        "spread",
        lambda epoch: stream(coordinator, "spread", range(epoch, epoch + 1), term, location),
        least=20,
    )
    with coordinator.client() as client:
        assert client.commit_checkpoint("spread", epochs - 1, term, wait=True).committed_epoch == epochs - 1
    assert table_order_ids(catalog.load_table("shop.spread")) == list(range(epochs * 10))
    assert logged_by(coordinator, "pre-commit persisted", "spread") == set(range(PROCESSES))


def test_a_stream_stays_exactly_once_when_a_process_is_killed(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog
) -> None:
    """kill -9 of a serving process mid-stream: the writer's calls go on (to the other process, retried), the
    supervisor starts the killed one again, and every epoch is in the table once."""
    coordinator = start_processes(coordinator_factory)
    term, location = register(coordinator, "killed")
    stream(coordinator, "killed", range(10), term, location)
    killed = serving_pids(coordinator)[1]
    os.kill(killed, signal.SIGKILL)
    stream(coordinator, "killed", range(10, 20), term, location)
    ended = coordinator.wait_for_log("a serving process ended unexpectedly; starting it again", process=1)
    assert ended["exit_status"] == -signal.SIGKILL
    restarted = coordinator.wait_for_log("serving process started", timeout=60, since=coordinator.logs.index(ended))
    assert restarted["process"] == 1 and restarted["pid"] != killed
    coordinator.wait_for_log("sink-coordinator serving", timeout=60, since=coordinator.logs.index(restarted), process=1)
    stream(coordinator, "killed", range(20, 30), term, location)
    with coordinator.client() as client:
        assert client.commit_checkpoint("killed", 29, term, wait=True).committed_epoch == 29
    assert table_order_ids(catalog.load_table("shop.killed")) == list(range(300))
    assert coordinator.process is not None and coordinator.process.poll() is None


def answers_until_serving(coordinator: CoordinatorProcess, index: int, since: int) -> list[tuple[str, object]]:
    """/readyz and gRPC's health Check, each over a new connection (the kernel hands each to any process listening),
    asked again and again until process `index` logs that it serves (from the `since`th log line on)."""
    answers: list[tuple[str, object]] = []
    health = f"127.0.0.1:{coordinator.grpc_port}"
    while not any(
        record.get("event") == "sink-coordinator serving" and record.get("process") == index
        for record in coordinator.drain_logs()[since:]
    ):
        ready = httpx.get(f"{coordinator.http_url}/readyz", timeout=10)
        answers.append(("readyz", (ready.status_code, ready.json())))
        with grpc.insecure_channel(health) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        answers.append(("health", health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)))
    return answers


def test_a_coordinator_that_serves_never_answers_from_a_process_still_starting(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """Once one process serves, every connection reaches a serving one: while the others start (at first, or after a
    kill -9), they do not listen yet. Before, a starting process listened at once, and a probe or a newcomer's
    `curl /readyz` right after `serve` was up could reach it and read 503, "not reachable yet: connecting to it"."""
    coordinator = coordinator_factory(SINK_COORDINATOR_PROCESSES=str(PROCESSES))  # returns once one serves
    first = coordinator.wait_for_log("sink-coordinator serving", timeout=60)
    other = 1 - first["process"]
    answers = answers_until_serving(coordinator, other, since=0)
    killed = serving_pids(coordinator)[first["process"]]
    since = len(coordinator.drain_logs())
    os.kill(killed, signal.SIGKILL)
    restarted = coordinator.wait_for_log("serving process started", timeout=60, since=since)
    assert restarted["pid"] != killed
    restarting = answers_until_serving(coordinator, first["process"], since=coordinator.logs.index(restarted))
    assert len(restarting) > 10  # asked all the while the restarted process opened its runtime
    ready = (HTTPStatus.OK, {"ready": True, "checks": {"metastore": "ok", "catalog": "ok", "warehouse": "ok"}})
    assert {answer for kind, answer in answers + restarting if kind == "health"} <= {"SERVING"}
    assert [answer for kind, answer in answers + restarting if kind == "readyz" and answer != ready] == []


def listening_pids(port: int) -> set[int]:
    """The processes listening on 127.0.0.1:`port` (the supervisor's own socket there is bound, not listening)."""
    return {
        connection.pid
        for connection in psutil.net_connections(kind="tcp")
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid is not None
    }


def first_listeners(port: int, timeout: float = 60.0) -> set[int]:
    """The processes that listen on `port` first, once one does."""
    deadline = time.monotonic() + timeout
    while not (listening := listening_pids(port)):
        assert time.monotonic() < deadline, f"nothing listened on {port} in {timeout} s"
        time.sleep(0.01)  # the kernel's socket table: nothing to await
    return listening


def test_the_ports_keep_a_listener_when_the_last_serving_process_dies_beside_one_still_starting(
    database_url: str, tmp_path: Path
) -> None:
    """kill -9 of the last serving process while the other one is starting again and cannot reach the metastore (an
    outage cut it off): the starting one is told to listen at once, and probes and writers reach it (live, not ready;
    UNAVAILABLE) instead of a port that refuses them. Before, nothing listened until the killed process was started
    again (after its back-off and its imports) and listened while it started."""
    metastore = make_url(database_url)
    migrate(normalize_url(database_url))
    socket_directory = metastore.query.get("host")
    # The test's PostgreSQL: on a Unix socket (embedded), or on 127.0.0.1.
    endpoint: int | str = (
        f"{socket_directory}/.s.PGSQL.{metastore.port or 5432}"
        if isinstance(socket_directory, str)
        else metastore.port or 5432
    )
    path = ServiceProxy()
    path.set_endpoints([endpoint])
    through_path = metastore.set(
        host="127.0.0.1", port=path.port, query={k: v for k, v in metastore.query.items() if k != "host"}
    )
    coordinator = CoordinatorProcess(
        database_url=through_path.render_as_string(hide_password=False),
        data_dir=tmp_path / "coordinator",
        extra_env={"SINK_COORDINATOR_PROCESSES": str(PROCESSES)},
    )
    try:
        coordinator.start()
        for index in range(PROCESSES):
            coordinator.wait_for_log("sink-coordinator serving", timeout=60, process=index)
        pids = serving_pids(coordinator)
        path.set_endpoints([])  # the outage: no new connection reaches the metastore
        since = len(coordinator.drain_logs())
        os.kill(pids[1], signal.SIGKILL)
        retrying = "the metastore (or the catalog) is not reachable yet; retrying"
        coordinator.wait_for_log(retrying, timeout=60, since=since, process=1)
        starting = serving_pids(coordinator)[1]
        assert listening_pids(coordinator.http_port) == {pids[0]}  # the starting one listens once it serves
        killed = psutil.Process(pids[0])
        killed.kill()
        killed.wait(timeout=60)  # its sockets are gone with it
        assert first_listeners(coordinator.http_port) == {starting}
        assert first_listeners(coordinator.grpc_port) == {starting}
        live = httpx.get(f"{coordinator.http_url}/healthz", timeout=10)
        assert live.status_code == HTTPStatus.OK
        path.set_endpoints([endpoint])  # the outage is over: both serve again
        for index in range(PROCESSES):
            coordinator.wait_for_log("sink-coordinator serving", timeout=60, since=since, process=index)
        assert httpx.get(f"{coordinator.http_url}/readyz", timeout=10).status_code == HTTPStatus.OK
    finally:
        coordinator.stop()
        path.close()


def test_one_resume_resumes_a_sink_stuck_in_every_process(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str
) -> None:
    """A commit no retry can fix sticks the sink in each process that tries it. Every process's answer says stuck,
    and one POST .../resume, reaching one process, resumes them all. Before, the stuck state and the resume were
    the answering process's: the other one went on saying stuck, and committing nothing, until a resume reached it."""
    coordinator = start_processes(coordinator_factory)
    term, location = register(coordinator, "stuck")
    with coordinator.client() as client:
        client.pre_commit("stuck", 0, term, [write_parquet(location, orders(0, 10))])
    [(record,)] = query(database_url, "SELECT metadata FROM pending_sink_state WHERE epoch = 0")
    query(database_url, "UPDATE pending_sink_state SET metadata = 'not json' WHERE epoch = 0")
    with coordinator.client() as client:
        client.commit_checkpoint("stuck", 0, term, wait=False)
    for index in range(PROCESSES):  # each poller takes the sink up, under the commit lock in turn
        coordinator.wait_for_log(
            "the sink's commits cannot succeed by retrying; they wait for an operator to fix the cause and resume the "
            "sink (POST /api/v1/sinks/<name>/resume)",
            timeout=60,
            process=index,
        )
    assert committer_states(coordinator, "stuck") == {"stuck"}
    query(database_url, "UPDATE pending_sink_state SET metadata = %s WHERE epoch = 0", record)  # the fix
    resumed = httpx.post(f"{coordinator.http_url}/api/v1/sinks/stuck/resume", timeout=60)
    assert resumed.status_code == 200, resumed.text
    with coordinator.client() as client:
        client.pre_commit("stuck", 1, term, [write_parquet(location, orders(10, 10))])
        assert client.commit_checkpoint("stuck", 1, term, wait=True).committed_epoch == 1
    # Every process's committer is back: each commits the sink's next epochs when it wins the lock.
    epochs_until_every_process(
        coordinator,
        "epochs committed",
        "stuck",
        lambda epoch: stream(coordinator, "stuck", range(epoch + 2, epoch + 3), term, location),
        least=1,
    )
    assert "stuck" not in committer_states(coordinator, "stuck")
    scrapes = [httpx.get(f"{coordinator.http_url}/metrics", timeout=10).text for _ in range(10)]
    assert {counted(text, "sink_coordinator_committer_stuck", sink="stuck") for text in scrapes} == {0}


def committer_states(coordinator: CoordinatorProcess, sink: str) -> set[str]:
    """The committer states the sink's answers gave, over 21 new connections (spread over the serving processes)."""
    return {
        httpx.get(f"{coordinator.http_url}/api/v1/sinks/{sink}", timeout=10).json()["committer"]["state"]
        for _ in range(21)
    }


def test_a_writer_restarted_through_another_process_fences_its_old_term(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog
) -> None:
    """Each call over a connection of its own: a writer's restart registered by one process fences the old term on
    every other (what a process read of the sink before is not trusted)."""
    coordinator = start_processes(coordinator_factory)
    term, location = register(coordinator, "restarted")

    def restart_after(epoch: int) -> None:
        nonlocal term
        stream(coordinator, "restarted", range(epoch, epoch + 1), term, location)
        with coordinator.client() as client:
            new_term = client.register_writer("restarted", "shop.restarted", epoch, arrow_schema=SCHEMA).writer_term
        assert new_term > term
        with coordinator.client() as client, pytest.raises(CoordinatorRpcError) as fenced:
            client.pre_commit("restarted", epoch + 1, term, [write_parquet(location, orders(0, 1))])
        assert fenced.value.code == grpc.StatusCode.FAILED_PRECONDITION
        term = new_term

    epochs = epochs_until_every_process(coordinator, "checkpoint recorded", "restarted", restart_after, least=8)
    with coordinator.client() as client:
        assert client.commit_checkpoint("restarted", epochs - 1, term, wait=True).committed_epoch == epochs - 1
    assert table_order_ids(catalog.load_table("shop.restarted")) == list(range(epochs * 10))
    assert logged_by(coordinator, "checkpoint recorded", "restarted") == set(range(PROCESSES))


def test_a_multi_writer_epoch_completes_across_processes(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog
) -> None:
    """Two writers of one epoch, each over its own connection: wherever their parts land, both calls answer
    PERSISTED and the epoch is committed once with both parts."""
    coordinator = start_processes(coordinator_factory)
    with coordinator.client() as client:
        writer = client.register_writer("pair", "shop.pair", -1, writer_count=2, arrow_schema=SCHEMA)

    def part(epoch: int, writer_id: int) -> PreCommitOutcome:
        rows = orders(epoch * 10 + writer_id * 5, 5)
        with coordinator.client() as client:
            files = [write_parquet(writer.table_location, rows)]
            return client.pre_commit("pair", epoch, writer.writer_term, files, writer_id=writer_id).outcome

    with ThreadPoolExecutor(2) as pool:

        def both_parts(epoch: int) -> None:
            outcomes = list(pool.map(part, [epoch, epoch], [0, 1]))
            assert outcomes == [PreCommitOutcome.PERSISTED] * 2
            with coordinator.client() as client:
                client.commit_checkpoint("pair", epoch, writer.writer_term)

        epochs = epochs_until_every_process(coordinator, "checkpoint recorded", "pair", both_parts, least=10)
    with coordinator.client() as client:
        assert client.commit_checkpoint("pair", epochs - 1, writer.writer_term, wait=True).committed_epoch == epochs - 1
    assert table_order_ids(catalog.load_table("shop.pair")) == list(range(epochs * 10))
    assert logged_by(coordinator, "checkpoint recorded", "pair") == set(range(PROCESSES))


def serve_beside(
    coordinator: CoordinatorProcess, database_url: str, processes: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", "serve"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("SINK_COORDINATOR_")},
            "SINK_COORDINATOR_DATABASE_URL": database_url,
            "SINK_COORDINATOR_GRPC_PORT": str(coordinator.grpc_port),
            "SINK_COORDINATOR_HTTP_PORT": str(coordinator.http_port),
            "SINK_COORDINATOR_PROCESSES": str(processes),
        },
    )


@pytest.mark.parametrize("processes", [1, PROCESSES])
def test_a_second_coordinator_on_the_ports_is_refused(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str, processes: int
) -> None:
    coordinator = start_processes(coordinator_factory)
    second = serve_beside(coordinator, database_url, processes)
    assert second.returncode == 1, second.stderr
    assert f"the HTTP port 127.0.0.1:{coordinator.http_port} is in use" in second.stderr
    # Nothing of the second one listens: every connection still reaches the first's processes.
    assert "sink-coordinator serving" not in second.stderr
    for _ in range(10):
        with coordinator.client() as client:
            client.wait_serving(5)


def test_the_grpc_port_alone_taken_is_refused_too(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str
) -> None:
    coordinator = start_processes(coordinator_factory)
    taken = coordinator.grpc_port
    coordinator.http_port = 0
    second = serve_beside(coordinator, database_url, PROCESSES)
    assert second.returncode == 1, second.stderr
    assert f"the gRPC port 127.0.0.1:{taken} is in use" in second.stderr


def test_sigterm_stops_every_process(coordinator_factory: Callable[..., CoordinatorProcess]) -> None:
    coordinator = start_processes(coordinator_factory)
    pids = serving_pids(coordinator)
    assert len(pids) == PROCESSES
    coordinator.stop()
    assert coordinator.process is not None and coordinator.process.returncode == 0
    for index in range(PROCESSES):
        coordinator.wait_for_log("sink-coordinator stopped", process=index)
    for pid in pids.values():
        assert not Path(f"/proc/{pid}").exists()


def counted(text: str, family: str, **labels: str) -> float:
    return sum(
        sample.value
        for metric in text_string_to_metric_families(text)
        for sample in metric.samples
        if sample.name == family and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_scrape_of_any_process_has_the_whole_coordinators_counts(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    coordinator = start_processes(coordinator_factory)
    register(coordinator, "counted")
    calls = 30
    for _ in range(calls):
        with coordinator.client() as client:
            client.sink_state("counted")
    scrapes = [httpx.get(f"{coordinator.http_url}/metrics", timeout=10).text for _ in range(6)]
    totals = {
        counted(text, "sink_coordinator_grpc_requests_total", method="GetSinkState", code="OK") for text in scrapes
    }
    assert totals == {calls}
    registered = {counted(text, "sink_coordinator_grpc_requests_total", method="RegisterWriter") for text in scrapes}
    assert registered == {1}
    for text in scrapes:
        assert counted(text, "sink_coordinator_build_info") == 1
        assert counted(text, "sink_coordinator_log_reporter") in (0, 1)


def test_a_process_that_cannot_start_ends_the_supervisor(database_url: str, tmp_path: Path) -> None:
    """An unmigrated metastore: each process refuses it, and the supervisor ends with the refusal, its last line,
    instead of starting them again."""
    result = coordinator_cli(
        "serve",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        SINK_COORDINATOR_DATABASE_URL=database_url,
        SINK_COORDINATOR_PROCESSES=str(PROCESSES),
        SINK_COORDINATOR_LOG_FORMAT="json",
    )
    assert result.returncode == 1, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line JSON: no traceback
    refusals = [line for line in lines if line["event"] == "cannot serve"]
    assert refusals == [lines[-1]] and lines[-1]["level"] == "error", lines
    assert "run `sink-coordinator migrate`" in lines[-1]["error"]
    assert not [line for line in lines if "starting it again" in line["event"]]


def test_the_embedded_metastore_serves_every_process(embedded_tmp_path: Path) -> None:
    """No database URL: the supervisor starts and migrates the embedded PostgreSQL once, and its processes use it."""
    coordinator = CoordinatorProcess(database_url=None, data_dir=embedded_tmp_path / ".sink-coordinator")
    coordinator.start(cwd=embedded_tmp_path, SINK_COORDINATOR_PROCESSES=str(PROCESSES))
    try:
        for index in range(PROCESSES):
            coordinator.wait_for_log("sink-coordinator serving", timeout=60, process=index)
        assert [record["event"] for record in coordinator.logs].count("embedded metastore migrated") == 1
        term, location = register(coordinator, "local")
        stream(coordinator, "local", range(4), term, location)
        with coordinator.client() as client:
            assert client.commit_checkpoint("local", 3, term, wait=True).committed_epoch == 3
    finally:
        coordinator.stop()
    assert coordinator.process is not None and coordinator.process.returncode == 0
