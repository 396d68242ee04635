"""One torture run: a real coordinator, PostgreSQL, Kafka broker and Spark job, faults at random moments, checks.

The run owns the life cycle: it draws everything from its seed, prepares its
databases and topic, drives the job (starting it again after each failure or
kill) while the faults strike from their threads, awaits the system's settle,
checks it, and tears down. The faults themselves are in tests/torture/fault_kinds/
(one module per family, each kind registered with how it is triggered and its
hooks into this life cycle); the checks are in tests/torture/checks.py; what
the runs share (servers, broker, the warm driver) is the Session's. With `upsert`,
the run's stream is an upsert stream (tests/torture/upserts.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service.log.database import libpq_url, normalize_url
from coordinator_service.runtime import migrate
from tests.fixtures.coordinator import CoordinatorProcess, failpoints_env
from tests.fixtures.kafka_broker import ProducedRecord, create_topic
from tests.fixtures.pipeline import ORDER_SCHEMA_DDL, produce_orders
from tests.fixtures.service_proxy import ServiceProxy
from tests.fixtures.verification import verify_sink
from tests.torture import audit, checks, fault_kinds, kafka_faults
from tests.torture.faults import FaultRecord
from tests.torture.idle import stop_when_recorded
from tests.torture.infra import Board, DriverServer, wait_for_change
from tests.torture.report import RunResult
from tests.torture.session import CALL_DEADLINE_SECONDS, RUN_SECONDS, SINK, TABLE, Session
from tests.torture.upserts import KEY, UPSERT_DDL, UpsertStream, partition_column
from tests.torture.writers import ADMIN_TOKEN, Operator, ProtocolWriter

DRIVER_SECONDS = 150.0  # one driver that runs longer than this is hung
MAX_DRIVER_STARTS = 8
SETTLE_SECONDS = 90.0


@dataclass
class Run:
    """One seeded run's life cycle and state; the fault kinds act on the state through their hooks and threads."""

    seed: int
    session: Session
    pool: tuple[str, ...]
    faults_per_run: int | None = None  # None: one, two in about a third of the runs
    upsert: bool = False  # the stream is an upsert stream (tests/torture/upserts.py)
    rng: random.Random = field(init=False)
    board: Board = field(default_factory=Board)
    lock: threading.RLock = field(default_factory=threading.RLock)  # faults act one at a time
    coordinators: list[CoordinatorProcess] = field(default_factory=list)
    coordinator_env: dict[str, str] = field(default_factory=lambda: {"SINK_COORDINATOR_ADMIN_TOKEN": ADMIN_TOKEN})
    driver: DriverServer | None = None
    driver_starts: int = 0
    zombie_paths: set[str] = field(default_factory=set)
    writers: list[ProtocolWriter] = field(default_factory=list)
    starting_offsets: str = "earliest"  # of the next query; a reset sets the last committed epoch's offsets
    from_first_start: bool = False  # the checks expect the records from the first query's resolved start on
    fail_on_data_loss: bool = True  # the retention fault's remedy turns it off after the data-loss failure
    on_bad_record: str = "fail"
    # The query stays up after the drain (until the harness stops it), once these flags of the board are raised.
    idle: bool = False
    idle_awaits: set[str] = field(default_factory=set)
    lost_by_retention: set[int] = field(default_factory=set)
    retention_files: frozenset[str] = frozenset()  # of the epoch whose records retention deleted
    acknowledged: list[ProducedRecord] = field(default_factory=list)  # every good record the broker acknowledged
    orphans: list[Path] = field(default_factory=list)  # maintenance_kill in the sweep: files planted for it
    # topic_recreated: the records of the topic's second life, the keys its deletion may have taken (those the
    # job had not read for sure), and the batch that ran without the topic (later batches read the second life)
    second_life: dict[tuple[int, int], int] = field(default_factory=dict)
    lost_with_topic: set[int] = field(default_factory=set)
    batch_without_topic: int = -1
    bad_positions: dict[tuple[int, int], kafka_faults.BadRecord] = field(default_factory=dict)
    load: kafka_faults.LoadProducer | None = None
    starts: dict[int, dict[int, int]] = field(default_factory=dict)  # generation -> where its query started
    notes: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.work = self.session.root / f"run-{self.seed}"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o777)
        # Everything random is drawn here, in this order, from the seed.
        self.records = self.rng.randint(300, 1000)
        self.partitions = self.rng.randint(1, 4)
        self.batches = self.rng.randint(6, 10)
        self.per_batch = math.ceil(self.records / self.batches)
        self.partition_by = self.rng.choice(((), ("country",)))
        self.plans = fault_kinds.plan_faults(
            self.rng, self.pool, self.batches, CALL_DEADLINE_SECONDS, self.faults_per_run, keyed=self.upsert
        )
        self.records_of = {plan.name: FaultRecord(plan) for plan in self.plans}
        self.database = f"torture_{self.seed}_{uuid.uuid4().hex[:6]}"
        self.checkpoint = self.work / "checkpoint"
        self.warehouse = self.work / "warehouse"
        self.warehouse.mkdir()
        self.proxy = ServiceProxy()
        self.dead_letter_topic = f"torture-{self.seed}-dead-letters"
        self.first_key = self.seed % 1000 * 10_000  # of the Spark sink's records; faults' own records above it
        self.upserts = UpsertStream.drawn(self.rng, self.records) if self.upsert else None
        if self.upsert:
            self.partition_by = partition_column(self.partition_by)
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.configure is not None:
                kind.configure(self, record)
        self.operator = Operator(lambda: self.coordinators[0].http_url)

    # ---- the pieces -------------------------------------------------------------------------------------

    @property
    def metastore_url(self) -> str:
        return _render(self.session.metastore.database_url(self.database))

    @property
    def catalog_url(self) -> str:
        return _render(self.session.catalog.database_url(self.database))

    def catalog_properties(self) -> dict[str, str]:
        return {"type": "sql", "uri": self.catalog_url, "warehouse": self.warehouse.as_uri()}

    def open_catalog(self) -> Catalog:
        return load_catalog("torture", **self.catalog_properties())

    def new_coordinator(self, grpc_port: int | None = None, http_port: int | None = None) -> CoordinatorProcess:
        env = {f"SINK_COORDINATOR_CATALOG__{key.upper()}": value for key, value in self.catalog_properties().items()}
        env["SINK_COORDINATOR_CATALOG_NAME"] = "torture"
        env.update(self.coordinator_env)
        process = CoordinatorProcess(database_url=self.metastore_url, data_dir=self.work / "coordinator", extra_env=env)
        if grpc_port is not None and http_port is not None:
            process.grpc_port, process.http_port = grpc_port, http_port
        return process

    def start_coordinator(self, process: CoordinatorProcess, **env: str) -> CoordinatorProcess:
        """Start it (awaiting its health SERVING); a start that fails while a fault holds a server down retries."""
        for attempt in range(3):
            try:
                return process.start(None, **env)
            except RuntimeError as error:
                if attempt == 2:
                    raise
                self.notes.append(f"coordinator start failed, started again: {str(error)[:200]}")
                self.board.wait(lambda: self.board.has("up"), 60, unless=None)
        raise AssertionError("unreachable")

    def restart_if_current(self, process: CoordinatorProcess, downtime: float) -> bool:
        """Start a successor on the same ports, unless another fault already replaced this one."""
        with self.lock:
            if process not in self.coordinators:
                return False
            time.sleep(downtime)  # the fault's random length: how long the coordinator stays down
            successor = self.new_coordinator(process.grpc_port, process.http_port)
            self.coordinators[self.coordinators.index(process)] = successor
            self.start_coordinator(successor)
            return True

    def request(self, kill_point: str = "none", epoch: int = 0) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.session.bootstrap,
            "topic": self.topic,
            "schema": UPSERT_DDL if self.upsert else ORDER_SCHEMA_DDL,
            "mutations": {"mode": "upsert", "key": list(KEY)} if self.upsert else None,
            "max_offsets_per_trigger": self.per_batch,
            "sink": SINK,
            "table": TABLE,
            "coordinator": self.proxy.target,
            "checkpoint_location": str(self.checkpoint),
            "partition_by": list(self.partition_by),
            "starting_offsets": self.starting_offsets,
            "fail_on_data_loss": self.fail_on_data_loss,
            "on_bad_record": self.on_bad_record,
            "dead_letter_topic": self.dead_letter_topic if self.on_bad_record == "dead-letter" else None,
            "idle": self.idle,
            "kill_point": kill_point,
            "epoch": epoch,
        }

    def run_job(self, kill_point: str = "none", epoch: int = 0) -> int:
        """Run the job on the warm driver (a new one if needed); its code, or -9 if the driver was killed."""
        with self.lock:  # a fault never sees a half-started driver
            self.driver = self.session.driver()
            self.driver.board = self.board
            self.driver_starts += 1
        return self.driver.run(self.request(kill_point, epoch), DRIVER_SECONDS)

    # ---- the run ----------------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        started = time.monotonic()
        facts: dict[str, Any] = {
            "mode": "upsert" if self.upsert else "append",
            "records": self.records,
            "partitions": self.partitions,
            "max_offsets_per_trigger": self.per_batch,
            "partition_by": list(self.partition_by),
        }
        findings = checks.Findings()
        try:
            self._prepare()
            self._drive()
            settled_at = self._settle()
            if settled_at is not None:
                self._recovery_times(settled_at)
                for process in self.coordinators:  # no maintenance run expires what the checks are reading
                    process.stop()
                findings = self._check()
        except Exception as error:
            self.anomalies.append(f"harness error: {type(error).__name__}: {error}")
            self.notes.append(traceback.format_exc()[-3000:])
        finally:
            self._teardown()
        facts.update(findings.facts, driver_starts=self.driver_starts)
        anomalies = self.anomalies + findings.anomalies
        result = RunResult(
            self.seed,
            list(self.records_of.values()),
            anomalies,
            self.notes + findings.notes,
            facts,
            time.monotonic() - started,
            self.work,
        )
        (self.work / "result.json").write_text(json.dumps(result.as_json(), indent=2))
        if not anomalies:
            self._cleanup_files()
        return result

    def _prepare(self) -> None:
        self.session.metastore.create_database(self.database)
        self.session.catalog.create_database(self.database)
        migrate(normalize_url(self.metastore_url))
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            connection.execute(audit.AUDIT_SQL.encode())
        self.topic = create_topic(self.session.bootstrap, self.partitions, prefix=f"torture-{self.seed}")
        self.produced_keys = list(range(self.first_key, self.first_key + self.records))
        records: list[ProducedRecord] | None = None  # produced by a fault (bad records between the orders)
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.prepare is not None and (produced := kind.prepare(self, record)) is not None:
                records = produced
        if records is None:
            records = self.produce(self.produced_keys)
        self.acknowledged = records
        self.positions = kafka_faults.positions(records)
        self.update_topic_end()
        self.board.set("up")

    def produce(self, keys: Sequence[int], partitions: int | None = None) -> list[ProducedRecord]:
        """The run's records of these keys into its topic: orders, or (labelled by them) the upsert stream's next
        changes; where each landed."""
        partitions = self.partitions if partitions is None else partitions
        if self.upserts is None:
            return produce_orders(self.session.bootstrap, self.topic, keys, partitions=partitions)
        return self.upserts.produce(self.session.bootstrap, self.topic, keys, partitions)

    def held_labels(self) -> dict[tuple[int, int], bytes | None]:
        """What the broker holds: at each position the key of the record there (an upsert record's label)."""
        if self.upserts is None:
            return kafka_faults.held_keys(self.session.bootstrap, self.topic)
        return self.upserts.labels(kafka_faults.held_records(self.session.bootstrap, self.topic))

    def update_topic_end(self) -> None:
        """Where the topic ends once everything is produced (good and bad records; topic_recreated: the second
        life's, once the topic was created again)."""
        self.topic_end: dict[int, int] = {}
        for partition, offset in self.second_life or [*self.positions, *self.bad_positions]:
            self.topic_end[partition] = max(self.topic_end.get(partition, 0), offset + 1)

    def _drive(self) -> None:
        """Start the coordinator, the faults' threads and the writers; run the job until it drains the topic."""
        armed = [record for _, record in fault_kinds.drawn(self.records_of) if record.plan.params.get("failpoint")]
        first = self.new_coordinator()
        self.coordinators.append(first)
        env: dict[str, str] = {}
        if armed:
            env.update(
                failpoints_env(",".join(f"{r.plan.params['failpoint']}=kill@{r.plan.params['hit']}" for r in armed))
            )
        self.proxy.set_endpoints([first.grpc_port])
        self.start_coordinator(first, **env)
        threads = [
            threading.Thread(target=fault_kinds.inject, args=(self, record), name=f"fault-{name}", daemon=True)
            for name, record in self.records_of.items()
            if fault_kinds.REGISTRY[name].act is not None
        ]
        if self.idle:
            threads.append(threading.Thread(target=stop_when_recorded, args=(self,), name="idle-watcher", daemon=True))
        for thread in threads:
            thread.start()
        stop_writers = threading.Event()
        writer_threads = [writer.start(stop_writers) for writer in self._plan_writers()]
        deadline = time.monotonic() + RUN_SECONDS
        while True:
            try:
                code = self._first_job() if self.driver_starts == 0 else None
                if code is None:
                    code = self.run_job()
            except subprocess.TimeoutExpired:
                assert self.driver is not None
                tail = self.driver.tail()
                self.driver.kill()
                self.anomalies.append(f"the job hung for {DRIVER_SECONDS:.0f} s (driver killed); log tail:\n{tail}")
                break
            if code == 0:
                break
            if code == 1:
                self._after_failure()
            if code not in (-signal.SIGKILL, 1):
                self.notes.append(f"job {self.driver_starts} ended with {code}")
            if self.driver_starts >= MAX_DRIVER_STARTS or time.monotonic() > deadline:
                self.anomalies.append(f"the job did not finish after {self.driver_starts} starts")
                break
            # Whatever a fault holds down is restored before the job starts again.
            self.board.wait(lambda: self.board.has("up"), 120, unless=None)
        self.board.set("done")
        for thread in threads:
            thread.join(timeout=180)
            if thread.is_alive():
                self.anomalies.append(f"{thread.name} did not finish")
        for writer, thread in zip(self.writers, writer_threads, strict=True):
            thread.join(timeout=max(1.0, deadline + 60 - time.monotonic()))
            if thread.is_alive():
                stop_writers.set()
                self.anomalies.append(f"writer {writer.name} did not finish (checkpoint {writer.checkpoint})")
            self.anomalies.extend(writer.anomalies)
            self.notes.extend(writer.notes)
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.after_drive is not None:
                kind.after_drive(self, record)

    def _first_job(self) -> int | None:
        """The job's first start when a fault takes it (a kill point); None: the plain job."""
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.first_job is not None and (code := kind.first_job(self, record)) is not None:
                return code
        return None

    def _after_failure(self) -> None:
        """A failed job: the fault that caused it (data loss, a bad record under `fail`) applies its remedy."""
        error = self.board.last_error or ""
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.after_failure is not None and kind.after_failure(self, record, error):
                return

    def _plan_writers(self) -> list[ProtocolWriter]:
        """The protocol writers beside the Spark job, which the faults that shape the run plan from their seeds."""
        for kind, record in fault_kinds.drawn(self.records_of):
            if kind.plan_writers is not None:
                self.writers += kind.plan_writers(self, record)
        return self.writers

    def _settle(self) -> float | None:
        with self.lock:
            for index, process in enumerate(list(self.coordinators)):
                assert process.process is not None
                if process.process.poll() is not None:
                    self.notes.append(f"coordinator {index} had exited ({process.process.returncode}); restarted")
                    self.restart_if_current(process, 0.0)
        try:
            sinks = [SINK, *(writer.name for writer in self.writers)]
            wait_for_change(
                self.metastore_url,
                lambda c: True if all(checks.settled(c, sink) is not None for sink in sinks) else None,
                SETTLE_SECONDS,
            )
        except TimeoutError:
            with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
                state = connection.execute(
                    "SELECT epoch, status, files_cleaned FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
                    "WHERE status <> 'COMMITTED' ORDER BY epoch"
                ).fetchall()
                sink = connection.execute("SELECT name, checkpointed_epoch, committed_epoch FROM sinks").fetchall()
            self.anomalies.append(f"the system did not settle in {SETTLE_SECONDS:.0f} s: sink {sink}, epochs {state}")
            return None
        return time.time()

    def _recovery_times(self, settled_at: float) -> None:
        """From each fault's end to the first commit progress after it (or, with nothing left, to the settle)."""
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            rows = connection.execute(
                "SELECT extract(epoch FROM at)::float8, committed_epoch FROM torture_sink_audit ORDER BY id"
            ).fetchall()
        progress: list[float] = []
        previous = None
        for at, committed in rows:
            if previous is not None and committed > previous:
                progress.append(float(at))
            previous = committed
        for record in self.records_of.values():
            if record.triggered and record.ended_at is not None:
                after = [at for at in progress if at >= record.ended_at]
                record.recovery_seconds = (after[0] if after else settled_at) - record.ended_at

    def _check(self) -> checks.Findings:
        catalog = self.open_catalog()
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            for kind, record in fault_kinds.drawn(self.records_of):
                if kind.before_check is not None:
                    kind.before_check(self, record, connection)
            found = checks.check_run(
                connection=connection,
                catalog=catalog,
                sink=SINK,
                table=TABLE,
                produced=checks.Produced(
                    {**self.positions, **self._second_life_positions()},
                    self.starts,
                    self.batch_without_topic if self.second_life else None,
                ),
                spark_checkpoint=self.checkpoint,
                zombie_paths=self.zombie_paths,
                lost_by_retention=frozenset(self.lost_by_retention),
                may_be_missing=frozenset(self.lost_with_topic),
                bad_rows=Counter(r.key for r in self.bad_positions.values()) if self.on_bad_record == "null" else None,
                from_first_start=self.from_first_start,
                rows_check=None if self.upserts is None else self.upserts.check_rows,
            )
            for kind, record in fault_kinds.drawn(self.records_of):
                if kind.check is not None:
                    kind.check(self, record, connection, found)
            for writer in self.writers:
                writer.check(connection, catalog, found)
        checks.check_verifier_agrees(found, verify_sink(self.metastore_url, catalog, SINK))
        return found

    def _teardown(self) -> None:
        for process in self.coordinators:
            with contextlib.suppress(Exception):
                if process.process is not None:
                    os.kill(process.process.pid, signal.SIGCONT)
                process.stop()
        self.proxy.close()
        self.operator.close()
        for server in (self.session.metastore, self.session.catalog):
            if not server.running:
                server.start()

    def _cleanup_files(self) -> None:
        for server in (self.session.metastore, self.session.catalog):
            with contextlib.suppress(Exception):
                server.drop_database(self.database)
        for path in (self.warehouse, *self.work.glob("checkpoint*")):
            shutil.rmtree(path, ignore_errors=True)

    def _second_life_positions(self) -> dict[tuple[int, int], int]:
        """The second life's records, at positions apart from the first's (the checks compare keys)."""
        return {(p, checks.SECOND_LIFE_OFFSET + o): key for (p, o), key in self.second_life.items()}


def _render(url: str) -> str:
    return normalize_url(url).render_as_string(hide_password=False)


__all__ = ["Run"]
