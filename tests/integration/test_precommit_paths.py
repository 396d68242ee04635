"""One matrix of pre-commits, each answered by both ways the coordinator has of answering it.

The first pre-commit of an epoch usually goes the fast way: one group-insert
statement whose SQL checks the writer's term, the committed epoch, the writer
count, the epoch's absence and the files' owners (epoch_transitions.insert_new_epochs).
Everything else goes the general way, where the same rules are Python over rows
(protocol.Coordinator.pre_commit). Each case here runs twice, once with the fast
way tried first and once without it, and both must give the same answer and
leave the same log; the fast way's statement must insert only in the plain case.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from coordinator_service.contract.errors import (
    CoordinatorError,
    EpochAborted,
    FailedPrecondition,
    Fenced,
    InvalidArgument,
)
from coordinator_service.contract.views import PreCommitResult
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.log import epoch_transitions, sink_rows, sink_tables
from coordinator_service.log.sink_rows import RowLock
from tests.fixtures.admin import AdminApp, commit_lock_held, until_a_statement_waits_for_a_lock
from tests.fixtures.coordinator import ORDERS, orders, write_parquet
from tests.fixtures.postgres import query


@dataclasses.dataclass(frozen=True)
class Expected:
    """The answer: a result (outcome, attempt, records) or an error (its class and a part of its message)."""

    outcome: str | None = None
    attempt: int = 0
    records: int = 0
    error: type[CoordinatorError] | None = None
    says: str = ""


# What a case holds for the rest of its test (closed by the autouse fixture below).
HELD = contextlib.AsyncExitStack()


@pytest.fixture(autouse=True)
async def release_what_cases_hold(database_url: str) -> AsyncIterator[None]:
    yield
    await HELD.aclose()  # before the database goes (this fixture depends on it)


def new_file(registration_location: str) -> str:
    return write_parquet(registration_location, orders(1000, 10))


async def plain(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    return PreCommitRequest("orders", 0, registration.writer_term, (new_file(registration.table_location),))


async def empty_epoch(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    return PreCommitRequest("orders", 0, registration.writer_term, ())


async def fenced_term(admin: AdminApp) -> PreCommitRequest:
    old = await admin.register("orders")
    await admin.register("orders")
    return PreCommitRequest("orders", 0, old.writer_term, (new_file(old.table_location),))


async def term_never_issued(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    return PreCommitRequest("orders", 0, registration.writer_term + 1, (new_file(registration.table_location),))


async def epoch_already_committed(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    return PreCommitRequest("orders", 0, registration.writer_term, (new_file(registration.table_location),))


async def repeat_of_a_pending_epoch(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    return PreCommitRequest("orders", 0, registration.writer_term, (path,))


async def other_files_for_a_pending_epoch(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    return PreCommitRequest("orders", 0, registration.writer_term, (new_file(registration.table_location),))


async def new_attempt_of_an_epoch_aborted_by_recovery(admin: AdminApp) -> PreCommitRequest:
    first = await admin.register("orders")
    await admin.pre_commit("orders", first, 0, 0)
    second = await admin.register("orders")  # from no checkpoint: epoch 0 is aborted
    return PreCommitRequest("orders", 0, second.writer_term, (new_file(second.table_location),))


async def epoch_aborted_under_the_checkpoint(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.pre_commit("orders", registration, 1, 10)
    aborted = await admin.post("/api/v1/sinks/orders/epochs/1/abort", json={"reason": "poison", "force": True})
    assert aborted.status_code == 200, aborted.text
    # The checkpoint covers epoch 1, given up by the operator; epoch 0 stays PENDING (its committer waits for the
    # commit lock the test holds to the end), so 1 is not committed.
    database_url = admin.runtime.settings.database_url
    assert database_url is not None
    await HELD.enter_async_context(commit_lock_held(database_url.get_secret_value(), 1))
    await admin.runtime.coordinator.commit_checkpoint("orders", 1, registration.writer_term, wait=False)
    return PreCommitRequest("orders", 1, registration.writer_term, (new_file(registration.table_location),))


async def file_of_another_epoch(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    return PreCommitRequest("orders", 1, registration.writer_term, (path,))


async def file_of_another_sink(admin: AdminApp) -> PreCommitRequest:
    other = await admin.register("other")
    path = await admin.pre_commit("other", other, 0, 0)
    registration = await admin.register("orders")
    return PreCommitRequest("orders", 0, registration.writer_term, (path,))


async def file_already_in_the_table(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    path = await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    return PreCommitRequest("orders", 1, registration.writer_term, (path,))


async def writer_id_beyond_the_writer_count(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    path = new_file(registration.table_location)
    return PreCommitRequest("orders", 0, registration.writer_term, (path,), writer_id=1)


async def file_outside_the_table(admin: AdminApp) -> PreCommitRequest:
    registration = await admin.register("orders")
    outside = registration.table_location.rsplit("/", 1)[0] + "/elsewhere"
    return PreCommitRequest("orders", 0, registration.writer_term, (new_file(outside),))


async def _fan_out(admin: AdminApp, *routed: str) -> tuple[int, dict[str, str]]:
    """A sink with its own table and the routed ones; its writer term and the tables' locations."""
    registration = await admin.register("orders")
    ensured = await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest(table, ORDERS.serialize().to_pybytes()) for table in routed]
    )
    return registration.writer_term, {
        "db.orders": registration.table_location,
        **{table.table: table.location for table in ensured.tables},
    }


