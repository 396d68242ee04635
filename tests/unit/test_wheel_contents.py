"""The wheel holds the whole tree: every module and file of the packages that ship (the image and the Spark
executors install from it), so that a package added to the tree cannot be left out of pyproject.toml's list."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Directory in the tree -> where the wheel keeps it (pyproject.toml's package-dir).
SHIPPED = {
    "coordinator_service": "coordinator_service",
    "spark_writer": "spark_writer",
    "sink_coordinator_demo": "sink_coordinator_demo",
    "migrations": "coordinator_service/migrations",
}
NOT_SHIPPED = {"__pycache__"}


def tree_files() -> set[str]:
    """The files git tracks under the shipped directories, named as the wheel names them."""
    tracked = subprocess.run(
        ["git", "ls-files", *SHIPPED], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    files = set()
    for name in tracked:
        top, _, rest = name.partition("/")
        if not NOT_SHIPPED & set(Path(name).parts):
            files.add(f"{SHIPPED[top]}/{rest}")
    return files


def test_the_wheel_holds_every_module_and_file_of_the_tree(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.split("/")[0] in SHIPPED.values()}
    missing = tree_files() - shipped
    assert not missing, (
        f"in the tree but not in the wheel (pyproject.toml's packages or package-data): {sorted(missing)}"
    )
