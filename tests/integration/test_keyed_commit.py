"""The keyed commit path (issue 29, coordinator_service.engine.keyed_commit) on a real PostgreSQL and a real SQL
catalog: a keyed sink's checkpointed epochs are committed as row deltas (their rows added, position deletes for the
live rows of every key they touched, resolved through the key index), one snapshot per group with the sink's marker,
and the table as pyiceberg and DuckDB read it holds the last value of each key, whatever happens between: coalesced
epochs, crashes between the Iceberg commit and the COMMITTED record, pre-commits sent again, another writer or
maintenance moving the table while a commit is resolved."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from pydantic import SecretStr
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from coordinator_service import failpoints
from coordinator_service.admin.api import create_app
from coordinator_service.contract.client import CoordinatorRpcError
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from coordinator_service.contract.views import PreCommitOutcome, Registration
from coordinator_service.engine.key_index import KeyIndex
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import Runtime, migrate
from coordinator_service.settings import Settings
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.key_resolution import LiveRows
from coordinator_service.tables.pyiceberg_internals import data_files_of
from tests.fixtures.admin import CLIENT_ADDRESS, IN_PROCESS_STALL_SECONDS, AdminApp, eventually
from tests.fixtures.coordinator import failpoints_env, write_parquet
from tests.fixtures.keyed_tables import (
    KEY_SCHEMA,
    KEYED,
    Delete,
    Operation,
    Row,
    Upsert,
    apply,
    assert_table_holds,
    commit_epochs,
    epoch_files,
    pyiceberg_rows,
)
from tests.fixtures.postgres import new_database, query

SINK = "orders"
TABLE = "db.orders"
KEY = ("id",)
# How long a test waits for a commit: a committer that cannot commit keyed epochs (a release before the keyed commit
# path) leaves them PENDING, and the wait fails instead of hanging.
COMMIT_SECONDS = 60.0


def sink_snapshots(table: Table) -> list[tuple[int, str]]:
    """The epoch each of the sink's snapshots carries, and its operation, oldest first."""
    return [
        (int(properties[MARKER_EPOCH]), str(snapshot.summary.operation.value) if snapshot.summary else "")
        for snapshot in table.snapshots()
        if (properties := snapshot_properties(snapshot)).get(MARKER_SINK) == SINK
    ]


async def register_keyed(admin: AdminApp, checkpointed: int = -1) -> Registration:
    return await admin.runtime.coordinator.register_writer(
        SINK, TABLE, checkpointed, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY
    )


async def pre_commit(admin: AdminApp, registration: Registration, epoch: int, operations: Sequence[Operation]) -> None:
    paths, keys = epoch_files(registration.table_location, operations)
    answer = await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(SINK, epoch, registration.writer_term, paths, key_paths=keys)
    )
    assert answer.outcome is PreCommitOutcome.PERSISTED, answer


