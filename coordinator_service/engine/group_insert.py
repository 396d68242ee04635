"""Group commit of first pre-commits: the pre-commit's fast path, many writers' rows in one statement."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import structlog

from coordinator_service.log import epoch_transitions
from coordinator_service.log.database import Database

log = structlog.get_logger(__name__)


# Most first pre-commits written by one statement of the group insert.
GROUP_INSERT_MAX_ROWS = 256


class GroupInsert:
    """Group commit of first pre-commits: those that arrive while one PostgreSQL transaction runs share the next.

    No timer: a lone writer's row is written at once; under load, every transaction carries all the rows
    that queued up meanwhile (up to GROUP_INSERT_MAX_ROWS), one statement and one WAL flush for all of them.
    Each caller is answered only after the transaction holding its row has committed.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        # Its own connection, outside the pool, in autocommit: the one INSERT statement is the transaction,
        # durable when it returns (one round trip, not an INSERT and a COMMIT).
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._queue: list[tuple[epoch_transitions.NewEpoch, asyncio.Future[bool]]] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None

    async def insert(self, row: epoch_transitions.NewEpoch) -> bool:
        """True once the row is durably inserted; False if it was not (the general path decides then)."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((row, answer))
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain(), name="precommit-group-insert")
        return await answer

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:GROUP_INSERT_MAX_ROWS], self._queue[GROUP_INSERT_MAX_ROWS:]
                await self._write(batch)
        finally:
            self._draining = False

    async def _write(self, batch: list[tuple[epoch_transitions.NewEpoch, asyncio.Future[bool]]]) -> None:
        # One row per (sink, epoch): a second request for the same epoch goes the general way.
        unique: dict[tuple[int, int], epoch_transitions.NewEpoch] = {}
        for row, _ in batch:
            unique.setdefault((row.sink_id, row.epoch), row)
        rows = sorted(unique.values(), key=lambda row: (row.sink_id, row.epoch))  # one lock order
        try:
            if self._connection is None or self._connection.closed:
                self._connection = await psycopg.AsyncConnection.connect(
                    self.database.libpq_url, autocommit=True, **self.database.options.libpq()
                )
            inserted = await epoch_transitions.insert_new_epochs(self._connection, rows)
        except Exception as error:
            log.warning("group insert of pre-commits failed; each goes the general way", error=str(error))
            inserted = set()
            await self.close()
        for row, answer in batch:
            if not answer.done():  # a caller that gave up (deadline) is not answered
                answer.set_result(unique[(row.sink_id, row.epoch)] is row and (row.sink_id, row.epoch) in inserted)

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None