def _routed_files(locations: dict[str, str]) -> dict[str, str]:
    """A new file in each table, by path: its table, or "" for the sink's own."""
    return {new_file(location): "" if table == "db.orders" else table for table, location in locations.items()}


async def fan_out(admin: AdminApp) -> PreCommitRequest:
    term, locations = await _fan_out(admin, "db.eu", "db.us")
    files = _routed_files(locations)
    return PreCommitRequest("orders", 0, term, tuple(files), file_tables=files)


async def fan_out_to_a_table_ensured_through_another_replica(admin: AdminApp) -> PreCommitRequest:
    term, locations = await _fan_out(admin)
    admin.runtime.iceberg.ensure_table("db.eu", ORDERS, ())
    async with admin.runtime.database.transaction() as session:
        sink = await sink_rows.sink_by_name(session, "orders", lock=RowLock.UPDATE)
        assert sink is not None
        await sink_tables.add_tables(session, sink, ["db.eu"])
    files = _routed_files({**locations, "db.eu": str(admin.runtime.iceberg.load("db.eu").location())})
    return PreCommitRequest("orders", 0, term, tuple(files), file_tables=files)


async def fan_out_to_a_table_never_ensured(admin: AdminApp) -> PreCommitRequest:
    term, locations = await _fan_out(admin, "db.eu")
    admin.runtime.iceberg.ensure_table("db.us", ORDERS, ())
    files = _routed_files({**locations, "db.us": str(admin.runtime.iceberg.load("db.us").location())})
    return PreCommitRequest("orders", 0, term, tuple(files), file_tables=files)


async def fan_out_file_outside_its_table(admin: AdminApp) -> PreCommitRequest:
    term, locations = await _fan_out(admin, "db.eu")
    path = new_file(locations["db.orders"])
    return PreCommitRequest("orders", 0, term, (path,), file_tables={path: "db.eu"})


Case = Callable[[AdminApp], Awaitable[PreCommitRequest]]

MATRIX: Sequence[tuple[Case, Expected]] = (
    (plain, Expected("PERSISTED", attempt=1, records=10)),
    (empty_epoch, Expected("PERSISTED", attempt=1, records=0)),
    (fenced_term, Expected(error=Fenced, says="is fenced by term 2")),
    (term_never_issued, Expected(error=FailedPrecondition, says="was never issued")),
    (epoch_already_committed, Expected("ALREADY_COMMITTED")),
    (repeat_of_a_pending_epoch, Expected("PERSISTED", attempt=1, records=10)),
    (other_files_for_a_pending_epoch, Expected(error=FailedPrecondition, says="already pre-committed with other")),
    (new_attempt_of_an_epoch_aborted_by_recovery, Expected("PERSISTED", attempt=2, records=10)),
    (epoch_aborted_under_the_checkpoint, Expected(error=EpochAborted, says="cannot be pre-committed again")),
    (file_of_another_epoch, Expected(error=InvalidArgument, says="held by epoch 0 of sink orders (PENDING)")),
    (file_of_another_sink, Expected(error=InvalidArgument, says="held by epoch 0 of sink other (PENDING)")),
    (file_already_in_the_table, Expected(error=InvalidArgument, says="in the table: epoch 0 of sink orders")),
    (writer_id_beyond_the_writer_count, Expected(error=InvalidArgument, says="writer_id 1 is out of range")),
    (file_outside_the_table, Expected(error=InvalidArgument, says="the table's data directory")),
    (fan_out, Expected("PERSISTED", attempt=1, records=30)),
    (fan_out_to_a_table_ensured_through_another_replica, Expected("PERSISTED", attempt=1, records=20)),
    (fan_out_to_a_table_never_ensured, Expected(error=InvalidArgument, says="'db.us', which is not one of the sink")),
    (fan_out_file_outside_its_table, Expected(error=InvalidArgument, says="the table's data directory")),
)


