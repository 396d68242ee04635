"""The services the demo runs on one machine: the coordinator process and a Kafka-protocol broker.

Both run in process groups of their own, so that Ctrl-C in the terminal reaches
only the demo, which then stops the Spark query before the services it talks to.
Their output goes to log files beside their data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TextIO

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError

STARTUP_TIMEOUT_SECONDS: Final = 120.0
STOP_TIMEOUT_SECONDS: Final = 20.0


class ServiceError(RuntimeError):
    """A local service did not start; the message names its log file."""


def _log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class LocalProcess:
    """A child process in its own process group, logging to a file."""

    def __init__(self, name: str, command: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: TextIO = log_path.open("a")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise ServiceError(
                f"{self.name} exited with status {self.process.returncode}; its log {self.log_path} ends with:\n"
                f"{_log_tail(self.log_path)}"
            )

    def stop(self) -> None:
        """SIGTERM to the whole group (a launcher and what it started), SIGKILL what is left after a grace time."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


class CoordinatorService(LocalProcess):
    """`python -m coordinator_service.cli serve`, configured by SINK_COORDINATOR_* variables."""

    def __init__(self, data_dir: Path, grpc_port: int, http_port: int, settings: Mapping[str, str]) -> None:
        self.grpc_port = grpc_port
        self.http_port = http_port
        env = {
            **os.environ,
            "SINK_COORDINATOR_DATA_DIR": str(data_dir),
            "SINK_COORDINATOR_GRPC_PORT": str(grpc_port),
            "SINK_COORDINATOR_HTTP_PORT": str(http_port),
            **{f"SINK_COORDINATOR_{key.upper()}": value for key, value in settings.items()},
        }
        super().__init__(
            "the coordinator",
            [sys.executable, "-m", "coordinator_service.cli", "serve"],
            data_dir / "logs" / "coordinator.log",
            env,
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_serving(self) -> None:
        """Until the gRPC health service says SERVING, or the process dies."""
        with CoordinatorClient(self.target) as client:
            try:
                client.wait_serving(STARTUP_TIMEOUT_SECONDS, self.check_running)
            except CoordinatorRpcError as error:
                raise ServiceError(f"{error.message}; see {self.log_path}") from error


class NoidaKafkaBroker(LocalProcess):
    """noida-db's Kafka-protocol broker (`noida-db start --only kafka`) on a local port, its data in data_dir and its
    log beside it (data_dir with .log), so that the data can go without the log."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.bootstrap = f"127.0.0.1:{port}"
        beside_python = Path(sys.executable).parent / "noida-db"
        executable = str(beside_python) if beside_python.exists() else shutil.which("noida-db")
        if executable is None:
            raise ServiceError("noida-db is not installed: `pip install noida-db`, or pass --bootstrap-servers")
        super().__init__(
            "the Kafka broker (noida-db)",
            [executable, "start", "--only", "kafka", "--kafka-port", str(port), "--data-dir", str(data_dir)],
            data_dir.with_name(f"{data_dir.name}.log"),
        )

    def wait_ready(self) -> None:
        """Until the broker answers a metadata request."""
        # Refused connections are expected until the broker listens: keep librdkafka's errors about them quiet.
        silent = logging.getLogger("sink_coordinator_demo.local_services.librdkafka")
        silent.setLevel(logging.CRITICAL)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "reconnect.backoff.max.ms": 200}, logger=silent)
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            self.check_running()
            with contextlib.suppress(KafkaException):
                if admin.list_topics(timeout=1.0).brokers:
                    return
        raise ServiceError(f"the Kafka broker did not answer on {self.bootstrap}; see {self.log_path}")
