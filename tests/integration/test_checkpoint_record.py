"""CommitCheckpoint's one-statement record (every epoch it covers PENDING) and the writers it must still fence."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from coordinator_service.contract.errors import CoordinatorError, Fenced
from coordinator_service.log import checkpoint_record, epoch_transitions, sink_rows
from coordinator_service.log.database import libpq_url
from coordinator_service.log.models import AbortCause
from coordinator_service.log.sink_rows import RowLock
from tests.fixtures.admin import AdminApp, commit_lock_held, sink_id_of, until_a_statement_waits_for_a_lock


async def test_a_checkpoint_is_recorded_in_one_statement_when_every_covered_epoch_is_pending(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    for epoch in range(3):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
    async with await psycopg.AsyncConnection.connect(admin.runtime.database.libpq_url, autocommit=True) as connection:
        recorded = await checkpoint_record.record_checkpoints_over_pending(
            connection, [checkpoint_record.Checkpoint("orders", registration.writer_term, 2)]
        )
        assert [(each.checkpointed_epoch, each.committed_epoch) for each in recorded.values()] == [(2, -1)]
        # Covered already, a term not current, an epoch never pre-committed: the general path decides those.
        for term, epoch in ((registration.writer_term, 2), (registration.writer_term + 1, 3), (1, 4)):
            checkpoint = checkpoint_record.Checkpoint("orders", term, epoch)
            assert await checkpoint_record.record_checkpoints_over_pending(connection, [checkpoint]) == {}


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


async def test_checkpoints_of_sinks_that_arrive_together_share_one_statement(
    admin: AdminApp, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit across sinks: the checkpoints that arrive while a statement runs share the next. One whose term a
    registration has replaced is not done by it: the general path answers it (refused) and the others are recorded."""
    sinks = [f"sink{index}" for index in range(8)]
    registrations = {sink: await admin.register(sink, table=f"db.t{index}") for index, sink in enumerate(sinks)}
    for sink in sinks:
        await admin.pre_commit(sink, registrations[sink], 0, 0)
    await admin.register(sinks[3], table="db.t3")  # a new term: the first registration's calls are fenced
    statements = _watch_statements(admin, monkeypatch)
    answers = await asyncio.gather(
        *(admin.checkpoint(sink, registrations[sink], 0, wait=False) for sink in sinks), return_exceptions=True
    )
    assert statements.sinks == [sorted(sinks)]
    assert isinstance(answers[3], Fenced), answers[3]
    assert [answer for index, answer in enumerate(answers) if index != 3] == [-1] * 7
    with psycopg.connect(libpq_url(database_url)) as connection:
        checkpointed = dict(connection.execute("SELECT name, checkpointed_epoch FROM sinks").fetchall())
    assert checkpointed == {sink: -1 if sink == sinks[3] else 0 for sink in sinks}


async def test_a_sink_whose_row_another_transaction_holds_holds_up_no_other_sinks_checkpoint(admin: AdminApp) -> None:
    """The grouped statement skips a sink whose row is locked (here as an operator's action holds it): that checkpoint
    waits on the general path, alone, and the checkpoint that arrived with it is recorded meanwhile."""
    registrations = {sink: await admin.register(sink, table=f"db.{sink}") for sink in ("held", "free")}
    for sink, registration in registrations.items():
        await admin.pre_commit(sink, registration, 0, 0)
    database = admin.runtime.database
    async with database.transaction() as session:
        assert await sink_rows.sink_by_name(session, "held", lock=RowLock.UPDATE) is not None
        held, free = (
            asyncio.create_task(admin.checkpoint(sink, registrations[sink], 0, wait=False)) for sink in ("held", "free")
        )
        assert await asyncio.wait_for(free, 10) == -1  # recorded while the other sink's row is still held
        await until_a_statement_waits_for_a_lock(database)  # the held sink's checkpoint, on the general path
        assert not held.done()
    assert await held == -1
    async with database.transaction() as session:
        for sink in ("held", "free"):
            row = await sink_rows.sink_by_name(session, sink)
            assert row is not None and row.checkpointed_epoch == 0


async def test_no_term_or_epoch_a_writer_can_send_fails_the_statement_it_shares(
    admin: AdminApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extremes of CommitCheckpoint's int64 fields, each beside another sink's checkpoint in one statement: each is
    recorded or refused with its reason, and never fails the statement the other sink's checkpoint is in."""
    hostile, neighbour = await admin.register("hostile", table="db.hostile"), await admin.register("neighbour")
    await admin.pre_commit("hostile", hostile, 0, 0)
    await admin.pre_commit("neighbour", neighbour, 0, 0)
    statements = _watch_statements(admin, monkeypatch)
    # The largest first: the current term's while the sink's checkpoint is still -1, the widest difference.
    extremes = (2**63 - 1, 2**62, 1, 0, -1, -(2**63))
    for term in (hostile.writer_term, *extremes):
        for epoch in extremes:
            answer, other = await asyncio.gather(
                admin.runtime.coordinator.commit_checkpoint("hostile", epoch, term, False),
                admin.checkpoint("neighbour", neighbour, 0, wait=False),
                return_exceptions=True,
            )
            assert other in (-1, 0), other  # recorded (and committed soon after)
            if isinstance(answer, CoordinatorError):
                assert str(answer), (term, epoch)
            else:
                assert (term, epoch) == (hostile.writer_term, 0) and answer.checkpointed_epoch == 0, (term, epoch)
    assert statements.failures == []


@dataclass
class _Statements:
    """The grouped checkpoint record's statements: the sinks each was given, and the errors of those that failed."""

    sinks: list[list[str]] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)


def _watch_statements(admin: AdminApp, monkeypatch: pytest.MonkeyPatch) -> _Statements:
    group = admin.runtime.coordinator._group_checkpoint
    statement = group._statement
    statements = _Statements()

    async def watched(connection: Any, checkpoints: Any) -> Any:
        statements.sinks.append([checkpoint.name for checkpoint in checkpoints])
        try:
            return await statement(connection, checkpoints)
        except Exception as error:
            statements.failures.append(error)
            raise

    monkeypatch.setattr(group, "_statement", watched)
    return statements
