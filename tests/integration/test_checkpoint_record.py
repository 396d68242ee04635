"""CommitCheckpoint's one-statement record (every epoch it covers PENDING) and the writers it must still fence."""

from __future__ import annotations

import asyncio

import pytest

from coordinator_service.contract.errors import Fenced
from coordinator_service.log import checkpoint_record, epoch_transitions, sink_rows
from coordinator_service.log.models import AbortCause
from coordinator_service.log.sink_rows import RowLock
from tests.fixtures.admin import AdminApp, commit_lock_held, sink_id_of, until_a_statement_waits_for_a_lock


async def test_a_checkpoint_is_recorded_in_one_statement_when_every_covered_epoch_is_pending(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
    async with admin.runtime.database.connection(autocommit=True) as connection:
        recorded = await checkpoint_record.record_checkpoint_over_pending(
            connection, "orders", registration.writer_term, 2
        )
        assert recorded is not None
        assert (recorded.checkpointed_epoch, recorded.committed_epoch) == (2, -1)
        # Covered already, a term not current, an epoch never pre-committed: the general path decides those.
        for term, epoch in ((registration.writer_term, 2), (registration.writer_term + 1, 3), (1, 4)):
            assert await checkpoint_record.record_checkpoint_over_pending(connection, "orders", term, epoch) is None


async def test_a_checkpoint_waiting_behind_a_registration_is_fenced_by_it(admin: AdminApp) -> None:
    """The statement waits for the sink's row lock that a RegisterWriter holds, then sees the new term: refused,
    nothing recorded (PostgreSQL evaluates the condition again on the row version it waited for)."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    database = admin.runtime.database
    async with database.transaction() as session:
        # What a RegisterWriter with checkpoint -1 does under the sink's row lock: a new term, epoch 0 aborted.
        sink = await sink_rows.sink_by_name(session, "orders", lock=RowLock.UPDATE)
        assert sink is not None
        sink.writer_term += 1
        await session.flush()
        assert await epoch_transitions.abort_pending_above(session, sink.id, -1, "recovery", AbortCause.RECOVERY) == [0]
        checkpoint = asyncio.create_task(admin.checkpoint("orders", registration, 0, wait=False))
        await until_a_statement_waits_for_a_lock(database)
    with pytest.raises(Fenced):
        await checkpoint
    async with database.transaction() as session:
        sink = await sink_rows.sink_by_name(session, "orders")
        assert sink is not None and sink.checkpointed_epoch == -1


async def test_a_waiter_is_not_answered_with_the_committed_epoch_of_an_older_numbering(
    admin: AdminApp, database_url: str
) -> None:
    """The committer hands a waiter the committed epoch its own COMMITTED transaction recorded, without reading the
    sink again; after a reset the epochs are a new numbering, and epoch 0 of it is not 'committed' by the old 5."""
    old = await admin.register("orders")
    for epoch in range(6):
        await admin.pre_commit("orders", old, epoch, epoch * 10)
    assert await admin.checkpoint("orders", old, 5) == 5
    response = await admin.post("/api/v1/sinks/orders/reset", json={"confirm": "orders", "reason": "test"})
    assert response.status_code == 200, response.text
    new = await admin.register("orders", checkpointed_epoch=-1)
    await admin.pre_commit("orders", new, 0, 100)

    async with commit_lock_held(database_url, sink_id_of(database_url, "orders")):  # the committer cannot commit
        waiting = asyncio.create_task(admin.checkpoint("orders", new, 0))
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        assert not done, "CommitCheckpoint(wait) answered before epoch 0 of the new numbering was committed"
    assert await waiting == 0