async def test_keyed_epochs_are_committed_as_row_deltas_with_the_sinks_markers(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    """Upserts, an update and a delete in one epoch, then an epoch that only deletes: each a snapshot with the sink's
    marker (overwrite when it adds and deletes rows, delete when it only deletes), the table the model after each."""
    registration = await register_keyed(admin)
    model: dict[int, Row] = {}
    epochs: list[list[Operation]] = [
        [Upsert(1, "eu", "a"), Upsert(2, "eu", "b"), Upsert(3, "us", "c")],
        [Upsert(2, "eu", "b2"), Delete(3), Upsert(4, "us", "d"), Upsert(2, "us", "b3")],
        [Delete(1), Delete(99)],
    ]
    for epoch, operations in enumerate(epochs):
        await pre_commit(admin, registration, epoch, operations)
        async with asyncio.timeout(COMMIT_SECONDS):
            assert await admin.checkpoint(SINK, registration, epoch) == epoch
        apply(model, operations)
        assert_table_holds(catalog.load_table(TABLE), model)
    assert sink_snapshots(catalog.load_table(TABLE)) == [(0, "append"), (1, "overwrite"), (2, "delete")]
    assert query(database_url, "SELECT DISTINCT status FROM pending_sink_state") == [("COMMITTED",)]


def test_keyed_epochs_through_grpc_survive_a_kill_between_the_commit_and_its_record(
    coordinator_factory: Any, catalog: Catalog, database_url: str
) -> None:
    """Through the real protocol (a coordinator process, gRPC): a keyed writer registers with its key, pre-commits data
    and key files and checkpoints; the process is killed (SIGKILL) after the row delta is committed and before the
    COMMITTED record. The restarted process finds the epoch by its marker and only marks it: no row inserted or
    deleted twice. The writer then sends the committed epoch's pre-commit again (told it is committed), and a next
    epoch updating and deleting the same keys is committed through the key index left by the first process."""
    model: dict[int, Row] = {}
    first_epoch: list[Operation] = [Upsert(key, "eu", f"v{key}") for key in range(6)]
    second_epoch: list[Operation] = [Upsert(2, "us", "w2"), Delete(3), Delete(4), Upsert(6, "eu", "w6"), Delete(40)]
    first = coordinator_factory(**failpoints_env("commit.after_append=kill"))
    with first.client(retry_seconds=0) as client:
        writer = client.register_writer(SINK, TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY)
        assert writer.key_columns == KEY
        paths, keys = epoch_files(writer.table_location, first_epoch)
        assert (
            client.pre_commit(SINK, 0, writer.writer_term, paths, key_files=keys).outcome is PreCommitOutcome.PERSISTED
        )
        with pytest.raises(CoordinatorRpcError) as killed:
            client.commit_checkpoint(SINK, 0, writer.writer_term, wait=True, timeout_seconds=COMMIT_SECONDS)
        assert killed.value.code is grpc.StatusCode.UNAVAILABLE
    assert first.wait_killed() == -9
    apply(model, first_epoch)
    assert query(database_url, "SELECT status FROM pending_sink_state WHERE epoch = 0") == [("PENDING",)]
    assert_table_holds(catalog.load_table(TABLE), model)  # the row delta landed before the kill

    second = coordinator_factory()
    second.wait_for_log("epochs found already in the table; marked committed", sink=SINK, epochs=[0])
    table = catalog.load_table(TABLE)
    assert_table_holds(table, model)
    assert sink_snapshots(table) == [(0, "append")]
    with second.client() as client:
        writer = client.register_writer(SINK, TABLE, 0, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY)
        resent = client.pre_commit(SINK, 0, writer.writer_term, paths, key_files=keys)
        assert resent.outcome is PreCommitOutcome.ALREADY_COMMITTED
        paths, keys = epoch_files(writer.table_location, second_epoch)
        assert (
            client.pre_commit(SINK, 1, writer.writer_term, paths, key_files=keys).outcome is PreCommitOutcome.PERSISTED
        )
        committed = client.commit_checkpoint(SINK, 1, writer.writer_term, wait=True, timeout_seconds=COMMIT_SECONDS)
        assert committed.committed_epoch == 1
    apply(model, second_epoch)
    table = catalog.load_table(TABLE)
    assert_table_holds(table, model)
    assert sink_snapshots(table) == [(0, "append"), (1, "overwrite")]


# Keys overlap on purpose: every epoch updates and deletes what earlier ones (and the other writer) wrote.
KEYS = st.integers(min_value=0, max_value=11)
OPERATIONS = st.one_of(
    st.builds(Upsert, KEYS, st.sampled_from(["eu", "us"]), st.text("abc", min_size=1, max_size=3)),
    st.builds(Delete, KEYS),
)
EPOCH = st.lists(OPERATIONS, min_size=1, max_size=8)


class RacingKeyIndex:
    """The committer's key index, with another writer's row delta committed right after the keys of the next commit
    were resolved: that commit was resolved against a head that is gone, and must be refused and resolved again."""

    def __init__(self, inner: KeyIndex, race: Any) -> None:
        self.inner = inner
        self.race = race
        self.resolutions = 0

    async def positions(self, table: Table, keys: Any) -> LiveRows:
        found = await self.inner.positions(table, keys)
        self.resolutions += 1
        if self.race is not None:
            race, self.race = self.race, None
            await asyncio.to_thread(race)
        return found

    async def record(self, committed: Any) -> bool:
        return await self.inner.record(committed)


class KeyedSinkCommits(RuleBasedStateMachine):
    """A keyed sink's epochs committed by an in-process coordinator while the table is written and maintained behind
    its back and the coordinator restarts mid-commit; after every step the table, read by pyiceberg and by DuckDB, is
    the model (the last value of each key, deleted keys absent), with one snapshot of the sink per group."""

    def __init__(self, postgres_url: str, root: Path) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.database_url = self.stack.enter_context(new_database(postgres_url))
        self.loop = asyncio.new_event_loop()
        migrate(normalize_url(self.database_url))
        self.data_dir = root / uuid.uuid4().hex[:8]
        warehouse = self.data_dir / "warehouse"
        warehouse.mkdir(parents=True)
        self.catalog = load_catalog("default", type="sql", uri=self.database_url, warehouse=warehouse.as_uri())
        self.gateway = IcebergGateway(self.catalog)
        self.runtime: Runtime | None = None
        self.model: dict[int, Row] = {}
        self.epoch = -1
        self.snapshots = 0  # the sink's snapshots the table should carry: one per group

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    async def _open(self) -> Runtime:
        settings = Settings(
            database_url=SecretStr(self.database_url),
            data_dir=self.data_dir,
            poll_interval_seconds=0.2,
            retry_initial_seconds=0.05,
            retry_max_seconds=0.5,
            cleanup_delay_seconds=0.0,
            commit_interval_seconds=0.0,
            metastore_stall_seconds=IN_PROCESS_STALL_SECONDS,
        )
        runtime = await Runtime.open(settings)
        runtime.start()
        return runtime

    def teardown(self) -> None:
        try:
            if self.runtime is not None:
                self.run(self.runtime.close())
        finally:
            failpoints.configure("")
            self.loop.close()
            self.stack.close()

    @property
    def coordinator(self) -> Any:
        assert self.runtime is not None
        return self.runtime.coordinator

    @initialize()
    def register(self) -> None:
        self.runtime = self.run(self._open())
        self.registration = self.run(
            self.coordinator.register_writer(
                SINK, TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY
            )
        )

    def _pre_commit(self, operations: Sequence[Operation]) -> int:
        self.epoch += 1
        paths, keys = epoch_files(self.registration.table_location, operations)
        answer = self.run(
            self.coordinator.pre_commit(
                PreCommitRequest(SINK, self.epoch, self.registration.writer_term, paths, key_paths=keys)
            )
        )
        assert answer.outcome is PreCommitOutcome.PERSISTED
        return self.epoch

    def _checkpoint(self) -> None:
        result = self.run(
            asyncio.wait_for(
                self.coordinator.commit_checkpoint(SINK, self.epoch, self.registration.writer_term, True),
                COMMIT_SECONDS,
            )
        )
        assert result.committed_epoch == self.epoch

    @rule(operations=EPOCH)
    def one_epoch(self, operations: list[Operation]) -> None:
        self.snapshots += 1
        self._pre_commit(operations)
        self._checkpoint()
        apply(self.model, operations)

    @rule(epochs=st.lists(EPOCH, min_size=2, max_size=3))
    def coalesced_epochs(self, epochs: list[list[Operation]]) -> None:
        """Several epochs checkpointed at once: one snapshot, each epoch resolved after the one before."""
        self.snapshots += 1
        for operations in epochs:
            self._pre_commit(operations)
        self._checkpoint()
        for operations in epochs:
            apply(self.model, operations)

    @rule(operations=EPOCH)
    def restart_between_the_commit_and_its_record(self, operations: list[Operation]) -> None:
        """The row delta is committed, then the coordinator stops before the COMMITTED record (a process that died
        there); the next one finds the epoch by its marker and only marks it. The writer sends the epoch's
        pre-commit again once it is committed: it is told so, and nothing changes."""
        self.snapshots += 1
        failpoints.configure("commit.after_append=pause")
        epoch = self._pre_commit(operations)
        self.run(self.coordinator.commit_checkpoint(SINK, epoch, self.registration.writer_term, False))
        apply(self.model, operations)
        self.run(eventually(self._holds_marker(epoch), "the row delta committed"))
        assert self.runtime is not None
        self.run(self.runtime.close())
        failpoints.configure("")
        self.runtime = self.run(self._open())
        self._checkpoint()
        request = PreCommitRequest(SINK, epoch, self.registration.writer_term, (), key_paths=())
        resent = self.run(self.coordinator.pre_commit(request))
        assert resent.outcome is PreCommitOutcome.ALREADY_COMMITTED

    def _holds_marker(self, epoch: int) -> Any:
        async def check() -> bool:
            table = await asyncio.to_thread(self.catalog.load_table, TABLE)
            return bool(sink_snapshots(table)) and sink_snapshots(table)[-1][0] == epoch

        return check

    @rule(race=EPOCH, operations=EPOCH)
    def another_writer_commits_while_an_epoch_is_resolved(
        self, race: list[Operation], operations: list[Operation]
    ) -> None:
        """Another writer's row delta lands after the coordinator resolved its epoch's keys and before its commit:
        the commit is refused (the head moved) and resolved again against the new head."""
        assert self.runtime is not None
        keyed = self.runtime.committer.keyed
        racing = RacingKeyIndex(keyed.key_index, lambda: commit_epochs(self.gateway, TABLE, [race]))
        keyed.key_index = racing  # type: ignore[assignment]
        try:
            apply(self.model, race)
            self.snapshots += 1
            self._pre_commit(operations)
            self._checkpoint()
            apply(self.model, operations)
        finally:
            keyed.key_index = racing.inner
        assert racing.race is None, "the other writer did not commit"
        assert racing.resolutions == 2, "the epoch was not resolved again after the head moved"

    @rule()
    def compaction(self) -> None:
        """Every live row rewritten with its deletes applied (the project's replace snapshot): every position moves."""
        table = self.catalog.load_table(TABLE)
        rows = table.scan().to_arrow()
        if rows.num_rows:
            written = list(data_files_of(table.metadata, rows, table.io))
            cp.commit_compaction(table, cp.Rewrite(cp.live_files(table).data, written))

    @invariant()
    def the_table_is_the_model(self) -> None:
        if self.runtime is None:
            return
        table = self.catalog.load_table(TABLE)
        assert_table_holds(table, self.model)
        assert len(sink_snapshots(table)) == self.snapshots


def test_a_keyed_sinks_table_is_the_last_value_of_each_key_through_anything(postgres_url: str, tmp_path: Path) -> None:
    class Machine(KeyedSinkCommits):
        def __init__(self) -> None:
            super().__init__(postgres_url, tmp_path)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=int(os.environ.get("SINK_TEST_KEYED_COMMIT_EXAMPLES", "10")),
            stateful_step_count=10,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


async def test_a_table_holding_only_the_deletes_of_an_epoch_holds_the_epoch(
    admin_factory: Any, database_url: str, tmp_path: Path, catalog: Catalog
) -> None:
    """Fan-out: an epoch that only deletes, and only in another of the sink's tables, is committed there as a snapshot
    of delete files alone; the coordinator stops before the COMMITTED record. An operator's forced abort then finds it
    in that table by its marker (it was marked COMMITTED and not aborted): the table's deletes are not disowned."""
    admin = await admin_factory()
    registration = await register_keyed(admin)
    coordinator = admin.runtime.coordinator
    request = TableRequest("db.eu", KEYED.serialize().to_pybytes(), (), KEY)
    [eu] = (await coordinator.ensure_tables(SINK, registration.writer_term, [request])).tables
    epochs: list[list[Operation]] = [[Upsert(1, "eu", "a"), Upsert(2, "eu", "b")], [Delete(1)]]
    for epoch, operations in enumerate(epochs):
        paths, keys = epoch_files(eu.location, operations)
        tables = dict.fromkeys((*paths, *keys), "db.eu")
        await coordinator.pre_commit(
            PreCommitRequest(SINK, epoch, registration.writer_term, paths, key_paths=keys, file_tables=tables)
        )
    async with asyncio.timeout(COMMIT_SECONDS):
        assert await admin.checkpoint(SINK, registration, 0) == 0
    failpoints.configure("commit.after_append=pause")
    try:
        await admin.checkpoint(SINK, registration, 1, wait=False)

        async def deleted() -> bool:
            table = await asyncio.to_thread(catalog.load_table, "db.eu")
            return pyiceberg_rows(table) == [(2, "eu", "b")]

        await eventually(deleted, "the epoch's deletes committed to db.eu")
        await admin.runtime.close()
    finally:
        failpoints.configure("")
    stopped = await Runtime.open(admin.runtime.settings)  # not started: no committer marks the epoch first
    app = create_app(stopped)
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=CLIENT_ADDRESS), base_url="http://coordinator"
    )
    try:
        response = await http.post(f"/api/v1/sinks/{SINK}/epochs/1/abort", json={"reason": "test", "force": True})
    finally:
        await http.aclose()
        await stopped.close()
    assert response.status_code == 409, response.text
    assert "already in the table" in response.text
    assert query(database_url, "SELECT epoch, status FROM pending_sink_state ORDER BY epoch") == [
        (0, "COMMITTED"),
        (1, "COMMITTED"),
    ]
    assert pyiceberg_rows(catalog.load_table("db.eu")) == [(2, "eu", "b")]
    assert pyiceberg_rows(catalog.load_table(TABLE)) == []