def log_rows(database_url: str) -> list[tuple[Any, ...]]:
    """The log as the answer left it, without what differs between runs (paths, times, ids)."""
    return query(
        database_url,
        "SELECT s.name, p.epoch, p.status, p.attempt, p.file_count, p.record_count, p.abort_cause "
        "FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id ORDER BY s.name, p.epoch",
    )


@pytest.mark.parametrize("fast_way_first", [True, False], ids=["fast-way-first", "general-way-only"])
@pytest.mark.parametrize(("case", "expected"), MATRIX, ids=[case.__name__ for case, _ in MATRIX])
async def test_both_ways_answer_a_precommit_alike(
    admin: AdminApp,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    case: Case,
    expected: Expected,
    fast_way_first: bool,
) -> None:
    request = await case(admin)
    before = log_rows(database_url)
    inserted: list[dict[tuple[int, int], int]] = []
    coordinator = admin.runtime.coordinator

    async def recorded(connection: Any, rows: Any) -> dict[tuple[int, int], int]:
        inserted.append(await epoch_transitions.insert_new_epochs(connection, rows))
        return inserted[-1]

    monkeypatch.setattr(coordinator._group_insert, "_statement", recorded)
    if not fast_way_first:
        monkeypatch.setattr(coordinator, "_pre_commit_first_attempt", _no_fast_way)

    if expected.error is not None:
        with pytest.raises(expected.error) as refused:
            await coordinator.pre_commit(request)
        assert expected.says in refused.value.message
        assert log_rows(database_url) == before, "a refused pre-commit changed the log"
    else:
        result = await coordinator.pre_commit(request)
        assert (result.outcome.value, result.attempt, result.record_count) == (
            expected.outcome,
            expected.attempt,
            expected.records,
        )
        if expected.outcome == "PERSISTED":
            assert ("orders", request.epoch, "PENDING", expected.attempt, len(request.paths), expected.records) in [
                row[:6] for row in log_rows(database_url)
            ]
    plain_case = case in (plain, empty_epoch, fan_out)
    if fast_way_first and request.writer_id == 0 and not plain_case:
        assert not any(inserted), f"the group insert's SQL took a case the general way answers: {inserted}"
    if fast_way_first and plain_case:
        assert inserted and inserted[-1], "the plain case did not go the fast way"
    if not fast_way_first:
        assert inserted == [], "the general way went through the group insert"


async def _no_fast_way(request: PreCommitRequest) -> PreCommitResult | None:
    return None


async def test_a_sink_whose_row_another_transaction_holds_holds_up_no_other_sinks_precommit(
    admin: AdminApp, database_url: str
) -> None:
    """The group insert skips a sink whose row is locked (here as an operator's action holds it): that pre-commit
    waits on the general path, alone, and a pre-commit of another sink that arrives meanwhile is persisted."""
    registrations = {sink: await admin.register(sink, table=f"db.{sink}") for sink in ("held", "free")}
    database = admin.runtime.database
    async with database.transaction() as session:
        assert await sink_rows.sink_by_name(session, "held", lock=RowLock.UPDATE) is not None
        held = asyncio.create_task(admin.pre_commit("held", registrations["held"], 0, 0))
        await until_a_statement_waits_for_a_lock(database)
        await asyncio.wait_for(admin.pre_commit("free", registrations["free"], 0, 0), 10)
        assert not held.done()
    await held
    assert query(database_url, _PENDING) == [("free", 0), ("held", 0)]


_PENDING = "SELECT s.name, p.epoch FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id ORDER BY s.name"
