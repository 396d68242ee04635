"""What the torture runs share: PostgreSQL servers, the broker, the warm Spark driver, the sink's names and limits.

The session (two PostgreSQL servers: the metastore's and the catalog's; a
Kafka-protocol broker; a warm Spark driver and its standby) is shared by the
runs; each run has its own databases, topic, warehouse, Spark checkpoint,
coordinator process(es) and driver(s). Faults that restart a server (the
metastore's, the catalog's, the broker) act on these.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.kafka_broker import _stop, start_broker
from tests.torture.infra import DriverServer, PgServer

SINK = "orders"
TABLE = "torture.orders"
CALL_DEADLINE_SECONDS = 5.0  # the writer's deadline of one coordinator call
RETRY_SECONDS = 25.0  # how long the writer retries UNAVAILABLE (a restart fits in it)
RUN_SECONDS = 300.0  # a run that has not settled by then has an anomaly


@dataclass
class Session:
    """What the runs share: PostgreSQL servers and the broker (restarted faults happen on these)."""

    root: Path
    metastore: PgServer
    catalog: PgServer
    bootstrap: str
    _broker: subprocess.Popen[bytes] | None = None
    _broker_dir: Path | None = None
    _driver: DriverServer | None = None
    _standby: DriverServer | None = None
    driver_processes: int = 0

    def driver(self) -> DriverServer:
        """The warm Spark driver; when the last was killed, the standby (started beforehand) takes over.

        A supervisor restarting a killed driver would start a JVM; the standby has
        started it already, so a run pays the job's restart, not the JVM's start.
        """
        if self._driver is None or not self._driver.alive:
            if self._driver is not None:
                self._driver.stop()
            standby = self._standby
            self._driver, self._standby = (standby if standby is not None and standby.alive else self._spawn()), None
        if self._standby is None or not self._standby.alive:
            self._standby = self._spawn()
        return self._driver

    def _spawn(self) -> DriverServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SINK_COORDINATOR_", "SINK_WRITER_"))}
        self.driver_processes += 1
        return DriverServer(
            [str(CALL_DEADLINE_SECONDS), str(RETRY_SECONDS)], self.root / f"driver-{self.driver_processes}.log", env
        )

    def restart_broker(self, downtime_seconds: float) -> bool:
        """Stop the broker and start it again on its port with its data (False: an external broker)."""
        if self._broker is None or self._broker_dir is None:
            return False
        _stop(self._broker)
        time.sleep(downtime_seconds)  # how long the broker stays down
        self._broker, _ = start_broker(self._broker_dir, int(self.bootstrap.rsplit(":", 1)[1]))
        return True

    @classmethod
    @contextlib.contextmanager
    def open(cls, root: Path | None = None) -> Iterator[Session]:
        # Not under a private tree: the embedded server runs as its own unprivileged user.
        base = root or Path(tempfile.mkdtemp(prefix="sink-coordinator-torture-"))
        base.mkdir(parents=True, exist_ok=True)
        metastore = PgServer(base, "metastore-pg")
        catalog = PgServer(base, "catalog-pg")
        broker: subprocess.Popen[bytes] | None = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not bootstrap:
            broker_dir = base / "noida-db"
            broker_dir.mkdir(parents=True, exist_ok=True)
            broker, bootstrap = start_broker(broker_dir)
        session = cls(base, metastore, catalog, bootstrap, broker, base / "noida-db" if broker else None)
        try:
            yield session
        finally:
            for driver in (session._driver, session._standby):
                if driver is not None:
                    driver.stop()
            if session._broker is not None:
                _stop(session._broker)
            for server in (metastore, catalog):
                with contextlib.suppress(Exception):
                    if not server.running:
                        server.start()
                    server.stop("fast")
            if root is None:
                shutil.rmtree(base, ignore_errors=True)
