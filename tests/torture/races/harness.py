"""One race run: a real PostgreSQL and SQL catalog, the coordinator's runtime in this process with its background
work running (committer, cleaner, maintenance), and the run's kind acting on it from several tasks at random
moments drawn from the run's seed; then everything settles and the checks run.

The checks hold whatever the kind did (tests/torture/races/__init__.py names them): no table references a missing
file; no record is in a table twice; every record in a table belongs to an epoch the log has COMMITTED; every epoch
a writer checkpointed is COMMITTED unless an operator aborted it; no record of an epoch an operator aborted is in a
table unless the log adopted the table's side (an anomaly, counted); after a reset, every table held exactly the
epochs up to the one it reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import SecretStr
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service import metrics
from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.contract.views import PreCommitOutcome
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.log.database import libpq_url, normalize_url
from coordinator_service.runtime import Runtime, migrate
from coordinator_service.settings import Settings
from tests.fixtures.admin import IN_PROCESS_STALL_SECONDS
from tests.fixtures.reachable_files import missing_reachable_files

ORDERS = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)
SCHEMA = ORDERS.serialize().to_pybytes()
OPERATOR = Operator("admin", "torture-races")
SINK = "orders"
OWN = "db.orders"


@dataclass
class Epoch:
    """What a writer pre-committed for one epoch: its records by table, and whether it was checkpointed."""

    rows: dict[str, list[int]]
    numbering: int
    checkpointed: bool = False


@dataclass
class RaceRun:
    """A run's system and what its actors did, for the checks."""

    seed: int
    database_url: str
    root: Path
    settings: Settings
    runtime: Runtime
    operations: Operations
    catalog: Catalog
    rng: random.Random
    tables: tuple[str, ...] = (OWN,)
    writer_count: int = 1
    # (numbering, epoch) -> what the writer pre-committed (the last attempt; every attempt has the same records)
    epochs: dict[tuple[int, int], Epoch] = field(default_factory=dict)
    operator_aborted: set[tuple[int, int]] = field(default_factory=set)
    numbering: int = 0
    facts: Counter[str] = field(default_factory=Counter)
    anomalies: list[str] = field(default_factory=list)
    term: int = 0
    checkpoint: int = -1
    locations: dict[str, str] = field(default_factory=dict)

    # ---------------------------------------------------------------------------------------------- the writer

    async def register(self, checkpoint: int) -> None:
        coordinator = self.runtime.coordinator
        registration = await coordinator.register_writer(
            SINK, OWN, checkpoint, writer_count=self.writer_count, arrow_schema=SCHEMA
        )
        self.term, self.checkpoint = registration.writer_term, checkpoint
        self.locations = {OWN: registration.table_location}
        others = [TableRequest(table, SCHEMA) for table in self.tables if table != OWN]
        if others:
            ensured = await coordinator.ensure_tables(SINK, self.term, others)
            self.locations.update({each.table: each.location for each in ensured.tables})

    def records(self, epoch: int, table: str) -> list[int]:
        first = self.numbering * 10_000_000 + epoch * 1_000 + self.tables.index(table) * 100
        return list(range(first, first + 5))

    async def write(self, table: str, rows: list[int], name: str = "") -> str:
        path = f"{self.locations[table].removeprefix('file://').rstrip('/')}/data/{name or uuid.uuid4().hex}.parquet"
        data = pa.Table.from_pylist(
            [{"order_id": row, "customer": table, "amount": 1.0} for row in rows], schema=ORDERS
        )

        def write() -> None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(data, path)

        await asyncio.to_thread(write)
        return f"file://{path}"

    async def pre_commit(self, epoch: int, tables: list[str], names: dict[str, str] | None = None) -> bool:
        """Write the epoch's files (one per table, each writer of a multi-writer sink a part of the records) and
        pre-commit them; False when refused (the writer restarts, as Spark would)."""
        writers = range(self.writer_count)
        calls = []
        for writer_id in writers:
            files: dict[str, str] = {}
            for table in tables:
                rows = self.records(epoch, table)[writer_id :: self.writer_count]
                files[await self.write(table, rows, (names or {}).get(f"{writer_id}/{table}", ""))] = table
            calls.append(
                PreCommitRequest(
                    SINK,
                    epoch,
                    self.term,
                    tuple(files),
                    writer_id=writer_id,
                    file_tables={path: table for path, table in files.items() if table != OWN},
                )
            )
        try:
            results = await asyncio.gather(*(self.runtime.coordinator.pre_commit(call) for call in calls))
        except CoordinatorError:
            self.facts["pre-commits refused"] += 1
            return False
        if any(result.outcome == PreCommitOutcome.ALREADY_COMMITTED for result in results):
            held = await self.table_rows_now()
            for table in tables:
                if not set(self.records(epoch, table)) <= set(held[table]):
                    self.anomalies.append(f"epoch {epoch} answered ALREADY_COMMITTED without its records in {table}")
            return True
        self.record(epoch, tables)
        return True

    def record(self, epoch: int, tables: list[str]) -> None:
        """The writer's epoch is pre-committed with files in these tables."""
        self.epochs[(self.numbering, epoch)] = Epoch({t: self.records(epoch, t) for t in tables}, self.numbering)

    async def commit_checkpoint(self, epoch: int, wait: bool = False) -> bool:
        try:
            await self.runtime.coordinator.commit_checkpoint(SINK, epoch, self.term, wait)
        except CoordinatorError:
            self.facts["checkpoints refused"] += 1
            return False
        for key, each in self.epochs.items():
            if key[0] == self.numbering and self.checkpoint < key[1] <= epoch:
                each.checkpointed = True
        self.checkpoint = epoch
        return True

    async def stream(self, epochs: int, *, pause: float = 0.02, tables: Callable[[], list[str]] | None = None) -> None:
        """Pre-commit and checkpoint `epochs` epochs, restarting from the checkpoint whenever a call is refused."""
        epoch = self.checkpoint + 1
        while epoch <= epochs:
            chosen = tables() if tables is not None else list(self.tables)
            if await self.pre_commit(epoch, chosen) and await self.commit_checkpoint(epoch):
                epoch += 1
            else:
                await self.restart()
                epoch = self.checkpoint + 1
            await asyncio.sleep(self.rng.uniform(0, pause))

    async def restart(self) -> None:
        for _ in range(50):
            try:
                await self.register(self.checkpoint)
                self.facts["writer restarts"] += 1
                return
            except CoordinatorError:
                await asyncio.sleep(0.1)
        self.anomalies.append("the writer could not register again in 50 tries")

    # ---------------------------------------------------------------------------------------------- operators

    async def pending_epochs(self) -> list[int]:
        rows = await self.query("SELECT epoch FROM pending_sink_state WHERE status = 'PENDING' ORDER BY epoch")
        return [int(epoch) for (epoch,) in rows]

    async def force_abort(self, epoch: int) -> None:
        try:
            await self.operations.abort_epoch(SINK, epoch, "torture", True, OPERATOR)
        except CoordinatorError:
            self.facts["aborts refused"] += 1
            return
        self.operator_aborted.add((self.numbering, epoch))
        self.facts["forced aborts"] += 1

    async def reset(self) -> int | None:
        """A reset, then the restart point checked; the new numbering's writer starts at -1. None when refused."""
        try:
            outcome = await self.operations.reset_sink(SINK, SINK, "torture", OPERATOR)
        except CoordinatorError:
            self.facts["resets refused"] += 1
            return None
        restart = outcome.sink.sink.committed_epoch
        held = await self.table_rows_now()
        for table in self.tables:
            expected = Counter(
                row
                for (numbering, epoch), each in self.epochs.items()
                if numbering == self.numbering and epoch <= restart and (numbering, epoch) not in self.operator_aborted
                for row in each.rows.get(table, [])
            )
            mine = Counter(row for row in held[table] if row // 10_000_000 == self.numbering)
            if mine != expected:
                self.anomalies.append(
                    f"after the reset to {restart}, {table} holds {sorted(set(mine) ^ set(expected))[:10]} "
                    "other than the epochs up to it"
                )
        self.facts["resets"] += 1
        self.numbering += 1
        self.checkpoint = -1
        await self.restart()
        return restart

    async def sweep_all_along(self) -> None:
        """Maintenance with the orphan sweep, over and over (until cancelled)."""
        while True:
            try:
                maintained = await self.runtime.maintainer.run_now(1)
                self.facts["orphans deleted"] += maintained.orphans_deleted
            except CoordinatorError:
                pass  # the committer kept the lock: the next round
            await asyncio.sleep(self.rng.uniform(0, 0.1))

    # ---------------------------------------------------------------------------------------------- the checks

    async def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(libpq_url(self.database_url), autocommit=True) as db:
            cursor = await db.execute(sql, params or None)
            return await cursor.fetchall() if cursor.description else []

    async def table_rows_now(self) -> dict[str, list[int]]:
        def read() -> dict[str, list[int]]:
            rows = {}
            for table in self.tables:
                loaded = self.catalog.load_table(table)
                rows[table] = loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()
            return rows

        return await asyncio.to_thread(read)

    async def settle(self, seconds: float = 60.0) -> None:
        """Until every checkpointed epoch is committed (the background committer, cleaner and maintenance run)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            [(checkpointed, committed)] = await self.query("SELECT checkpointed_epoch, committed_epoch FROM sinks")
            if committed == checkpointed:
                return
            await asyncio.sleep(0.1)
        self.anomalies.append(f"not settled in {seconds:.0f} s: checkpointed {checkpointed}, committed {committed}")

    async def check(self) -> None:
        held = await self.table_rows_now()
        committed = {
            (self.numbering, int(epoch))
            for (epoch,) in await self.query("SELECT epoch FROM pending_sink_state WHERE status = 'COMMITTED'")
        }
        for table in self.tables:
            counts = Counter(held[table])
            twice = [row for row, count in counts.items() if count > 1]
            if twice:
                self.anomalies.append(f"{table}: {len(twice)} records twice, e.g. {sorted(twice)[:5]}")
            loaded = await asyncio.to_thread(self.catalog.load_table, table)
            missing_files = await asyncio.to_thread(missing_reachable_files, loaded)
            if missing_files:
                self.anomalies.append(f"{table} reaches {len(missing_files)} missing files: {missing_files[:3]}")
            for key, each in self.epochs.items():
                rows = set(each.rows.get(table, []))
                present = rows & set(counts)
                if key in self.operator_aborted:
                    if present:
                        self.anomalies.append(f"{table} holds epoch {key}, which an operator aborted")
                elif each.checkpointed and rows - set(counts):
                    self.anomalies.append(f"{table} lacks checkpointed epoch {key}: {sorted(rows - set(counts))[:5]}")
                elif present and key[0] == self.numbering and key not in committed:
                    self.anomalies.append(f"{table} holds epoch {key}, which the log does not have COMMITTED")
        self.facts["anomalies counted by the coordinator"] += int(_anomalies_counted())


def age(uri: str, seconds: float) -> None:
    """Make a file look `seconds` old (written long ago); a file deleted meanwhile is left so."""
    then = time.time() - seconds
    with contextlib.suppress(FileNotFoundError):
        os.utime(uri.removeprefix("file://"), (then, then))


def _anomalies_counted() -> float:
    return sum(
        sample.value
        for family in metrics.COMMIT_ANOMALIES.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def open_run(
    seed: int, postgres_url: str, root: Path, **settings: Any
) -> tuple[RaceRun, Callable[[], Awaitable[None]]]:
    """A run on a new database of the session's PostgreSQL; the closer stops the runtime and drops the database."""
    name = f"race_{seed}_{uuid.uuid4().hex[:6]}"
    async with await psycopg.AsyncConnection.connect(libpq_url(postgres_url), autocommit=True) as db:
        await db.execute(f'CREATE DATABASE "{name}"')
    database_url = normalize_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    await asyncio.to_thread(migrate, normalize_url(database_url))
    root = root / name
    defaults: dict[str, Any] = {
        "poll_interval_seconds": 0.1,
        "retry_initial_seconds": 0.02,
        "retry_max_seconds": 0.2,
        "commit_interval_seconds": 0.0,
        "cleanup_delay_seconds": 0.0,
        "recovery_files_keep_seconds": 0.0,
        "admin_lock_timeout_seconds": 2.0,
        "maintenance_interval_seconds": 3600.0,
        "compaction_min_files": 4,
        "maintenance_rate_limit_seconds": 0.0,  # a run after every commit that asks: the most interleavings
        "metastore_stall_seconds": IN_PROCESS_STALL_SECONDS,
    }
    configured = Settings(database_url=SecretStr(database_url), data_dir=root, **{**defaults, **settings})
    runtime = await Runtime.open(configured)
    runtime.start()
    operations = Operations(
        runtime.database, runtime.iceberg, runtime.committer, runtime.cleaner, runtime.maintainer, configured
    )
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=(root / "warehouse").as_uri())
    race = RaceRun(seed, database_url, root, configured, runtime, operations, catalog, random.Random(seed))

    async def close() -> None:
        await runtime.close()
        async with await psycopg.AsyncConnection.connect(libpq_url(postgres_url), autocommit=True) as db:
            await db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return race, close
