"""When each sink's writer last called (engine/writer_calls.py): every sink noted in one statement, each time only
moving forward, and a sink whose row another transaction holds skipped and noted again, never waited for."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, text

from coordinator_service.engine.writer_calls import WriterCalls
from coordinator_service.log import sink_rows
from coordinator_service.log.database import Database, libpq_url, normalize_url
from coordinator_service.runtime import migrate
from tests.fixtures.admin import eventually
from tests.fixtures.postgres import query

SINKS = ("a/b", "orders", "Ünïcode 'quoted'", "z")

# What the statement replaced: one UPDATE per sink, in the order of their names. The reference of the differential
# test below.
_ONE_SINK = """
    UPDATE sinks SET writer_last_call_at = now() - make_interval(secs => :ago)
    WHERE name = :sink AND (writer_last_call_at IS NULL OR writer_last_call_at < now() - make_interval(secs => :ago))
"""


class Log:
    """The test's own connection pool to the metastore, and an event loop to drive it from synchronous tests."""

    def __init__(self, database_url: str) -> None:
        migrate(normalize_url(database_url))
        self.url = libpq_url(database_url)
        self.loop = asyncio.new_event_loop()
        self.database = Database(normalize_url(database_url))
        self.statements: list[str] = []
        event.listen(self.database.engine.sync_engine, "before_cursor_execute", self._seen)
        for index, sink in enumerate(SINKS):
            query(
                database_url,
                "INSERT INTO sinks (name, table_identifier, catalog) VALUES (%s, %s, 'default')",
                sink,
                f"db.t{index}",
            )

    def _seen(self, connection: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.statements.append(statement)

    def record(self, calls: dict[str, float]) -> set[str]:
        async def record() -> set[str]:
            async with self.database.connection(autocommit=True) as connection:
                return await sink_rows.record_writer_calls(connection, calls)

        return self.loop.run_until_complete(asyncio.wait_for(record(), 10))

    def last_calls(self) -> dict[str, float | None]:
        """Each sink's last call, as seconds before now()."""
        with psycopg.connect(self.url) as connection:
            rows = connection.execute(
                "SELECT name, EXTRACT(epoch FROM now() - writer_last_call_at)::float8 FROM sinks"
            ).fetchall()
        return dict(rows)

    def close(self) -> None:
        self.loop.run_until_complete(self.database.dispose())
        self.loop.close()


@pytest.fixture
def metastore(database_url: str) -> Iterator[Log]:
    log = Log(database_url)
    yield log
    log.close()


def test_the_calls_of_every_sink_are_recorded_in_one_statement(metastore: Log) -> None:
    """One statement for every sink noted (it was one per sink); a sink unknown to the log (deleted since its call)
    is neither recorded nor noted again."""
    skipped = metastore.record({sink: 5.0 for sink in (*SINKS, "deleted")})
    assert len(metastore.statements) == 1, metastore.statements
    assert skipped == set()
    last = metastore.last_calls()
    assert sorted(last) == sorted(SINKS)
    assert all(seconds is not None and 5.0 <= seconds < 60 for seconds in last.values()), last


def test_a_sink_whose_row_another_transaction_holds_is_skipped_not_waited_for(metastore: Log) -> None:
    """The held sink is returned for the next round and the others are recorded meanwhile; once the row is free,
    the next round records it. (One statement per sink waited for the row lock, and the sinks after it with it.)"""
    with psycopg.connect(metastore.url) as holder:
        holder.execute("SELECT 1 FROM sinks WHERE name = 'orders' FOR UPDATE")
        assert metastore.record({"orders": 1.0, "z": 1.0, "a/b": 1.0}) == {"orders"}
        last = metastore.last_calls()
        assert last["orders"] is None and last["z"] is not None and last["a/b"] is not None, last
    assert metastore.record({"orders": 1.0}) == set()
    assert metastore.last_calls()["orders"] is not None


def test_the_notes_of_a_held_sink_are_recorded_once_its_row_is_free(metastore: Log) -> None:
    """WriterCalls takes the skipped sink's note again: it is recorded by a later round, with the time of the call."""
    calls = WriterCalls(metastore.database)

    def recorded(sink: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return metastore.last_calls()[sink] is not None

        return check

    async def scenario() -> None:
        with psycopg.connect(metastore.url) as holder:
            holder.execute("SELECT 1 FROM sinks WHERE name = 'orders' FOR UPDATE")
            calls.note("orders")
            calls.note("z")
            await eventually(recorded("z"), "the free sink's call recorded")
            assert metastore.last_calls()["orders"] is None
        await eventually(recorded("orders"), "the held sink's call recorded once its row is free")
        await calls.stop()

    metastore.loop.run_until_complete(scenario())
    last = metastore.last_calls()["orders"]
    assert last is not None and last < 30, last


_EARLIER = st.none() | st.floats(min_value=0, max_value=10**7, allow_nan=False)
_NAMES = st.sampled_from(SINKS) | st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
EXAMPLES = int(os.environ.get("WRITER_CALLS_EXAMPLES", "40"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    earlier=st.fixed_dictionaries({sink: _EARLIER for sink in SINKS}),
    calls=st.dictionaries(_NAMES, st.floats(min_value=0, max_value=10**7, allow_nan=False), max_size=8),
)
def test_the_statement_records_what_one_statement_per_sink_did(
    metastore: Log, earlier: dict[str, float | None], calls: dict[str, float]
) -> None:
    """Differential, against the statements it replaced: from the same last calls, the same calls recorded give the
    same times (both in one transaction, so that now() is the same), whatever the names and times."""

    async def both() -> tuple[list[Any], list[Any], set[str]]:
        async with metastore.database.engine.connect() as connection, connection.begin():
            for sink, seconds in earlier.items():
                await connection.execute(
                    text(
                        "UPDATE sinks SET writer_last_call_at = now() - make_interval(secs => :seconds) "
                        "WHERE name = :sink"
                    ),
                    {"sink": sink, "seconds": seconds},
                )
            read = text("SELECT name, writer_last_call_at FROM sinks ORDER BY name")
            savepoint = await connection.begin_nested()
            for sink, ago in sorted(calls.items()):
                await connection.execute(text(_ONE_SINK), {"sink": sink, "ago": ago})
            reference = (await connection.execute(read)).all()
            await savepoint.rollback()
            skipped = await sink_rows.record_writer_calls(connection, calls)
            ours = (await connection.execute(read)).all()
            await connection.rollback()
        return reference, ours, skipped

    reference, ours, skipped = metastore.loop.run_until_complete(both())
    assert ours == reference
    assert skipped == set()
