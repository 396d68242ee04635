"""From listening to serving: the runtime opened once the metastore answers, however long that takes.

The servers listen before PostgreSQL is contacted (coordinator_service.app): a pod that starts during a
metastore outage answers its probes (live, not ready) and its writers (UNAVAILABLE, which they retry) instead of
exiting and crash-looping, and it serves as soon as the metastore is back instead of after the back-off of a
restart. Each attempt that fails for a reason that may pass (refused, timed out, DNS, a catalog that does not
answer) is one structured log line; a failure no retry can fix (a schema this release cannot run on, a catalog
that is misconfigured) ends the start (coordinator_service.cli says it in one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Final

import psycopg
import structlog
from sqlalchemy import exc

from coordinator_service.contract.errors import CannotServe, SchemaNotCurrent, Unavailable, cause
from coordinator_service.runtime import Runtime
from coordinator_service.settings import Settings

log = structlog.get_logger(__name__)

# The wait after the first failed attempt, doubling up to the longest: PostgreSQL back after an outage is served
# within seconds.
FIRST_WAIT_SECONDS: Final = 0.5
LONGEST_WAIT_SECONDS: Final = 5.0

# What may pass by itself: the metastore or the catalog not reachable (yet), or not answering in time.
_PASSING: Final[tuple[type[BaseException], ...]] = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.DisconnectionError,
    exc.TimeoutError,
    psycopg.OperationalError,
    Unavailable,
    OSError,  # refused, reset, no route, DNS; requests' errors (a REST catalog) are OSErrors too
    TimeoutError,
)


def passing(error: BaseException) -> bool:
    """Whether a failed attempt to open the runtime may succeed later (else the start ends)."""
    return isinstance(error, _PASSING) and not isinstance(error, SchemaNotCurrent)


class Startup:
    """The runtime's opening, attempt after attempt, and what the servers say meanwhile (`waiting`)."""

    def __init__(self, settings: Settings, told: Callable[[str], None] = lambda why: None) -> None:
        self.settings = settings
        self.attempts = 0
        self.waiting = "connecting to it"
        # The runtime once opened: whoever stops the process closes it (close()).
        self.runtime: Runtime | None = None
        # The attempt under way when open_runtime returned on `until`, taken up by its next call.
        self._attempt: asyncio.Task[Runtime] | None = None
        # Told why the runtime is not open yet, at every failed attempt (the gRPC gate says it to writers).
        self._told = told
        told(self.waiting)

    async def open_runtime(self, stop: asyncio.Event, until: asyncio.Event | None = None) -> Runtime | None:
        """The open runtime, or None when `stop` is set first, or `until` (an attempt under way then goes on, and the
        next call takes it up). Raises SchemaNotCurrent, or CannotServe for any other failure no retry fixes."""
        until = until or asyncio.Event()
        wait = FIRST_WAIT_SECONDS
        while not stop.is_set():
            if self._attempt is None:
                self.attempts += 1
                self._attempt = asyncio.create_task(Runtime.open(self.settings), name="runtime-open")
            await _first(until, task=self._attempt)
            if not self._attempt.done():
                return None
            attempt, self._attempt = self._attempt, None
            try:
                self.runtime = attempt.result()
                return self.runtime
            except SchemaNotCurrent:
                raise
            except Exception as error:
                if not passing(error):
                    raise CannotServe(
                        f"the coordinator cannot start: {type(error).__name__}: {cause(error)}"
                    ) from error
                self.waiting = f"{cause(error) or type(error).__name__} (attempt {self.attempts})"
                self._told(self.waiting)
                retry_in = wait * random.uniform(0.8, 1.2)  # replicas started together spread their attempts
                log.warning(
                    "the metastore (or the catalog) is not reachable yet; retrying",
                    attempt=self.attempts,
                    retry_in_seconds=round(retry_in, 2),
                    error=cause(error),
                    error_type=type(error).__name__,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(stop, until), retry_in)
                if until.is_set():
                    return None
                wait = min(wait * 2, LONGEST_WAIT_SECONDS)
        return None

    async def close(self) -> None:
        """Close the runtime, once an attempt still under way (a start stopped meanwhile) has ended."""
        if self._attempt is not None:
            attempt, self._attempt = self._attempt, None
            with contextlib.suppress(Exception):
                self.runtime = await attempt
        if self.runtime is not None:
            await self.runtime.close()


async def _first(*events: asyncio.Event, task: asyncio.Task[Runtime] | None = None) -> None:
    """Return once any of `events` is set, or `task` is done."""
    waiting = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait([*waiting, *([task] if task else [])], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for each in waiting:
            each.cancel()
