"""Group commit across sinks: the fast paths' one-statement transitions (a first pre-commit's row, a checkpoint's
record), many writers' requests in one statement."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import psycopg
import structlog

from coordinator_service.log.database import Database

log = structlog.get_logger(__name__)

Request = TypeVar("Request")
# A request's key: the statement's rows are locked in its order.
Key = TypeVar("Key", tuple[int, int], str)
Answer = TypeVar("Answer")
T = TypeVar("T")

# Most requests written by one statement of a group.
GROUP_MAX_REQUESTS = 256

# The statement of a group: the requests, one per key, in the order of their keys; the answer of each it did.
Statement = Callable[[psycopg.AsyncConnection[Any], Sequence[Request]], Awaitable[Mapping[Key, Answer]]]


class GroupedStatement(Generic[Request, Key, Answer]):
    """Group commit of one statement: the requests that arrive while the statement runs share the next one.

    No timer: a lone request is written at once; under load, each statement carries every request that queued up
    meanwhile (up to GROUP_MAX_REQUESTS), one round trip and one WAL flush for all of them. The statement runs on a
    connection of its own, outside the pool, in autocommit: it is its own transaction, durable when it returns (one
    round trip, not the statement and a COMMIT, and no pool checkout). Requests are taken in the order of their keys,
    one per key in a statement (a second one for the same key is not done by it): one lock order for every
    statement. Each caller is answered only after the statement that did its request has committed; a request the
    statement did not do, or a statement that failed, is answered None, and the caller's general path decides.
    """

    def __init__(
        self, database: Database, name: str, key: Callable[[Request], Key], statement: Statement[Request, Key, Answer]
    ) -> None:
        self.database = database
        self.name = name
        self._key: Callable[[Request], Key] = key
        self._statement: Statement[Request, Key, Answer] = statement
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._queue: list[tuple[Request, asyncio.Future[Answer | None]]] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: Request) -> Answer | None:
        """The request's answer once the statement that did it has committed; None if no statement did it."""
        answer: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._queue.append((request, answer))
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain(), name=f"grouped-{self.name}")
        return await answer

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:GROUP_MAX_REQUESTS], self._queue[GROUP_MAX_REQUESTS:]
                await self._write(batch)
        finally:
            self._draining = False
            # Only when the drain itself was cancelled (the loop ending) are requests left: the general way for them.
            queued, self._queue = self._queue, []
            for _, answer in queued:
                _answer_once(answer, None)

    async def _write(self, batch: list[tuple[Request, asyncio.Future[Answer | None]]]) -> None:
        unique: dict[Key, Request] = {}
        for request, _ in batch:
            unique.setdefault(self._key(request), request)
        done: Mapping[Key, Answer] = {}
        try:
            if self._connection is None or self._connection.closed:
                self._connection = await psycopg.AsyncConnection.connect(
                    self.database.libpq_url, autocommit=True, **self.database.options.libpq()
                )
            done = await self._statement(self._connection, [unique[key] for key in sorted(unique)])
        except Exception as error:
            log.warning(
                "a grouped statement failed; each request goes the general way", statement=self.name, error=str(error)
            )
            await self.close()
        finally:
            for request, answer in batch:  # one the statement did not do (or a second of its key): the general way
                key = self._key(request)
                _answer_once(answer, done.get(key) if unique[key] is request else None)

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None


def _answer_once(answer: asyncio.Future[T], value: T) -> None:
    if not answer.done():  # a caller that gave up (deadline) is not answered
        answer.set_result(value)
