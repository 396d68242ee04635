"""The Spark driver JVM that PySpark starts for a session of this process: SIGTERM left to the Python driver, and
Spark's own log in a file.

PySpark starts the JVM with SIGINT ignored, so that Ctrl-C, which a terminal sends to the whole process group,
reaches the Python driver alone, which stops the query between two batches (spark_writer.stop_signals). `timeout`,
systemd and process supervisors send SIGTERM to the whole group too, and the JVM took it: its shutdown hook stopped
the SparkContext under the running batch, every py4j call of the driver failed after that, and the job ended in
hundreds of lines of tracebacks. So the JVM starts with SIGTERM ignored as well (a signal ignored at exec stays
ignored, and the JVM then installs no handler for it). A second signal still ends the driver at once, and the JVM
with it: it exits when its stdin, a pipe from the driver, closes.

A shell ignores both signals and executes PySpark's command in its place, rather than PySpark's `preexec_fn` (which
ignores SIGINT) and one of ours: a `preexec_fn` makes Python fork the driver instead of vfork-ing it, and the job
calls the coordinator over gRPC before it starts Spark; a fork of a process where gRPC has run can hang in the child
before it executes anything (grpc/grpc#37259, the fork handlers gRPC registers). vfork runs no fork handlers.

Spark's log (log4j: its warnings, and each failed task attempt with its Python and Java stack traces), py4j's and
the whole of an error the job cannot name go to a file (SparkLog): the job's own output says what failed and how to
go on, in one line at its end.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark import java_gateway

# spark_writer/spark-log4j2.properties reads the two system properties.
LOG4J_CONFIGURATION: Final = Path(__file__).with_name("spark-log4j2.properties")
LOG_FILE_PROPERTY: Final = "sink_writer.spark_log_file"
CONSOLE_LEVEL_PROPERTY: Final = "sink_writer.spark_console_level"


# `sh -c SCRIPT command args...`: the command executed in the shell's place with SIGINT and SIGTERM ignored.
IGNORING_STOP_SIGNALS: Final = ("/bin/sh", "-c", 'trap "" INT TERM; exec "$0" "$@"')


@contextmanager
def jvm_ignoring_sigterm() -> Iterator[None]:
    """Within: a JVM that PySpark starts ignores SIGTERM besides SIGINT (PySpark's own `preexec_fn` for it, which
    only ignores SIGINT, is replaced by the shell that ignores both: see the module's docstring)."""
    launch = java_gateway.Popen  # type: ignore[attr-defined]

    def popen(command: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.pop("preexec_fn", None)
        return launch([*IGNORING_STOP_SIGNALS, *command], **kwargs)

    java_gateway.Popen = popen  # type: ignore[attr-defined, assignment]
    try:
        yield
    finally:
        java_gateway.Popen = launch  # type: ignore[attr-defined]


def _java_option(name: str, value: str) -> str:
    """`-Dname=value`, quoted as Spark's launcher splits spark.driver.extraJavaOptions (spaces, quotes)."""
    escaped = f"-D{name}={value}".replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@dataclass(frozen=True)
class SparkLog:
    """Where the driver JVM's log, py4j's and an error the job cannot name go: `path` (appended to), and the console
    too when `on_console`."""

    path: Path
    on_console: bool = False

    @staticmethod
    def default_path(sink: str) -> Path:
        """sink-writer-<sink>.log in the temporary directory (a sink name is a file name: its policy says so)."""
        return Path(tempfile.gettempdir()) / f"sink-writer-{sink}.log"

    def check(self) -> None:
        """ValueError when the file cannot be appended to (a directory, a missing one, no permission) or its name
        would be read by log4j as a look-up (`${...}`)."""
        if "${" in str(self.path):
            raise ValueError(f"{str(self.path)!r} holds '${{', which log4j would read as a look-up: rename it")
        try:
            with self.path.open("a", encoding="utf-8"):
                pass
        except OSError as error:
            raise ValueError(f"cannot write {str(self.path)!r}: {error.strerror or error}") from None

    def java_options(self) -> str:
        """The driver JVM's options (spark.driver.extraJavaOptions) that send its log4j output here."""
        return " ".join(
            (
                _java_option("log4j2.configurationFile", str(LOG4J_CONFIGURATION)),
                _java_option(LOG_FILE_PROPERTY, str(self.path.absolute())),
                _java_option(CONSOLE_LEVEL_PROPERTY, "warn" if self.on_console else "off"),
            )
        )

    def append_error(self, error: BaseException) -> None:
        """The whole of an error that ended the run, its traceback and causes (no local variables)."""
        with self.path.open("a", encoding="utf-8") as log_file:
            log_file.write("".join(traceback.format_exception(error)))

    def capture_py4j(self) -> None:
        """py4j's log records (an exception raised by a foreachBatch call, with its traceback) to the file too, and
        to the console only when `on_console`."""
        handler = logging.FileHandler(self.path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        py4j = logging.getLogger("py4j")
        py4j.addHandler(handler)
        py4j.propagate = self.on_console
