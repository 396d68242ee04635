"""The torture runs' other writers and the operator: sinks driven by the protocol itself, and the admin API.

A `ProtocolWriter` writes one more sink as the Spark writer does (RegisterWriter
with its checkpoint, then per epoch: Parquet files under the table, PreCommit,
its own checkpoint, CommitCheckpoint), from a thread, through the same proxy as
the Spark job, so every coordinator fault hits it too. A failed call is a
writer restart: it registers again with its checkpoint and runs the epoch again
with new files, as Spark does. Its keys are a function of the epoch, so a batch
run again writes the same records; exactly once is the union of the epochs it
checkpointed, each key once: each writer checks that against the log and its
table(s) once the run settled (`check`, with tests/torture/checks.py).

One of them can re-send an aborted epoch with the same paths (a client retry
after a lost answer, or deterministic file names): the operator aborts the
epoch after its PreCommit (force), and the writer sends it again naming the
same files; when the cleaner already deleted them, the refusal says to write
them under other names (a deleted path stays refused within the orphan grace),
and the writer does.

A `FanOutWriter` writes one sink into several tables (fan-out): its own and its
routes, each key to the table it routes to, the last route appearing mid-stream
(ensured in the epoch of its first record, as the dynamic mode does); the other
routes are ensured at each start (static routes). An epoch may have no record
for a table: no file there.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from grpc import StatusCode

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError, PreCommitFile, TableSpec
from tests.torture import checks
from tests.torture.infra import wait_for_change

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

ORDERS = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)
ADMIN_TOKEN = "torture-admin-token-Zq3vX9pL2mN8rT5wY"
WRITER_STARTS = 12  # a writer that had to start this often has an anomaly
# How the coordinator ends a refusal of files that new files fix: after an outage longer than the maintenance's
# short ORPHAN_GRACE_SECONDS, a file written before it is too old, or the orphan sweep deleted it (nothing held it).
# The writer runs the epoch again, as a Spark job does after the failed batch.
RUN_AGAIN = ("Write the batch again", "does not exist: write it before the pre-commit")


# How long, and how often, an operator's call cut off by another fault is made again.
OPERATOR_RETRY_SECONDS = 60.0
OPERATOR_RETRY_PAUSE_SECONDS = 0.25


class Operator:
    """The admin API of whichever coordinator serves (the harness passes the current one's address).

    A call that another fault cut off (the coordinator killed while it answered) is made again once a coordinator
    answers, as an operator would, when making it twice changes nothing more than once: a read, an abort (an aborted
    epoch aborted again answers 200, changed false). A reset is not made again: a second one would start another
    generation."""

    def __init__(self, http_url: Callable[[], str]) -> None:
        self._url = http_url
        self.client = httpx.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, *, repeatable: bool = True, **options: Any) -> httpx.Response:
        deadline = time.monotonic() + OPERATOR_RETRY_SECONDS
        while True:
            try:
                return self.client.request(method, f"{self._url()}/api/v1{path}", **options)
            except httpx.TransportError:
                if not repeatable or time.monotonic() > deadline:
                    raise
            time.sleep(OPERATOR_RETRY_PAUSE_SECONDS)  # a client's backoff: the harness brings a coordinator back

    def sink(self, sink: str) -> dict[str, Any]:
        return dict(self._ok(self._call("GET", f"/sinks/{sink}")))

    def epochs(self, sink: str, status: str) -> list[dict[str, Any]]:
        page = self._ok(self._call("GET", f"/sinks/{sink}/epochs", params={"status": status, "limit": 1000}))
        return list(page["epochs"])

    def epoch(self, sink: str, epoch: int) -> dict[str, Any]:
        return dict(self._ok(self._call("GET", f"/sinks/{sink}/epochs/{epoch}")))

    def abort(self, sink: str, epoch: int, *, force: bool) -> httpx.Response:
        body = {"reason": "torture: an operator aborts it", "force": force}
        return self._call("POST", f"/sinks/{sink}/epochs/{epoch}/abort", json=body)

    def reset(self, sink: str) -> dict[str, Any]:
        body = {"confirm": sink, "reason": "torture: the checkpoint is lost"}
        return dict(self._ok(self._call("POST", f"/sinks/{sink}/reset", repeatable=False, json=body)))

    @staticmethod
    def _ok(response: httpx.Response) -> Any:
        if response.status_code != HTTPStatus.OK:
            raise RuntimeError(
                f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
            )
        return response.json()


@dataclass
class ProtocolWriter:
    name: str
    table: str
    target: str
    epochs: int
    first_key: int
    rows: int
    pace_seconds: float  # between two epochs: the writer's trigger interval
    operator: Operator | None = None  # set for the writer that re-sends an aborted epoch
    resend_epoch: int | None = None
    resend_after_cleanup: bool = False  # re-send once the cleaner deleted the files (else at once)
    metastore_url: str = ""
    checkpoint: int = -1
    starts: int = 0
    notes: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    resend: dict[str, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)

    def keys(self, epoch: int) -> list[int]:
        first = self.first_key + epoch * self.rows
        return list(range(first, first + self.rows))

    def expected_keys(self) -> list[int]:
        return [key for epoch in range(self.checkpoint + 1) for key in self.keys(epoch)]

    def check(self, connection: psycopg.Connection[Any], catalog: Catalog, found: checks.Findings) -> None:
        """Exactly once in its table: the keys of the epochs it checkpointed, each once."""
        of_writer = checks.check_run(
            connection=connection,
            catalog=catalog,
            sink=self.name,
            table=self.table,
            produced=checks.Produced({(0, index): key for index, key in enumerate(self.expected_keys())}),
            spark_checkpoint=None,
            zombie_paths=set(),
            writer_checkpoint=self.checkpoint,
        )
        found.anomalies.extend(f"{self.name}: {text}" for text in of_writer.anomalies)
        found.notes.extend(f"{self.name}: {text}" for text in of_writer.notes)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(stop,), name=f"writer-{self.name}", daemon=True)
        thread.start()
        return thread

    def _run(self, stop: threading.Event) -> None:
        try:
            with CoordinatorClient(self.target, timeout_seconds=5, retry_seconds=25) as client:
                while self.checkpoint < self.epochs - 1 and not stop.is_set():
                    if self.starts >= WRITER_STARTS:
                        self.anomalies.append(f"writer {self.name} started {self.starts} times without finishing")
                        return
                    self.starts += 1
                    try:
                        self._session(client, stop)
                    except CoordinatorRpcError as error:
                        if error.code not in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED) and not (
                            error.code == StatusCode.INVALID_ARGUMENT and error.message.endswith(RUN_AGAIN)
                        ):
                            self.anomalies.append(f"writer {self.name}: {error.code.name} {error.message[:300]}")
                            return
                        # As Spark does after a failed batch: the writer starts again and runs the epoch again.
                        self.notes.append(f"writer {self.name} restarts after {error.code.name}")
                if not stop.is_set():
                    self._last_report(client)
        except Exception as error:  # the harness's own failure: an anomaly, never a hang
            self.anomalies.append(f"writer {self.name} failed: {type(error).__name__}: {error}")
        finally:
            self.done.set()

    def _session(self, client: CoordinatorClient, stop: threading.Event) -> None:
        """One writer process's life: register with the checkpoint, then epochs until done or a call fails."""
        registration = client.register_writer(
            self.name, self.table, self.checkpoint, arrow_schema=ORDERS.serialize().to_pybytes()
        )
        location = registration.table_location
        pacing = threading.Event()
        while self.checkpoint < self.epochs - 1 and not stop.is_set():
            epoch = self.checkpoint + 1
            paths = self._write(location, epoch)
            client.pre_commit(self.name, epoch, registration.writer_term, paths)
            if epoch == self.resend_epoch and not self.resend:
                self._resend_aborted(client, registration.writer_term, location, epoch, paths)
            self.checkpoint = epoch  # the writer's own checkpoint, before it reports it (as Spark's)
            client.commit_checkpoint(self.name, epoch, registration.writer_term)
            pacing.wait(self.pace_seconds)

    def _last_report(self, client: CoordinatorClient) -> None:
        """The final report, until the last epoch is in the table (a restart registers with the checkpoint)."""
        for _ in range(WRITER_STARTS):
            try:
                registration = client.register_writer(
                    self.name, self.table, self.checkpoint, arrow_schema=ORDERS.serialize().to_pybytes()
                )
                client.commit_checkpoint(self.name, self.checkpoint, registration.writer_term, wait=True)
                return
            except CoordinatorRpcError as error:
                if error.code not in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED):
                    raise
                self.notes.append(f"writer {self.name}: final report {error.code.name}, again")
        self.anomalies.append(f"writer {self.name}: the final report never landed")

    def _write(self, location: str, epoch: int) -> list[str]:
        keys = self.keys(epoch)
        halves = (keys[: len(keys) // 2], keys[len(keys) // 2 :])
        return [write_orders(location, part, f"{self.name}-{epoch}-{uuid.uuid4().hex}.parquet") for part in halves]

    def _resend_aborted(
        self, client: CoordinatorClient, term: int, location: str, epoch: int, paths: list[str]
    ) -> None:
        """The operator aborts the epoch just pre-committed; the writer sends it again with the same paths."""
        assert self.operator is not None
        try:
            answer = self.operator.abort(self.name, epoch, force=True)
        except httpx.TransportError as error:  # the coordinator it asked is down (another fault): no abort
            self.notes.append(f"resend: the abort could not be sent: {error}")
            return
        self.resend = {"epoch": epoch, "abort_status": answer.status_code, "after_cleanup": self.resend_after_cleanup}
        if answer.status_code != HTTPStatus.OK:
            self.notes.append(f"resend: the abort answered {answer.status_code} {answer.text[:200]}")
            return
        if self.resend_after_cleanup:
            wait_for_change(self.metastore_url, lambda c: self._cleaned(c, epoch), 60)
        for round_ in range(5):
            try:
                client.pre_commit(self.name, epoch, term, paths)
                self.resend["rewritten"] = round_
                return
            except CoordinatorRpcError as error:
                # The cleaner deleted the aborted attempt's files first (and a deleted path stays refused within
                # ORPHAN_GRACE_SECONDS): the writer writes the batch again under new names, as Spark's retry does.
                if error.code != StatusCode.INVALID_ARGUMENT:
                    raise
                self.notes.append(f"resend of epoch {epoch} refused ({error.message[:240]}); files written again")
                paths = self._write(location, epoch)
        self.anomalies.append(f"writer {self.name}: the re-sent epoch {epoch} was refused five times")

    def _cleaned(self, connection: psycopg.Connection[Any], epoch: int) -> bool | None:
        row = connection.execute(
            "SELECT p.files_cleaned FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
            "WHERE s.name = %s AND p.epoch = %s",
            (self.name, epoch),
        ).fetchone()
        return True if row is not None and row[0] else None


@dataclass
class FanOutWriter(ProtocolWriter):
    """One sink writing its own table and `routes` (the last from epoch `added_at` on), each key to its route."""

    routes: tuple[str, ...] = ()
    added_at: int = 0
    # The tables EnsureTables made the sink's (its own is from its registration).
    ensured: set[str] = field(default_factory=set)

    def tables_at(self, epoch: int) -> tuple[str, ...]:
        routes = self.routes if epoch >= self.added_at else self.routes[:-1]
        return (self.table, *routes)

    def route(self, key: int, epoch: int) -> str:
        tables = self.tables_at(epoch)
        return tables[(key // 3) % len(tables)]

    def keys_by_table(self) -> dict[str, list[int]]:
        """The keys each of the sink's tables must hold once: those of the checkpointed epochs that route to it."""
        keys: dict[str, list[int]] = {table: [] for table in (self.table, *self.ensured)}
        for epoch in range(self.checkpoint + 1):
            for key in self.keys(epoch):
                keys[self.route(key, epoch)].append(key)
        return keys

    def check(self, connection: psycopg.Connection[Any], catalog: Catalog, found: checks.Findings) -> None:
        """Exactly once in each of the writer's tables (its keys that route there), and the tables' records."""
        for table, keys in self.keys_by_table().items():
            of_table = checks.check_run(
                connection=connection,
                catalog=catalog,
                sink=self.name,
                table=table,
                produced=checks.Produced({(0, index): key for index, key in enumerate(keys)}),
                spark_checkpoint=None,
                zombie_paths=set(),
                writer_checkpoint=self.checkpoint,
            )
            found.anomalies.extend(f"{self.name} {table}: {text}" for text in of_table.anomalies)
            found.notes.extend(f"{self.name} {table}: {text}" for text in of_table.notes)
        found.anomalies.extend(
            f"{self.name}: {text}"
            for text in checks.check_sink_tables(connection, self.name, {self.table, *self.ensured})
        )
        found.facts["fan_out_tables_checked"] = found.facts.get("fan_out_tables_checked", 0) + len(self.ensured) + 1

    def _session(self, client: CoordinatorClient, stop: threading.Event) -> None:
        registration = client.register_writer(
            self.name, self.table, self.checkpoint, arrow_schema=ORDERS.serialize().to_pybytes()
        )
        locations = {self.table: registration.table_location}
        pacing = threading.Event()
        while self.checkpoint < self.epochs - 1 and not stop.is_set():
            epoch = self.checkpoint + 1
            new = [table for table in self.tables_at(epoch) if table not in locations]
            if new:
                schema = ORDERS.serialize().to_pybytes()
                ensured = client.ensure_tables(
                    self.name, registration.writer_term, [TableSpec(table, schema) for table in new]
                )
                locations.update((table.table, table.location) for table in ensured.tables)
                self.ensured.update(table.table for table in ensured.tables)
            routed: dict[str, list[int]] = {}
            for key in self.keys(epoch):
                routed.setdefault(self.route(key, epoch), []).append(key)
            files: list[str | PreCommitFile] = [
                PreCommitFile(
                    write_orders(locations[table], keys, f"{self.name}-{epoch}-{uuid.uuid4().hex}.parquet"),
                    table="" if table == self.table else table,
                )
                for table, keys in routed.items()
            ]
            client.pre_commit(self.name, epoch, registration.writer_term, files)
            self.checkpoint = epoch
            client.commit_checkpoint(self.name, epoch, registration.writer_term)
            pacing.wait(self.pace_seconds)


def write_orders(location: str, keys: list[int], name: str) -> str:
    """A Parquet file of these keys' orders under the table location's data directory; its URI."""
    directory = Path(location.removeprefix("file://")) / "data"
    directory.mkdir(parents=True, exist_ok=True)
    rows = {"order_id": keys, "customer": [f"c{key % 7}" for key in keys], "amount": [key * 1.5 for key in keys]}
    path = directory / name
    temporary = path.with_name(f".{name}.tmp")
    pq.write_table(pa.table(rows, schema=ORDERS), temporary)
    temporary.replace(path)  # whole or not at all, as object storage writes a file
    return path.as_uri()


def plan_fan_out_writers(
    rng: random.Random, count: int, routes: int, target: str, first_key: int
) -> list[FanOutWriter]:
    """`count` fan-out writers of `routes` tables besides their own (the last added mid-stream), drawn from `rng`."""
    writers = []
    for index in range(count):
        epochs = rng.randint(6, 14)
        writers.append(
            FanOutWriter(
                name=f"fan_{index}",
                table=f"torture.fan_{index}",
                target=target,
                epochs=epochs,
                first_key=first_key + index * 100_000,
                rows=rng.randint(2, 40),
                pace_seconds=round(rng.uniform(0.05, 0.6), 3),
                routes=tuple(f"torture.fan_{index}_route_{route}" for route in range(routes)),
                added_at=rng.randint(1, epochs - 1),
            )
        )
    return writers


def plan_writers(
    rng: random.Random,
    count: int,
    target: str,
    first_key: int,
    resend: Operator | None,
    metastore_url: str,
) -> list[ProtocolWriter]:
    """`count` writers (the first re-sends an aborted epoch when `resend`: the operator), drawn from `rng`."""
    writers = []
    for index in range(count):
        epochs = rng.randint(6, 14)
        writers.append(
            ProtocolWriter(
                name=f"extra_{index}",
                table=f"torture.extra_{index}",
                target=target,
                epochs=epochs,
                first_key=first_key + index * 100_000,
                rows=rng.randint(2, 40),
                pace_seconds=round(rng.uniform(0.05, 0.6), 3),
                operator=resend if index == 0 else None,
                resend_epoch=rng.randint(0, epochs - 1) if resend is not None and index == 0 else None,
                resend_after_cleanup=rng.random() < 0.5,
                metastore_url=metastore_url,
            )
        )
    return writers
