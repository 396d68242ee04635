"""The COMMITTED record of the common commit in one statement: all the appended epochs, or nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from sqlalchemy import text

from coordinator_service.contract.views import EpochStatus
from coordinator_service.log import commit_record, epoch_reads, epoch_transitions, sink_rows, sink_tables
from coordinator_service.log.database import Database, libpq_url, normalize_url
from coordinator_service.log.models import AbortCause, Sink
from coordinator_service.runtime import migrate
from tests.fixtures.admin import AdminApp, commit_lock_held, sink_id_of, until_a_statement_waits_for_a_lock
from tests.fixtures.postgres import query


async def _sink_and_statuses(admin: AdminApp) -> tuple[Sink, dict[int, EpochStatus]]:
    async with admin.runtime.database.transaction() as session:
        sink = await sink_rows.sink_by_name(session, "orders")
        assert sink is not None
        rows = await epoch_reads.epochs_between(session, sink.id, -1, 100)
        return sink, {row.epoch: row.status for row in rows}


@asynccontextmanager
async def checkpointed_without_a_committer(admin: AdminApp, database_url: str) -> AsyncIterator[Sink]:
    """Epochs 0-2 pre-committed and checkpointed while the sink's commit lock is held here: no pass commits them."""
    registration = await admin.register("orders")
    async with commit_lock_held(database_url, sink_id_of(database_url, "orders")):
        for epoch in range(3):
            await admin.pre_commit("orders", registration, epoch, epoch * 10)
        assert await admin.checkpoint("orders", registration, 2, wait=False) == -1
        sink, _ = await _sink_and_statuses(admin)
        yield sink


def _appended(attempts: dict[int, int]) -> commit_record.Appended:
    return commit_record.Appended(attempts, dict.fromkeys(attempts, 42), {"db.orders": max(attempts)})


def _table_epochs(database_url: str) -> dict[str, int]:
    rows = query(database_url, "SELECT table_identifier, committed_epoch FROM sink_tables")
    return {str(table): int(str(epoch)) for table, epoch in rows}


async def test_every_appended_epoch_is_marked_and_the_committed_epoch_moves(admin: AdminApp, database_url: str) -> None:
    async with checkpointed_without_a_committer(admin, database_url) as sink:
        async with admin.runtime.database.connection(autocommit=True) as connection:
            committed = await commit_record.mark_appended_epochs(connection, sink, _appended({0: 1, 1: 1}))
        assert committed == 1
        after, statuses = await _sink_and_statuses(admin)
    assert after.committed_epoch == 1
    assert statuses == {0: EpochStatus.COMMITTED, 1: EpochStatus.COMMITTED, 2: EpochStatus.PENDING}
    assert _table_epochs(database_url) == {"db.orders": 1}


@pytest.mark.parametrize("change", ["attempt", "aborted", "generation", "incarnation"])
async def test_anything_else_than_what_was_appended_changes_nothing(
    admin: AdminApp, database_url: str, change: str
) -> None:
    async with checkpointed_without_a_committer(admin, database_url) as sink:
        attempts = {0: 1, 1: 1}
        if change == "attempt":
            attempts[1] = 2
        elif change == "aborted":
            async with admin.runtime.database.transaction() as session:
                await epoch_transitions.abort_epoch(session, sink.id, 1, "operator", AbortCause.OPERATOR)
        elif change == "generation":
            sink.generation += 1  # a detached copy: what a committer appended for before a reset
        else:
            sink.incarnation = uuid.uuid4()

        async with admin.runtime.database.connection(autocommit=True) as connection:
            assert await commit_record.mark_appended_epochs(connection, sink, _appended(attempts)) is None

        after, statuses = await _sink_and_statuses(admin)
    assert after.committed_epoch == -1
    assert statuses[0] == EpochStatus.PENDING
    # What the table holds is recorded whatever became of the epochs, but only in the numbering it was appended in.
    assert _table_epochs(database_url) == {"db.orders": -1 if change in ("generation", "incarnation") else 1}


