"""How a Spark driver stops on SIGINT and SIGTERM: the signal asks for a stop, the job makes it between two batches.

Python runs a signal's handler in the main thread, between two bytecodes of whatever that thread is doing, and a
driver's main thread spends its time inside py4j calls (starting Spark and the query, waiting for the query). An
exception raised there (KeyboardInterrupt, SystemExit) leaves the gateway connection half-read: the calls to the
JVM that follow fail, the query's stop and the final checkpoint report among them. So the handlers only record
the request and the job looks at it between two calls. A second signal ends the process at once (the signal's
default action; a JVM this process started exits when its stdin, a pipe from here, closes): the way out of a stop
that hangs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Final

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The first SIGINT or SIGTERM received while installed; None until then."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self._requested = threading.Event()

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended: the job did not finish."""
        assert self.signal is not None
        return 128 + self.signal

    def wait(self, seconds: float) -> bool:
        """Sleep for `seconds` unless a stop is requested meanwhile: whether one was (the checks that wait before
        Spark starts end at once)."""
        return self._requested.wait(seconds)

    def install(self) -> None:
        """Handle both signals here; again after whatever replaced the handlers (a SparkContext replaces SIGINT's
        with one that raises KeyboardInterrupt)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._request if self.signal is None else signal.SIG_DFL)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signal.Signals(signum)
        self._requested.set()
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_DFL)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Within: SIGINT and SIGTERM request a stop (StopRequest); the handlers from before are put back after."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    stop = StopRequest()
    stop.install()
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
