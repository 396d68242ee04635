"""What every benchmark part needs: a PostgreSQL server, fresh databases, the real coordinator process,
Parquet files under a table location, latency statistics and the machine's facts.

Everything runs on this machine only (loopback addresses), bounded in time.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql
from sqlalchemy.engine import make_url

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.log.database import libpq_url, normalize_url
from coordinator_service.log.embedded import start_embedded_postgres, stop_embedded_postgres
from coordinator_service.runtime import migrate
from sink_coordinator_demo.ports import free_port

ORDERS = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)


class Postgres:
    """One embedded PostgreSQL server (default settings: fsync on, synchronous_commit on) for the whole run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.url = start_embedded_postgres(self.data)

    def restart_with(self, settings: dict[str, str]) -> None:
        """Set these server settings (ALTER SYSTEM) and restart the server with them."""
        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            for name, value in settings.items():
                connection.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        stop_embedded_postgres(self.data)
        self.url = start_embedded_postgres(self.data)

    def settings(self) -> dict[str, str]:
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "max_connections",
            "shared_buffers",
        )
        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            return {name: str(connection.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]

    def new_database(self, prefix: str = "bench") -> str:
        """A new empty database with the coordinator's schema; returns its SQLAlchemy URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        url = make_url(self.url).set(database=name).render_as_string(hide_password=False)
        migrate(normalize_url(url))
        return url

    def stop(self) -> None:
        stop_embedded_postgres(self.data)


@dataclass
class Coordinator:
    """The real `sink-coordinator serve` process (its log goes to a file, not through this process)."""

    database_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def warehouse(self) -> Path:
        return self.data_dir / "warehouse"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "coordinator.log"

    def start(self, wait: bool = True) -> Coordinator:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SINK_COORDINATOR_")},
            "SINK_COORDINATOR_DATABASE_URL": self.database_url,
            "SINK_COORDINATOR_DATA_DIR": str(self.data_dir),
            "SINK_COORDINATOR_GRPC_PORT": str(self.grpc_port),
            "SINK_COORDINATOR_HTTP_PORT": str(self.http_port),
            "SINK_COORDINATOR_LOG_FORMAT": "json",
            # Each part measures one thing: commits at once, no maintenance run in the middle (a part that
            # measures coalescing or maintenance sets its own).
            "SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS": "0",
            "SINK_COORDINATOR_MAINTENANCE_ENABLED": "false",
            # One serving process: the figures of a part do not depend on the machine's cores unless it says so.
            "SINK_COORDINATOR_PROCESSES": "1",
            **self.env,
        }
        with self.log_path.open("ab") as log_file:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "coordinator_service.cli", "serve"],
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 60.0) -> float:
        """Block until gRPC health answers SERVING; return the seconds since start()."""
        with CoordinatorClient(self.target) as client:
            client.wait_serving(timeout, self._check_alive)
        return time.monotonic() - self.started_at

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"coordinator exited with {self.process.returncode}; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextmanager
def running(coordinator: Coordinator) -> Iterator[Coordinator]:
    coordinator.start()
    try:
        yield coordinator
    finally:
        coordinator.stop()


@contextmanager
def py_spy(pid: int, output: Path, enabled: bool, rate: int = 100) -> Iterator[None]:
    """Sample a process with py-spy (when installed and enabled) into a speedscope JSON file."""
    executable = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not enabled or not Path(executable).exists():
        yield
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [executable, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def top_frames(raw_profile: Path, limit: int = 12) -> list[tuple[str, float]]:
    """From a py-spy raw (collapsed) profile: the share of samples in which each function appears, top first.

    Only this project's functions and a few library hot spots are kept, to read like the inclusive
    column of a profiler.
    """
    if not raw_profile.exists():
        return []
    total = 0
    inclusive: dict[str, int] = {}
    for line in raw_profile.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        seen: set[str] = set()
        for frame in stack.split(";"):
            name = frame.split(" (")[0].strip()
            where = frame[frame.find("(") + 1 : frame.rfind(":")] if "(" in frame else ""
            if "coordinator_service" not in where and not any(
                key in where for key in ("pyiceberg", "sqlalchemy", "psycopg", "grpc", "structlog", "pyarrow")
            ):
                continue
            module = where.rsplit("/", 1)[-1]
            label = f"{module}:{name}"
            if label not in seen:
                seen.add(label)
                inclusive[label] = inclusive.get(label, 0) + count
    if total == 0:
        return []
    ranked = sorted(inclusive.items(), key=lambda item: -item[1])[:limit]
    return [(label, count / total) for label, count in ranked]


async def register_orders_sink(
    stub: pb_grpc.SinkCoordinatorAsyncStub, sink: str, table: str
) -> pb.RegisterWriterResponse:
    """RegisterWriter of a sink with no checkpoint yet, on an ORDERS table the coordinator creates if missing."""
    return await stub.RegisterWriter(
        pb.RegisterWriterRequest(
            sink=sink, table=table, checkpointed_epoch=-1, arrow_schema=ORDERS.serialize().to_pybytes()
        )
    )


def write_orders_file(location: str, rows: int, first: int = 0, name: str = "") -> str:
    """One Parquet file of `rows` orders under the table location's data/ (as an executor writes it)."""
    directory = Path(location.removeprefix("file://")) / "data"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or uuid.uuid4().hex}.parquet"
    ids = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table(
        {
            "order_id": ids,
            "customer": pa.array([f"c{i % 7}" for i in range(rows)], pa.string()),
            "amount": ids.astype(np.float64) * 1.5,
        },
        schema=ORDERS,
    )
    pq.write_table(table, path)
    return path.as_uri()


