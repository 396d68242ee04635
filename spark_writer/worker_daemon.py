"""Spark's Python worker daemon (``spark.python.daemon.module``): warm forks, collections that skip the imports.

It imports the worker module once before it forks (that module starts no thread;
pyarrow and pandas, which do, are still imported after the fork, as Spark's daemon
requires), then runs Spark's own daemon. (Where PySpark is imported from is the
launcher's business: spark_writer.python_launcher.)

A reused worker runs a full ``gc.collect()`` after every task, over every object
of pyspark, pyarrow, pandas and the task's modules: 0.13 s here, which the next
task sent to that worker waits out. The objects that outlive a task (modules,
caches) are therefore moved to the collector's permanent generation
(``gc.freeze()``, made for pre-fork servers) once collected, so that the next
collections look only at what later tasks allocate. Reference counting still frees
frozen objects; only cycles among them are no longer collected.
"""

from __future__ import annotations

import gc
import importlib
import sys
from socket import socket
from typing import Protocol

from pyspark import daemon

from spark_writer.worker_logging import configure_worker_logging


class Worker(Protocol):
    """pyspark.daemon.worker: runs one task on a socket, in a forked (and maybe reused) worker process."""

    def __call__(self, sock: socket, authenticated: bool) -> int: ...


def frozen_after_each_task(worker: Worker) -> Worker:
    """`worker`, followed by a collection whose survivors are frozen (see the module's docstring)."""

    def run_task(sock: socket, authenticated: bool) -> int:
        code = worker(sock, authenticated)
        gc.collect()
        gc.freeze()
        return code

    return run_task


def main() -> None:
    configure_worker_logging()  # before the fork: every worker inherits it
    if len(sys.argv) > 1:
        importlib.import_module(sys.argv[1])  # the worker module: what each forked worker would import again
    daemon.worker = frozen_after_each_task(daemon.worker)
    gc.collect()
    gc.freeze()  # what the daemon imported is shared with the forked workers: no collection needs to visit it
    daemon.manager()


if __name__ == "__main__":
    main()
