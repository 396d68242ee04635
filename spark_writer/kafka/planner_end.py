"""The end of the process Spark plans the Kafka stream in: quiet when Spark closed it, never a traceback.

Spark plans a Python data source's stream in a Python process of its own (pyspark's
``python_streaming_source_runner``), which answers the JVM's calls over a socket
until the query stops. A stopping query closes that socket: the process's next
read fails (EOF, or a reset), pyspark tries to report that failure on the very
socket that is gone (a broken pipe), and the last exception leaves the process.
Python prints it on the stderr the process shares with the job: a traceback of
three chained exceptions at the end of every clean stop that loses the race (a
SIGTERM between batches under load showed it). Nothing went wrong, and nobody is
left to be told; so in that process, an exception made only of the connection's
end ends it quietly (a debug line). Any other exception is printed as before.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Final

import structlog

log = structlog.get_logger(__name__)

# pyspark's module that runs a Python data source's stream planning (`python -m ...`).
PLANNER_MODULE: Final = "pyspark.sql.streaming.python_streaming_source_runner"
# What a read or write raises on a connection its peer closed or reset.
CONNECTION_ENDS: Final = (EOFError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def in_stream_planner() -> bool:
    """Whether this process is the one Spark plans a Python stream in."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == PLANNER_MODULE


def only_the_connections_end(error: BaseException) -> bool:
    """Whether `error`, and every exception it was raised while handling, is the end of a connection."""
    seen: BaseException | None = error
    while seen is not None:
        if not isinstance(seen, CONNECTION_ENDS):
            return False
        seen = seen.__cause__ or seen.__context__
    return True


def end_quietly_when_spark_closes() -> None:
    """In the stream planner's process, let the connection's end leave it without a traceback."""
    if not in_stream_planner():
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        if only_the_connections_end(error):
            log.debug("stream planner closed by spark", error=repr(error))
            return
        previous(kind, error, traceback)

    sys.excepthook = hook
