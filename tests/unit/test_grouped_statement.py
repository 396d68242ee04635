"""The group commit of the fast paths' statements (engine/grouped_statement.py), its logic alone: requests arriving at
random moments against a statement that takes some of them, declines the others, or fails. The statements themselves
run on PostgreSQL in tests/integration/test_checkpoint_record.py and test_transition_paths.py."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.engine import grouped_statement
from coordinator_service.engine.grouped_statement import GroupedStatement
from coordinator_service.log.database import Database, normalize_url


@dataclass(frozen=True)
class Request:
    key: str
    serial: int


class _Connection:
    closed = False

    async def close(self) -> None:
        self.closed = True


@dataclass
class _Statement:
    """What each statement was given, and what it did: a random part of its requests, or a failure."""

    random: random.Random
    batches: list[list[Request]] = field(default_factory=list)
    # The requests the statements did (committed): each must hear its answer, every other request None.
    did: set[int] = field(default_factory=set)
    running: bool = False

    async def __call__(self, connection: Any, requests: Sequence[Request]) -> dict[str, str]:
        assert not self.running, "two statements of one group ran at once"
        self.running = True
        try:
            self.batches.append(list(requests))
            for _ in range(self.random.randint(0, 3)):
                await asyncio.sleep(0)  # requests keep arriving while it runs
            if self.random.randint(0, 9) == 0:
                raise psycopg.OperationalError("the connection was lost")
            done = [request for request in requests if self.random.random() < 0.5]
            self.did.update(request.serial for request in done)
            return {request.key: f"done {request.serial}" for request in done}
        finally:
            self.running = False


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    async def connect(*args: Any, **kwargs: Any) -> _Connection:
        return _Connection()

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)
    monkeypatch.setattr(grouped_statement, "GROUP_MAX_REQUESTS", 4)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_every_request_is_answered_by_the_statement_that_did_it_or_left_to_the_general_path(
    data: st.DataObject,
) -> None:
    # The statements' own choices from a seed: drawn inside the group's task, a draw past the example's data would
    # end the example there, not in the test.
    statement = _Statement(random.Random(data.draw(st.integers(0, 2**32), label="statements' seed")))
    group: GroupedStatement[Request, str, str] = GroupedStatement(
        Database(normalize_url("postgresql://x@127.0.0.1:1/x")), "test", lambda request: request.key, statement
    )
    answers: dict[int, str | None] = {}

    async def one(request: Request) -> None:
        answers[request.serial] = await group.submit(request)

    async def run() -> list[Request]:
        requests: list[Request] = []
        tasks = []
        for _ in range(data.draw(st.integers(1, 6), label="waves")):
            for _ in range(data.draw(st.integers(1, 6), label="requests in the wave")):
                request = Request(data.draw(st.sampled_from("abcde"), label="key"), len(requests))
                requests.append(request)
                tasks.append(asyncio.create_task(one(request)))
            for _ in range(data.draw(st.integers(0, 4), label="yields between waves")):
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        await group.close()
        return requests

    requests = asyncio.run(run())

    # Each statement had at most GROUP_MAX_REQUESTS requests, one per key, in the order of the keys; every request
    # was in one statement at most (a second of its key waits for no later one: the general path answers it).
    taken = [request for batch in statement.batches for request in batch]
    for batch in statement.batches:
        assert 0 < len(batch) <= 4
        assert [request.key for request in batch] == sorted({request.key for request in batch})
    assert len(taken) == len({request.serial for request in taken})
    # Every request is answered: by its statement's answer if a statement did it, else None.
    assert answers == {
        request.serial: f"done {request.serial}" if request.serial in statement.did else None for request in requests
    }
    # Under load the requests share statements (the group commit): fewer statements than requests whenever two
    # requests of different keys waited together.
    assert len(statement.batches) <= len(requests)


async def test_requests_waiting_on_a_cancelled_group_go_the_general_way() -> None:
    """The group's task cancelled while its statement runs (the event loop ending): the requests of that statement and
    those queued behind it are each answered None, not left waiting."""
    running = asyncio.Event()

    async def stuck(connection: Any, requests: Sequence[Request]) -> dict[str, str]:
        running.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    group: GroupedStatement[Request, str, str] = GroupedStatement(
        Database(normalize_url("postgresql://x@127.0.0.1:1/x")), "test", lambda request: request.key, stuck
    )
    first = asyncio.create_task(group.submit(Request("a", 0)))
    await running.wait()
    queued = [asyncio.create_task(group.submit(Request(key, serial))) for serial, key in enumerate("bc", 1)]
    await asyncio.sleep(0)  # they are queued behind the running statement
    assert group._task is not None
    group._task.cancel()
    assert await asyncio.wait_for(asyncio.gather(first, *queued), 10) == [None, None, None]
