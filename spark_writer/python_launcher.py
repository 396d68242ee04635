"""``sink-writer-python``: the Python Spark starts for its Python processes, without Spark's redundant zips.

Spark starts every Python process of its own (the workers that run tasks, and the
planners of a Python data source: ``create_data_source``, ``plan_data_source_read``,
the streaming source runner) with ``$SPARK_HOME/python/lib/pyspark.zip`` and the
py4j zip first on PYTHONPATH. For a pip-installed PySpark (SPARK_HOME is the
package) the zips hold the very code of the installed packages, but Python
compiles what it imports from a zip from source every time: no bytecode is
cached. Measured here, ``import pyspark.worker`` takes 1.7 s from the zip and 0.4 s
from the package, and the planners 0.6-1.5 s each: a query's start and its first
micro-batch wait for them.

Spark runs ``spark.pyspark.python`` (``PYSPARK_PYTHON``) for all of them, so the
local sessions point it here: this launcher takes a zip off PYTHONPATH when the
package it stands for is installed, byte for byte the same version (otherwise, a
cluster's own Spark distribution for one, nothing changes), and then becomes the
very interpreter it runs in (``exec``, same process), with the same arguments.
"""

from __future__ import annotations

import os
import sys
import zipfile
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Final

# The zips Spark puts on its processes' path, with the package each holds and the file that says its version.
ZIPPED_PACKAGES: Final = {"pyspark.zip": ("pyspark", "version.py"), "py4j-": ("py4j", "version.py")}
LAUNCHER: Final = "sink-writer-python"


def zipped_package(entry: str) -> tuple[str, str] | None:
    """(package, version file) of a path entry that is one of Spark's zips; None for any other entry."""
    name = Path(entry).name
    for prefix, package in ZIPPED_PACKAGES.items():
        if name.startswith(prefix) and name.endswith(".zip"):
            return package
    return None


def installed_copy_matches(entry: str, package: str, version_file: str, search_path: list[str]) -> bool:
    """Whether `package` is importable from `search_path` with the same version file as inside the zip."""
    spec = PathFinder.find_spec(package, search_path)
    if spec is None or spec.origin is None:
        return False
    installed = Path(spec.origin).parent / version_file
    try:
        with zipfile.ZipFile(entry) as archive:
            zipped = archive.read(f"{package}/{version_file}")
        return installed.read_bytes() == zipped
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def path_without_redundant_zips(path: list[str], search_path: list[str]) -> list[str]:
    """`path` without Spark's zips whose packages are installed on `search_path`, in the same version."""
    others = [entry for entry in search_path if zipped_package(entry) is None]
    kept = []
    for entry in path:
        package = zipped_package(entry)
        if package is None or not installed_copy_matches(entry, *package, others):
            kept.append(entry)
    return kept


def launcher_path() -> str:
    """This launcher beside the running interpreter when installed there, else the interpreter itself."""
    beside = Path(sys.executable).with_name(LAUNCHER)
    return str(beside) if beside.exists() else sys.executable


def main() -> None:
    path = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path_without_redundant_zips(path, sys.path))}
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], environment)


if __name__ == "__main__":
    main()
