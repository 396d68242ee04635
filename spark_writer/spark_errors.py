"""Spark's error messages as a person reads them: `[ERROR_CLASS] What went wrong. SQLSTATE: 0A000`, then the
statement with a caret under the fault, then the JVM's report, become their first line without the class and state."""

from __future__ import annotations

import re
from typing import Final

_ERROR_CLASS: Final = re.compile(r"^\[[A-Z0-9_.]+\]\s*")
_SQL_STATE: Final = re.compile(r"\s*SQLSTATE: \w+\.?")


def spark_message(error: BaseException) -> str:
    """The first line of a Spark (or py4j) error's message, without its error class and SQL state."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return _SQL_STATE.sub("", _ERROR_CLASS.sub("", first)).strip()