# How a pre-commit names a file: its path alone (the coordinator reads the footer), or with its footer and size, as
# the Spark writer sends it (the coordinator checks the file with one metadata request).
FOOTER_MODES = ("read", "sent")


def data_file_message(path: str, footers: str, footer: tuple[bytes, int] | None = None) -> pb.DataFile:
    """A file as an old writer names it (footers "read") or as the Spark writer sends it ("sent"; `footer`: its bytes
    and the file's size when the caller has them, else read from the local file)."""
    if footers == "read":
        return pb.DataFile(path=path)
    parquet_footer, size = footer or local_footer(path)
    return pb.DataFile(path=path, parquet_footer=parquet_footer, file_size_in_bytes=size)


def local_footer(path: str) -> tuple[bytes, int]:
    """A local Parquet file's footer as PreCommit takes it (a standalone metadata file), and the file's size."""
    local = path.removeprefix("file://")
    buffer = pa.BufferOutputStream()
    pq.read_metadata(local).write_metadata_file(buffer)
    return buffer.getvalue().to_pybytes(), os.path.getsize(local)


def linked_copy(uri: str) -> str:
    """The same Parquet file under a new name (a hard link: no data written), for one more epoch. The
    coordinator refuses a file another epoch already holds, so every pre-commit names files of its own."""
    source = Path(uri.removeprefix("file://"))
    target = source.with_name(f"{uuid.uuid4().hex}.parquet")
    os.link(source, target)
    return target.as_uri()


async def timed_epoch(
    stub: Any,
    sink: str,
    term: int,
    epoch: int,
    files: Sequence[pb.DataFile],
    rpc_seconds: float,
    files_directory: str = "",
) -> tuple[float, float]:
    """Seconds of one epoch's PreCommit of `files`, then of its CommitCheckpoint(wait) until COMMITTED."""
    started = time.monotonic()
    await stub.PreCommit(
        pb.PreCommitRequest(
            sink=sink, epoch=epoch, writer_term=term, data_files=files, files_directory=files_directory
        ),
        timeout=rpc_seconds,
    )
    committing = time.monotonic()
    answer = await stub.CommitCheckpoint(
        pb.CommitCheckpointRequest(sink=sink, epoch=epoch, writer_term=term, wait=True), timeout=rpc_seconds
    )
    committed = time.monotonic() - committing
    assert answer.committed_epoch >= epoch, answer  # a figure of an epoch the wait did not see committed is no figure
    return committing - started, committed


def files_rows(count: int, precommits: dict[str, list[float]], commits: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per footer mode of a files-per-epoch cell: PreCommit and CommitCheckpoint(wait) latencies."""
    return [
        {"files": count, "footers": mode, "precommit": latency_stats(precommits[mode]),
         "commit": latency_stats(commits[mode])}
        for mode in precommits
    ]  # fmt: skip


def cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    """User and system CPU seconds of these processes and all their children so far, those that have ended too (each
    process's waited-for children's times: a PostgreSQL backend whose connection closed, a serving process started
    again), so that a reading never goes back."""
    total = 0.0
    for process in processes:
        for each in (process, *process.children(recursive=True)):
            try:
                times = each.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system + times.children_user + times.children_system
    return total


def postmaster(postgres: Postgres) -> psutil.Process:
    return psutil.Process(int((postgres.data / "postmaster.pid").read_text().split()[0]))


# The processes whose CPU a bench's calls cost, as CpuClock reads them: the coordinator's, PostgreSQL's, and the bench's
# own writers (this process).
CPU_PARTS = ("coordinator", "postgres", "client")


@dataclass
class CpuClock:
    """User and system CPU seconds so far of the coordinators' processes, PostgreSQL's (each with its children) and
    the bench's writers (this process), in CPU_PARTS' order."""

    coordinators: Sequence[psutil.Process]
    postgres: psutil.Process
    here: psutil.Process = field(default_factory=psutil.Process)

    def read(self) -> tuple[float, float, float]:
        times = self.here.cpu_times()
        return cpu_seconds(self.coordinators), cpu_seconds([self.postgres]), times.user + times.system

    def per_call(self, before: tuple[float, float, float], calls: int) -> dict[str, float]:
        """Milliseconds of CPU a call cost each part since `before`, over `calls` calls."""
        return {
            part: 1000 * (after - start) / max(1, calls)
            for part, start, after in zip(CPU_PARTS, before, self.read(), strict=True)
        }


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds (NaN without samples)."""
    if not seconds:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "n": 0}
    values = np.asarray(seconds) * 1000.0
    return {
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
        "max_ms": float(values.max()),
        "n": len(values),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and min/max over repetitions."""
    array = np.asarray(values, dtype=float)
    return {"median": float(np.median(array)), "min": float(array.min()), "max": float(array.max())}


def machine_facts(postgres: Postgres | None) -> dict[str, Any]:
    import pyiceberg

    facts: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pyiceberg": pyiceberg.__version__,
        "grpcio": grpc.__version__,
        "psycopg": psycopg.__version__,
        "pyarrow": pa.__version__,
    }
    try:
        import pyspark

        facts["pyspark"] = pyspark.__version__
    except ImportError:
        facts["pyspark"] = "not installed"
    if postgres is not None:
        settings = postgres.settings()
        facts["postgresql"] = settings.pop("server_version")
        facts["postgresql_settings"] = settings
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def temp_root() -> Path:
    # Not under a root-private directory: the embedded server runs as its own unprivileged user.
    return Path(tempfile.mkdtemp(prefix="sink-coordinator-bench-"))
