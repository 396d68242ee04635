"""When each sink's writer last called, recorded in the log off the writers' path.

Each call a writer makes that the coordinator answers (RegisterWriter, PreCommit, CommitCheckpoint, EnsureTables;
not GetSinkState, which reads, nor a refused call: a fenced writer is no sign of life of its sink) is noted in
memory, and a background task writes the newest of each sink to sinks.writer_last_call_at: at once after a quiet
spell, then at most every RECORD_SECONDS, one autocommit statement for every sink noted (a sink whose row another
transaction holds is skipped, not waited for, and noted again for the next round).
Times are the metastore's clock (now() less the time since the call), so that replicas with skewed clocks agree, and
the column only moves forward. A metastore outage loses the notes of the moment; the next call notes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

import structlog

from coordinator_service.contract.errors import cause
from coordinator_service.log import sink_rows
from coordinator_service.log.database import Database

log = structlog.get_logger(__name__)

# Least time between two writes of the notes: a busy writer costs one statement per sink this often at most.
RECORD_SECONDS: Final = 2.0


class WriterCalls:
    def __init__(self, database: Database) -> None:
        self.database = database
        # Sink name -> time.monotonic() of its writer's last answered call, not yet written.
        self._calls: dict[str, float] = {}
        self._noted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def note(self, sink: str) -> None:
        """The writer of `sink` made a call the coordinator answered (in the event loop)."""
        self._calls[sink] = time.monotonic()
        self._noted.set()
        if self._task is None:
            self._task = asyncio.create_task(self._record_forever(), name="writer-calls")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        with contextlib.suppress(Exception):  # the last notes, if the metastore takes them
            await self.record()

    async def _record_forever(self) -> None:
        while True:
            await self._noted.wait()
            self._noted.clear()
            try:
                await self.record()
            except Exception as error:
                log.warning(
                    "recording when writers called failed; their next calls are noted again", error=cause(error)
                )
            await asyncio.sleep(RECORD_SECONDS)

    async def record(self) -> None:
        """Write the notes taken since the last time."""
        calls, self._calls = self._calls, {}
        if not calls:
            return
        now = time.monotonic()
        async with self.database.connection(autocommit=True) as connection:
            skipped = await sink_rows.record_writer_calls(connection, {sink: now - at for sink, at in calls.items()})
        for sink in skipped:  # a newer note taken meanwhile stays
            self._calls.setdefault(sink, calls[sink])
        if skipped:
            self._noted.set()
