"""Spark's Python worker daemon, importing PySpark from the installed package (``spark.python.daemon.module``).

Spark starts its Python workers with ``$SPARK_HOME/python/lib/pyspark.zip`` and the
py4j zip first on PYTHONPATH. For a pip-installed PySpark (SPARK_HOME is the
package) the zips hold the very code of the installed packages, but Python
compiles a module imported from a zip from source every time: no bytecode is
cached. Measured here, a worker imports ``pyspark.worker`` in 1.7 s from the zip
and in 0.4 s from the package, and a micro-batch's tasks wait for it: the first
batch of a query, and every batch that needs a new worker.

This daemon takes a zip off ``sys.path`` (and its importer out of
``sys.path_importer_cache``, which every task's ``importlib.invalidate_caches()``
would have re-read the zip's directory of 1,485 files through) when the installed
package it stands for is byte for byte the same version (otherwise, a cluster's
own Spark for one, nothing changes), imports the worker module once before it
forks (that module starts no thread; pyarrow and pandas, which do, are still
imported after the fork, as Spark's daemon requires), then runs Spark's own daemon.

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
import zipfile
from importlib.machinery import PathFinder
from pathlib import Path
from socket import socket
from typing import Final, Protocol

# The zips Spark puts on a worker's path, with the package each holds and the file that says its version.
ZIPPED_PACKAGES: Final = {"pyspark.zip": ("pyspark", "version.py"), "py4j-": ("py4j", "version.py")}


def zipped_package(entry: str) -> tuple[str, str] | None:
    """(package, version file) of a path entry that is one of Spark's zips; None for any other entry."""
    name = Path(entry).name
    for prefix, package in ZIPPED_PACKAGES.items():
        if name.startswith(prefix) and name.endswith(".zip"):
            return package
    return None


def installed_copy_matches(entry: str, package: str, version_file: str, other_entries: list[str]) -> bool:
    """Whether `package` is importable from `other_entries` with the same version file as inside the zip."""
    spec = PathFinder.find_spec(package, other_entries)
    if spec is None or spec.origin is None:
        return False
    installed = Path(spec.origin).parent / version_file
    try:
        with zipfile.ZipFile(entry) as archive:
            zipped = archive.read(f"{package}/{version_file}")
        return installed.read_bytes() == zipped
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def path_without_redundant_zips(path: list[str]) -> list[str]:
    """`path` without Spark's zips whose packages are installed, in the same version, elsewhere on it."""
    others = [entry for entry in path if zipped_package(entry) is None]
    kept = []
    for entry in path:
        package = zipped_package(entry)
        if package is None or not installed_copy_matches(entry, *package, others):
            kept.append(entry)
    return kept


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
    kept = path_without_redundant_zips(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept
    if len(sys.argv) > 1:
        importlib.import_module(sys.argv[1])  # the worker module: what each forked worker would import again
    from pyspark import daemon  # only now: from the package where the zip was dropped

    daemon.worker = frozen_after_each_task(daemon.worker)
    gc.collect()
    gc.freeze()  # what the daemon imported is shared with the forked workers: no collection needs to visit it
    daemon.manager()


if __name__ == "__main__":
    main()