async def test_an_epoch_pre_committed_and_checkpointed_while_the_record_waits_is_not_committed_by_it(
    admin: AdminApp, database_url: str
) -> None:
    """The record waits for the sink's row lock while a writer pre-commits epoch 3 and checkpoints it. PostgreSQL
    then evaluates the sink's row again at its new version (checkpointed 3), but reads the epochs as they were when
    the statement began (no epoch 3): the committed epoch must not pass an epoch the statement cannot see, or the
    trigger of migration 0006 records every table as holding epoch 3 and the next pass appends none of its files
    (a fan-out epoch lost; found by the races torture, reset_mid_fan_out seed 1379)."""
    async with checkpointed_without_a_committer(admin, database_url) as sink:
        database = admin.runtime.database
        async with database.transaction() as session:
            await session.execute(text("SELECT 1 FROM sinks WHERE id = :id FOR UPDATE"), {"id": sink.id})
            async with database.connection(autocommit=True) as connection:
                record = asyncio.create_task(
                    commit_record.mark_appended_epochs(connection, sink, _appended({0: 1, 1: 1, 2: 1}))
                )
                await until_a_statement_waits_for_a_lock(database)
                await session.execute(
                    text(
                        "INSERT INTO pending_sink_state (sink_id, epoch, status, metadata, attempt, file_count, "
                        "record_count, files_cleaned) SELECT sink_id, 3, status, metadata, 1, file_count, "
                        "record_count, false FROM pending_sink_state WHERE sink_id = :id AND epoch = 2"
                    ),
                    {"id": sink.id},
                )
                await session.execute(text("UPDATE sinks SET checkpointed_epoch = 3 WHERE id = :id"), {"id": sink.id})
                await session.commit()
                committed = await record
        after, statuses = await _sink_and_statuses(admin)
    assert (committed, after.committed_epoch, after.checkpointed_epoch) == (2, 2, 3)
    assert statuses == {
        0: EpochStatus.COMMITTED,
        1: EpochStatus.COMMITTED,
        2: EpochStatus.COMMITTED,
        3: EpochStatus.PENDING,
    }
    assert _table_epochs(database_url) == {"db.orders": 2}


async def test_a_table_record_waiting_behind_a_reset_is_not_written_into_the_new_numbering(
    admin: AdminApp, database_url: str
) -> None:
    """A pass of the old numbering (its commit lock lost) records what a table holds while a reset's first writer
    rebases the sink: the record waits for the table's row, then must see the new generation and change nothing,
    not write the old numbering's epoch 2 over the new numbering's -1."""
    async with checkpointed_without_a_committer(admin, database_url) as sink:
        database = admin.runtime.database
        async with database.transaction() as session:
            # What the rebase on the first writer after a reset writes, under the sink's row lock.
            await session.execute(
                text("UPDATE sinks SET generation = generation + 1, committed_epoch = -1 WHERE id = :id"),
                {"id": sink.id},
            )
            await sink_tables.rebase_tables(session, sink.id, -1)
            async with database.connection(autocommit=True) as connection:
                record = asyncio.create_task(sink_tables.record_tables(connection, sink, {"db.orders": 2}))
                await until_a_statement_waits_for_a_lock(database)
                await session.commit()
                await record
    assert _table_epochs(database_url) == {"db.orders": -1}


async def test_a_sink_whose_row_another_transaction_holds_holds_up_no_other_sinks_empty_backlog(
    database_url: str,
) -> None:
    """A restart's one pass over every all-empty backlog skips a sink whose row another transaction holds (here as a
    registration or an operator's action would) instead of waiting for it with every other sink's commit lock taken;
    that sink's committer marks it in its own pass. (It waited: the held row held up the whole statement.)"""
    migrate(normalize_url(database_url))
    for name in ("free", "held"):
        [(sink_id,)] = query(
            database_url,
            "INSERT INTO sinks (name, table_identifier, catalog, checkpointed_epoch) "
            "VALUES (%s, %s, 'default', 1) RETURNING id",
            name,
            f"db.{name}",
        )
        for epoch in (0, 1):
            query(
                database_url,
                "INSERT INTO pending_sink_state (sink_id, epoch, status, metadata, attempt, file_count, "
                "record_count, files_cleaned) VALUES (%s, %s, 'PENDING', '', 1, 0, 0, false)",
                sink_id,
                epoch,
            )
    database = Database(normalize_url(database_url))
    try:
        with psycopg.connect(libpq_url(database_url)) as holder:
            holder.execute("SELECT 1 FROM sinks WHERE name = 'held' FOR UPDATE")

            async def one_pass() -> list[commit_record.EmptyBacklog]:
                async with database.transaction() as session:
                    return await commit_record.commit_empty_backlogs(session)

            backlogs = await asyncio.wait_for(one_pass(), 10)
        assert [(each.sink, each.epochs, each.committed_epoch) for each in backlogs] == [("free", 2, 1)]
    finally:
        await database.dispose()
    assert dict(query(database_url, "SELECT name, committed_epoch FROM sinks")) == {"free": 1, "held": -1}
