"""A Spark standalone cluster from the PySpark wheel: a master and a worker, each its own JVM, on 127.0.0.1.

Executors run in JVMs the worker launches, with Python workers of their own: a job submitted to
``SparkCluster.master_url`` runs where a cluster runs it, not in the driver's process. Used by
`python -m sink_coordinator_demo --cluster` and by the tests' ``spark_cluster`` fixture; a worker takes
about 10 s to register, awaited on the master's own log line. Each JVM's output also goes to a log file.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sink_coordinator_demo.ports import free_port
from spark_writer.java import ensure_java

STARTUP_SECONDS = 120.0


@dataclass
class JvmProcess:
    """A spark-class process whose log lines can be awaited (and are kept in `log_path`)."""

    process: subprocess.Popen[str]
    log_path: Path
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log_path.open("a") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                self.lines.put(line.rstrip())

    def wait_for(self, text: str, timeout: float = STARTUP_SECONDS) -> str:
        """The first line (seen already or to come) that contains `text`."""
        for line in self.seen:
            if text in line:
                return line
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None and self.lines.empty():
                raise RuntimeError(f"spark-class exited with {self.process.returncode}: see {self.log_path}")
            try:
                line = self.lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {text!r} in {timeout:.0f} s: see {self.log_path}") from None
                continue
            self.seen.append(line)
            if text in line:
                return line

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class SparkCluster:
    master_url: str
    master: JvmProcess
    worker: JvmProcess

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()


def _spark_class(spark_home: Path, arguments: list[str], env: dict[str, str], log_path: Path) -> JvmProcess:
    process = subprocess.Popen(
        [str(spark_home / "bin" / "spark-class"), *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return JvmProcess(process, log_path)


def start_spark_cluster(work: Path, cores: int = 2, memory: str = "2g") -> SparkCluster:
    """A master and one worker on free ports; returns once the worker registered with the master."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_LOG_DIR": str(work / "logs"),
        "PYSPARK_PYTHON": sys.executable,
        "JAVA_HOME": ensure_java(),
    }
    port = free_port()
    master = _spark_class(
        spark_home,
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port())],
        env,
        work / "master.log",
    )  # fmt: skip
    try:
        master.wait_for("I have been elected leader")
        master_url = f"spark://127.0.0.1:{port}"
        worker = _spark_class(
            spark_home,
            ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1", "--cores", str(cores),
             "--memory", memory, "--webui-port", str(free_port())],
            env,
            work / "worker.log",
        )  # fmt: skip
        try:
            master.wait_for("Registering worker")
        except BaseException:
            worker.stop()
            raise
    except BaseException:
        master.stop()
        raise
    return SparkCluster(master_url, master, worker)


__all__ = ["JvmProcess", "SparkCluster", "start_spark_cluster"]