async def test_an_epoch_holding_a_key_twice_sticks_the_sink_instead_of_retrying_forever(
    admin: AdminApp, catalog: Catalog
) -> None:
    """A writer's defect (or a hand-written writer) sends an epoch whose rows hold a key twice: no retry can commit it
    (the key would appear twice), so the sink is stuck, saying which key and files, and the table is left as it was."""
    registration = await register_keyed(admin)
    await pre_commit(admin, registration, 0, [Upsert(1, "eu", "a")])
    async with asyncio.timeout(COMMIT_SECONDS):
        assert await admin.checkpoint(SINK, registration, 0) == 0
    twice = [{"id": 2, "region": "eu", "value": "b"}, {"id": 2, "region": "us", "value": "c"}]
    paths = (write_parquet(registration.table_location, twice, KEYED),)
    keys = (write_parquet(registration.table_location, [{"id": 2}], KEY_SCHEMA),)
    answer = await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(SINK, 1, registration.writer_term, paths, key_paths=keys)
    )
    assert answer.outcome is PreCommitOutcome.PERSISTED
    await admin.checkpoint(SINK, registration, 1, wait=False)

    async def stuck() -> bool:
        committer = (await admin.get(f"/api/v1/sinks/{SINK}")).json()["committer"]
        return isinstance(committer, dict) and committer["state"] == "stuck"

    await eventually(stuck, "the sink stuck on the epoch holding a key twice")
    committer = (await admin.get(f"/api/v1/sinks/{SINK}")).json()["committer"]
    assert "DuplicateKeys" in committer["last_error"] and "(2,)" in committer["last_error"], committer
    assert committer["failed_attempts"] == 0  # not retried as if it were an outage
    assert_table_holds(catalog.load_table(TABLE), {1: (1, "eu", "a")})
