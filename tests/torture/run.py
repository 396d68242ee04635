"""One torture run: a real coordinator, PostgreSQL, Kafka broker and Spark job, faults at random moments, checks.

The session (two PostgreSQL servers: the metastore's and the catalog's; a
Kafka-protocol broker) is shared by the runs; each run has its own databases,
topic, warehouse, Spark checkpoint, coordinator process(es) and driver(s).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.log import precommit_metadata
from coordinator_service.log.database import libpq_url, normalize_url
from coordinator_service.runtime import migrate
from spark_writer.sink.kafka_records import BAD_RECORDS_PROPERTY
from tests.fixtures.coordinator import CoordinatorProcess, failpoints_env
from tests.fixtures.kafka_broker import ProducedRecord, _stop, create_topic, start_broker
from tests.fixtures.pipeline import ORDER_SCHEMA_DDL, produce_orders
from tests.torture import checks, kafka_faults
from tests.torture.faults import FAULTS, FaultPlan, FaultRecord, plan_faults
from tests.torture.infra import Board, DriverServer, PgServer, Proxy, wait_for_change
from tests.torture.writers import (
    ADMIN_TOKEN,
    FanOutWriter,
    Operator,
    ProtocolWriter,
    plan_fan_out_writers,
    plan_writers,
)

SINK = "orders"
TABLE = "torture.orders"
CALL_DEADLINE_SECONDS = 5.0  # the writer's deadline of one coordinator call
RETRY_SECONDS = 25.0  # how long the writer retries UNAVAILABLE (a restart fits in it)
DRIVER_SECONDS = 150.0  # one driver that runs longer than this is hung
RUN_SECONDS = 300.0  # a run that has not settled by then has an anomaly
SECOND_LIFE_OFFSET = 1_000_000_000  # topic_recreated: the second life's positions, apart from the first's
MAX_DRIVER_STARTS = 8
SETTLE_SECONDS = 90.0


@dataclass
class Session:
    """What the runs share: PostgreSQL servers and the broker (restarted faults happen on these)."""

    root: Path
    metastore: PgServer
    catalog: PgServer
    bootstrap: str
    _broker: subprocess.Popen[bytes] | None = None
    _broker_dir: Path | None = None
    _driver: DriverServer | None = None
    _standby: DriverServer | None = None
    driver_processes: int = 0

    def driver(self) -> DriverServer:
        """The warm Spark driver; when the last was killed, the standby (started beforehand) takes over.

        A supervisor restarting a killed driver would start a JVM; the standby has
        started it already, so a run pays the job's restart, not the JVM's start.
        """
        if self._driver is None or not self._driver.alive:
            if self._driver is not None:
                self._driver.stop()
            standby = self._standby
            self._driver, self._standby = (standby if standby is not None and standby.alive else self._spawn()), None
        if self._standby is None or not self._standby.alive:
            self._standby = self._spawn()
        return self._driver

    def _spawn(self) -> DriverServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SINK_COORDINATOR_", "SINK_WRITER_"))}
        self.driver_processes += 1
        return DriverServer(
            [str(CALL_DEADLINE_SECONDS), str(RETRY_SECONDS)], self.root / f"driver-{self.driver_processes}.log", env
        )

    def restart_broker(self, downtime_seconds: float) -> bool:
        """Stop the broker and start it again on its port with its data (False: an external broker)."""
        if self._broker is None or self._broker_dir is None:
            return False
        _stop(self._broker)
        time.sleep(downtime_seconds)  # how long the broker stays down
        self._broker, _ = start_broker(self._broker_dir, int(self.bootstrap.rsplit(":", 1)[1]))
        return True

    @classmethod
    @contextlib.contextmanager
    def open(cls, root: Path | None = None) -> Iterator[Session]:
        # Not under a private tree: the embedded server runs as its own unprivileged user.
        base = root or Path(tempfile.mkdtemp(prefix="sink-coordinator-torture-"))
        base.mkdir(parents=True, exist_ok=True)
        metastore = PgServer(base, "metastore-pg")
        catalog = PgServer(base, "catalog-pg")
        broker: subprocess.Popen[bytes] | None = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not bootstrap:
            broker_dir = base / "noida-db"
            broker_dir.mkdir(parents=True, exist_ok=True)
            broker, bootstrap = start_broker(broker_dir)
        session = cls(base, metastore, catalog, bootstrap, broker, base / "noida-db" if broker else None)
        try:
            yield session
        finally:
            for driver in (session._driver, session._standby):
                if driver is not None:
                    driver.stop()
            if session._broker is not None:
                _stop(session._broker)
            for server in (metastore, catalog):
                with contextlib.suppress(Exception):
                    if not server.running:
                        server.start()
                    server.stop("fast")
            if root is None:
                shutil.rmtree(base, ignore_errors=True)


@dataclass
class RunResult:
    seed: int
    faults: list[FaultRecord]
    anomalies: list[str]
    notes: list[str]
    facts: dict[str, Any]
    seconds: float
    work: Path

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "faults": [record.as_json() for record in self.faults],
            "anomalies": self.anomalies,
            "notes": self.notes,
            "facts": self.facts,
            "seconds": round(self.seconds, 2),
            "work": str(self.work),
        }


@dataclass
class Run:
    seed: int
    session: Session
    pool: tuple[str, ...]
    faults_per_run: int | None = None  # None: one, two in about a third of the runs
    rng: random.Random = field(init=False)
    board: Board = field(default_factory=Board)
    lock: threading.RLock = field(default_factory=threading.RLock)  # faults act one at a time
    coordinators: list[CoordinatorProcess] = field(default_factory=list)
    driver: DriverServer | None = None
    driver_starts: int = 0
    zombie_paths: set[str] = field(default_factory=set)
    writers: list[ProtocolWriter] = field(default_factory=list)
    starting_offsets: str = "earliest"  # of the next query; a reset sets the last committed epoch's offsets
    fail_on_data_loss: bool = True  # the retention fault's remedy turns it off after the data-loss failure
    on_bad_record: str = "fail"
    lost_by_retention: set[int] = field(default_factory=set)
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
        self.plans = plan_faults(self.rng, self.pool, self.batches, CALL_DEADLINE_SECONDS, self.faults_per_run)
        self.records_of = {plan.name: FaultRecord(plan) for plan in self.plans}
        self.database = f"torture_{self.seed}_{uuid.uuid4().hex[:6]}"
        self.checkpoint = self.work / "checkpoint"
        self.warehouse = self.work / "warehouse"
        self.warehouse.mkdir()
        self.proxy = Proxy(seed=self.rng.randrange(2**31))
        # The query stays up after the drain (until the harness stops it).
        self.idle = bool({"outage_then_idle", "latest_under_load", "topic_recreated"} & set(self.records_of))
        self.dead_letter_topic = f"torture-{self.seed}-dead-letters"
        if bad := self.records_of.get("bad_records"):
            self.on_bad_record = bad.plan.params["policy"]
        if "latest_under_load" in self.records_of:
            self.starting_offsets = "latest"
        self.coordinator_env = {"SINK_COORDINATOR_ADMIN_TOKEN": ADMIN_TOKEN}
        if many := self.records_of.get("many_sinks"):
            self.coordinator_env.update(
                SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS=str(many.plan.params["commit_interval_seconds"]),
                SINK_COORDINATOR_COMMIT_CONCURRENCY=str(many.plan.params["commit_concurrency"]),
            )
        if maintenance := self.records_of.get("maintenance_kill"):
            params = maintenance.plan.params
            self.coordinator_env.update(
                SINK_COORDINATOR_MAINTENANCE_INTERVAL_SECONDS=str(params["interval_seconds"]),
                SINK_COORDINATOR_SNAPSHOT_MAX_COUNT=str(params["snapshot_max_count"]),
                SINK_COORDINATOR_COMPACTION_MIN_FILES=str(params["compaction_min_files"]),
                SINK_COORDINATOR_ORPHAN_SWEEP_INTERVAL_SECONDS=str(params["interval_seconds"]),
                SINK_COORDINATOR_ORPHAN_GRACE_SECONDS=str(params["orphan_grace_seconds"]),
            )
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
            "schema": ORDER_SCHEMA_DDL,
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
            connection.execute(checks.AUDIT_SQL.encode())
        self.topic = create_topic(self.session.bootstrap, self.partitions, prefix=f"torture-{self.seed}")
        first_key = self.seed % 1000 * 10_000
        self.produced_keys = list(range(first_key, first_key + self.records))
        if bad := self.records_of.get("bad_records"):
            made = kafka_faults.bad_records(
                random.Random(bad.plan.params["seed"]), bad.plan.params["count"], first_key + 5000
            )
            records, self.bad_positions = kafka_faults.produce_with_bad(
                self.session.bootstrap, self.topic, self.produced_keys, self.partitions, made
            )
            create_topic(self.session.bootstrap, 1, name=self.dead_letter_topic)
            bad.triggered = True
        else:
            records = produce_orders(self.session.bootstrap, self.topic, self.produced_keys, partitions=self.partitions)
        self.acknowledged = records
        self.positions = kafka_faults.positions(records)
        if latest := self.records_of.get("latest_under_load"):
            params = latest.plan.params
            self.load = kafka_faults.LoadProducer(
                self.session.bootstrap,
                self.topic,
                self.partitions,
                list(range(first_key + 6000, first_key + 6000 + params["records"])),
                params["per_second"],
            )
        self._topic_end()
        self.board.set("up")

    def _topic_end(self) -> None:
        """Where the topic ends once everything is produced (good and bad records; topic_recreated: the second
        life's, once the topic was created again)."""
        self.topic_end: dict[int, int] = {}
        for partition, offset in self.second_life or [*self.positions, *self.bad_positions]:
            self.topic_end[partition] = max(self.topic_end.get(partition, 0), offset + 1)

    def _drive(self) -> None:
        armed = [
            self.records_of[name]
            for name in ("coordinator_failpoint", "maintenance_kill", "fan_out")
            if name in self.records_of and self.records_of[name].plan.params.get("failpoint")
        ]
        retention = self.records_of.get("retention_before_rerun")
        killpoint = self.records_of.get("driver_killpoint")
        first = self.new_coordinator()
        self.coordinators.append(first)
        env: dict[str, str] = {}
        if armed:
            env.update(
                failpoints_env(",".join(f"{r.plan.params['failpoint']}=kill@{r.plan.params['hit']}" for r in armed))
            )
        self.proxy.set_targets([first.grpc_port], reset=False)
        self.start_coordinator(first, **env)
        threads = [
            threading.Thread(target=self._fault, args=(record,), name=f"fault-{name}", daemon=True)
            for name, record in self.records_of.items()
        ]
        if self.idle:
            threads.append(threading.Thread(target=self._stop_when_recorded, name="idle-watcher", daemon=True))
        for thread in threads:
            thread.start()
        stop_writers = threading.Event()
        writer_threads = [writer.start(stop_writers) for writer in self._plan_writers()]
        if self.load is not None:
            threading.Thread(target=self._start_load, name="load", daemon=True).start()
        deadline = time.monotonic() + RUN_SECONDS
        while True:
            try:
                if retention is not None and self.driver_starts == 0:
                    code = self.run_job("after-precommit", retention.plan.params["epoch"])
                    if code == -signal.SIGKILL:
                        self._retention(retention)
                elif killpoint is not None and self.driver_starts == 0:
                    code = self.run_job(killpoint.plan.params["kill_point"], killpoint.plan.params["epoch"])
                    killpoint.triggered = code == -signal.SIGKILL
                    killpoint.started_at = killpoint.ended_at = time.time()
                    self.board.set("killpoint-fired")
                else:
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
        if self.load is not None and self.load.error is not None:
            self.anomalies.append(f"the load producer failed: {self.load.error}")
        if resend := self.records_of.get("resend_aborted"):
            resend.detail.update(self.writers[0].resend)
            resend.triggered = self.writers[0].resend.get("abort_status") == 200

    def _plan_writers(self) -> list[ProtocolWriter]:
        """The protocol writers of many_sinks and resend_aborted, and fan_out's (drawn from their own seeds)."""
        many, resend = self.records_of.get("many_sinks"), self.records_of.get("resend_aborted")
        first_key = (self.seed % 1000 + 1000) * 1_000_000
        shaping = many or resend
        if shaping is not None:
            count = int(many.plan.params["writers"]) if many is not None else 1
            operator = self.operator if resend is not None else None
            rng = random.Random(shaping.plan.params["writers_seed"])
            self.writers = plan_writers(rng, count, self.proxy.target, first_key, operator, self.metastore_url)
            if many is not None:
                many.triggered = True
                many.detail["sinks"] = count + 1
        if fan := self.records_of.get("fan_out"):
            params = fan.plan.params
            self.writers += plan_fan_out_writers(
                random.Random(params["writers_seed"]),
                int(params["writers"]),
                int(params["routes"]),
                self.proxy.target,
                first_key + 50_000_000,
            )
            fan.triggered = fan.triggered or not params["failpoint"]
            fan.detail["tables"] = {
                writer.name: len(writer.routes) + 1 for writer in self.writers if isinstance(writer, FanOutWriter)
            }
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
            if "latest_under_load" in self.records_of and self.bad_positions:
                self._unread_bad_records(connection)
            found = checks.check_run(
                connection=connection,
                catalog=catalog,
                sink=SINK,
                table=TABLE,
                produced=checks.Produced({**self.positions, **self._second_life_positions()}, self.starts),
                spark_checkpoint=self.checkpoint,
                zombie_paths=self.zombie_paths,
                lost_by_retention=frozenset(self.lost_by_retention),
                may_be_missing=frozenset(self.lost_with_topic),
                bad_rows=Counter(r.key for r in self.bad_positions.values()) if self.on_bad_record == "null" else None,
                from_first_start="latest_under_load" in self.records_of,
            )
            if self.bad_positions:
                found.anomalies.extend(self._check_bad_records(connection))
            if maintenance := self.records_of.get("maintenance_kill"):
                row = connection.execute(
                    "SELECT count(*), sum(snapshots_expired), sum(expired_files_deleted), sum(files_compacted), "
                    "sum(orphans_deleted) FROM maintenance_runs"
                ).fetchone()
                names = ("maintenance_runs", "snapshots_expired", "expired_files_deleted", "files_compacted", "orphans")
                maintenance.detail.update(zip(names, (int(v or 0) for v in row or ()), strict=False))
                left = [path.name for path in self.orphans if path.exists()]
                if maintenance.triggered and left:
                    found.anomalies.append(f"orphan files the sweep should have deleted are still there: {left}")
            for writer in self.writers:
                if isinstance(writer, FanOutWriter):
                    self._check_fan_out(connection, catalog, writer, found)
                    continue
                keys = writer.expected_keys()
                of_writer = checks.check_run(
                    connection=connection,
                    catalog=catalog,
                    sink=writer.name,
                    table=writer.table,
                    produced=checks.Produced({(0, index): key for index, key in enumerate(keys)}),
                    spark_checkpoint=None,
                    zombie_paths=set(),
                    writer_checkpoint=writer.checkpoint,
                )
                found.anomalies.extend(f"{writer.name}: {text}" for text in of_writer.anomalies)
                found.notes.extend(f"{writer.name}: {text}" for text in of_writer.notes)
        return found

    def _check_fan_out(
        self, connection: psycopg.Connection[Any], catalog: Catalog, writer: FanOutWriter, found: checks.Findings
    ) -> None:
        """Exactly once in each of the writer's tables (its keys that route there), and the tables' records."""
        for table, keys in writer.keys_by_table().items():
            of_table = checks.check_run(
                connection=connection,
                catalog=catalog,
                sink=writer.name,
                table=table,
                produced=checks.Produced({(0, index): key for index, key in enumerate(keys)}),
                spark_checkpoint=None,
                zombie_paths=set(),
                writer_checkpoint=writer.checkpoint,
            )
            found.anomalies.extend(f"{writer.name} {table}: {text}" for text in of_table.anomalies)
            found.notes.extend(f"{writer.name} {table}: {text}" for text in of_table.notes)
        found.anomalies.extend(
            f"{writer.name}: {text}"
            for text in checks.check_sink_tables(connection, writer.name, {writer.table, *writer.ensured})
        )
        found.facts["fan_out_tables_checked"] = found.facts.get("fan_out_tables_checked", 0) + len(writer.ensured) + 1

    def _unread_bad_records(self, connection: psycopg.Connection[Any]) -> None:
        """With startingOffsets=latest, bad records produced before the resolved start are never read."""
        row = connection.execute(
            "SELECT metadata FROM torture_epoch_audit WHERE epoch = 0 AND generation = 0 AND op <> 'DELETE' "
            "AND sink_id = (SELECT id FROM sinks WHERE name = %s) ORDER BY id LIMIT 1",
            (SINK,),
        ).fetchone()
        start = checks.start_offsets(precommit_metadata.decode(bytes(row[0])).properties) if row else None
        if start is None:
            return
        self.bad_positions = {(p, o): bad for (p, o), bad in self.bad_positions.items() if o >= start.get(p, 0)}
        if not self.bad_positions:
            record = self.records_of["bad_records"]
            record.triggered = False
            record.detail["skipped"] = "startingOffsets=latest resolved after the bad records"

    def _check_bad_records(self, connection: psycopg.Connection[Any]) -> list[str]:
        """Every bad record counted once in the committed epochs' properties, and where its policy sends it."""
        record = self.records_of["bad_records"]
        anomalies = []
        if self.on_bad_record == "fail":
            anomalies.append("records that do not fit the schema under `fail`, and the job never failed on them")
        counted = 0
        for metadata, status in connection.execute(
            "SELECT DISTINCT ON (generation, epoch) metadata, status FROM torture_epoch_audit "
            "WHERE op <> 'DELETE' AND sink_id = (SELECT id FROM sinks WHERE name = %s) "
            "ORDER BY generation, epoch, id DESC",
            (SINK,),
        ):
            if status == "COMMITTED":
                counted += int(precommit_metadata.decode(bytes(metadata)).properties.get(BAD_RECORDS_PROPERTY, "0"))
        record.detail.update(final_policy=self.on_bad_record, bad=len(self.bad_positions), counted=counted)
        if counted != len(self.bad_positions):
            anomalies.append(
                f"{counted} bad records counted in the committed epochs, {len(self.bad_positions)} produced"
            )
        if self.on_bad_record == "dead-letter":
            letters = kafka_faults.dead_letters(self.session.bootstrap, self.dead_letter_topic)
            record.detail["dead_letters"] = sum(letters.values())
            if set(letters) != set(self.bad_positions):
                held, bad = sorted(letters), sorted(self.bad_positions)
                anomalies.append(f"the dead-letter topic holds {held}, the bad records were at {bad}")
        return anomalies

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

    # ---- the faults -------------------------------------------------------------------------------------

    def _fault(self, record: FaultRecord) -> None:
        plan = record.plan
        try:
            if plan.name in ("coordinator_failpoint", "maintenance_kill") or (
                plan.name == "fan_out" and plan.params["failpoint"]
            ):
                if plan.params.get("failpoint") == "maintenance.during_sweep":
                    self._plant_orphans(record)
                self._failpoint(record)
                return
            if plan.name == "driver_killpoint":
                self.board.wait(lambda: self.board.has("killpoint-fired"), RUN_SECONDS, unless=None)
                return
            if plan.name in (
                "many_sinks",
                "resend_aborted",
                "fan_out",
                "bad_records",
                "latest_under_load",
                "retention_before_rerun",
            ):
                return  # the run's shape, or acted on by the supervisor (_drive)
            if plan.name == "outage_then_idle":
                self._outage_then_idle(record)
                return
            if not self.board.wait(lambda: self.board.precommits >= plan.trigger_batch, RUN_SECONDS):
                return
            if self.board.wait(lambda: False, plan.delay_seconds):  # the random moment after the trigger
                return
            if plan.name == "topic_recreated":  # awaits the job's failure and re-run: not under the lock
                self._topic_recreated(record)
                return
            with self.lock:
                if self.board.has("done"):
                    return
                getattr(self, f"_{plan.name}")(record)
        except Exception as error:
            self.anomalies.append(f"fault {plan.name} failed: {type(error).__name__}: {error}")
            self.notes.append(traceback.format_exc()[-3000:])
            self.board.set("up")

    def _plant_orphans(self, record: FaultRecord) -> None:
        """Files nothing references, older than the grace, in the table's data directory once it exists: the
        sweep's work, so that the kill inside it happens (a killed task's files would be such orphans)."""
        if not self.board.wait(lambda: self.board.precommits >= 1, RUN_SECONDS):
            return
        data = self.warehouse / "torture" / "orders" / "data"
        data.mkdir(parents=True, exist_ok=True)
        old = time.time() - 3600
        self.orphans = [data / f"orphan-{uuid.uuid4().hex}.parquet" for _ in range(4)]
        for path in self.orphans:
            path.write_bytes(b"PAR1 planted by the torture harness PAR1")
            os.utime(path, (old, old))
        record.detail["orphans_planted"] = len(self.orphans)

    def _begin(self, record: FaultRecord) -> None:
        record.triggered = True
        record.started_at = time.time()

    def _coordinator_kill(self, record: FaultRecord) -> None:
        victim = self.coordinators[int(record.plan.params.get("which", 0)) % len(self.coordinators)]
        self._begin(record)
        self.board.set("up", False)
        victim.kill()
        self.restart_if_current(victim, record.plan.params["downtime_seconds"])
        record.ended_at = time.time()
        self.board.set("up")

    def _failpoint(self, record: FaultRecord) -> None:
        process = self.coordinators[0]
        assert process.process is not None
        died = threading.Event()

        def await_exit() -> None:
            assert process.process is not None
            process.process.wait()
            died.set()
            self.board.set("coordinator-died")

        threading.Thread(target=await_exit, daemon=True).start()
        self.board.wait(lambda: self.board.has("coordinator-died"), RUN_SECONDS)
        if not died.is_set():
            return  # the job finished before the failpoint's hit: the coordinator stays up
        with self.lock:
            if process.process.returncode != -signal.SIGKILL or process not in self.coordinators:
                return
            try:
                hit = process.wait_for_log("failpoint hit", 10).get("failpoint")
            except TimeoutError:
                hit = None
            if hit is not None and hit != record.plan.params["failpoint"]:
                return  # the run's other armed failpoint killed it: that fault restarts it
            self._begin(record)
            record.detail["failpoint_logged"] = hit is not None
            self.board.set("up", False)
            self.restart_if_current(process, record.plan.params["downtime_seconds"])
            record.ended_at = time.time()
            self.board.set("up")

    def _coordinator_stall(self, record: FaultRecord) -> None:
        victim = self.coordinators[0]
        assert victim.process is not None
        self._begin(record)
        self.board.set("up", False)
        os.kill(victim.process.pid, signal.SIGSTOP)
        try:
            time.sleep(record.plan.params["stall_seconds"])  # the stall's random length
        finally:
            os.kill(victim.process.pid, signal.SIGCONT)
        record.ended_at = time.time()
        self.board.set("up")

    def _split_brain(self, record: FaultRecord) -> None:
        params = record.plan.params
        first = self.coordinators[0]
        self._begin(record)
        second = self.start_coordinator(self.new_coordinator())
        self.coordinators.append(second)
        self.proxy.set_targets([first.grpc_port, second.grpc_port], reset=True)
        time.sleep(params["seconds"])  # both serve this long
        victim, survivor = (second, first) if params["survivor"] == "first" else (first, second)
        self.proxy.set_targets([survivor.grpc_port], reset=False)
        if params["end_by"] == "kill":
            victim.kill()
        else:
            victim.stop()
        self.proxy.reset()
        self.coordinators.remove(victim)
        record.ended_at = time.time()

    def _driver_kill(self, record: FaultRecord) -> None:
        driver = self.driver
        if driver is None or not driver.alive:
            return
        self._begin(record)
        driver.kill()
        record.ended_at = time.time()

    def _executor_kill(self, record: FaultRecord) -> None:
        driver = self.driver
        workers = driver.python_workers() if driver is not None else []
        if not workers:
            record.detail["skipped"] = "no Python worker running at that moment"
            return
        victim = workers[int(record.plan.params["pick"] * len(workers))]
        self._begin(record)
        record.detail["worker"] = " ".join(victim.cmdline()[-3:])
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        record.ended_at = time.time()

    def _postgres_restart(self, record: FaultRecord) -> None:
        params = record.plan.params
        self._begin(record)
        self.board.set("up", False)
        self.session.metastore.stop(params["mode"])
        time.sleep(params["downtime_seconds"])  # how long PostgreSQL stays down
        self.session.metastore.start()
        record.ended_at = time.time()
        self.board.set("up")

    def _catalog_outage(self, record: FaultRecord) -> None:
        self._begin(record)
        self.board.set("up", False)
        self.session.catalog.stop("fast")
        time.sleep(record.plan.params["downtime_seconds"])  # how long the catalog is unavailable
        self.session.catalog.start()
        record.ended_at = time.time()
        self.board.set("up")

    def _zombie_writer(self, record: FaultRecord) -> None:
        driver = self.driver
        if driver is None or not driver.alive or not self.board.terms:
            return
        old_term = self.board.terms[-1]
        self._begin(record)
        driver.kill()  # the supervisor starts a new driver, which registers with a newer term
        self.lock.release()  # let other faults act while the new driver starts (the supervisor needs no lock)
        try:
            registered = self.board.wait(lambda: bool(self.board.terms) and self.board.terms[-1] > old_term, 120)
        finally:
            self.lock.acquire()
        if not registered:
            record.detail["skipped"] = "no new registration"
            return
        location = self.open_catalog().load_table(TABLE).location().removeprefix("file://")
        candidates = sorted(Path(location, "data").rglob("*.parquet"))
        if not candidates:
            record.detail["skipped"] = "no data file to imitate"
            return
        source = candidates[int(record.plan.params["pick"] * len(candidates))]
        zombie = source.with_name(f"zombie-{uuid.uuid4().hex}.parquet")
        shutil.copyfile(source, zombie)
        self.zombie_paths.add(zombie.as_uri())
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
        epoch = int(row[0]) + 1 if row else 0
        codes: dict[str, str] = {}
        with CoordinatorClient(self.proxy.target, timeout_seconds=10, retry_seconds=30) as client:
            for call, invoke in (
                ("pre_commit", lambda: client.pre_commit(SINK, epoch, old_term, [zombie.as_uri()])),
                ("commit_checkpoint", lambda: client.commit_checkpoint(SINK, epoch, old_term)),
            ):
                try:
                    invoke()
                    codes[call] = "OK"
                except CoordinatorRpcError as error:
                    codes[call] = error.code.name
                    record.detail[f"{call}_message"] = error.message[:200]
        record.detail.update(old_term=old_term, epoch=epoch, codes=codes)
        for call, code in codes.items():
            if code != grpc.StatusCode.FAILED_PRECONDITION.name:
                self.anomalies.append(f"zombie writer (term {old_term}) {call}({epoch}) answered {code}")
        record.ended_at = time.time()

    def _operator_abort(self, record: FaultRecord) -> None:
        force = bool(record.plan.params["force"])

        def newest_pending(connection: psycopg.Connection[Any]) -> int | None:
            row = connection.execute(
                "SELECT max(p.epoch) FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
                "WHERE s.name = %s AND p.status = 'PENDING'",
                (SINK,),
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        try:  # the next PENDING epoch (with no commit interval, an epoch is PENDING for a moment only)
            epoch = wait_for_change(self.metastore_url, newest_pending, 20)
        except TimeoutError:
            record.detail["skipped"] = "no PENDING epoch in 20 s"
            return
        self._begin(record)
        answer = self.operator.abort(SINK, epoch, force=force)
        body = answer.json()
        record.detail.update(epoch=epoch, force=force, status=answer.status_code)
        if answer.status_code == 200:
            record.detail["changed"] = body["changed"]
            if body["changed"] and not force:
                self.anomalies.append(f"operator abort of PENDING epoch {epoch} without force answered {body}")
        elif answer.status_code == 409:
            record.detail["message"] = body["error"]["message"][:200]
            if force and "COMMITTED" not in body["error"]["message"] and "committed" not in body["error"]["message"]:
                self.anomalies.append(f"forced abort of epoch {epoch} refused: {body}")
        else:
            self.anomalies.append(f"operator abort of epoch {epoch} answered {answer.status_code}: {answer.text[:300]}")
        record.ended_at = time.time()

    def _operator_reset(self, record: FaultRecord) -> None:
        """docs/operations.md's procedure for a lost checkpoint, exactly once: stop, reset, restart from offsets."""
        self._begin(record)
        self.board.set("up", False)
        if self.driver is not None and self.driver.alive:
            self.driver.kill()  # 1. the writer stops (the reset would fence it anyway)
        answer = self.operator.reset(SINK)  # 2.
        sink = answer["sink"]
        generation, committed = int(sink["generation"]), int(sink["committed_epoch"])
        # 3. before a writer registers: where the last committed epoch ended (or, with none committed in this
        # generation, where its query started)
        if committed >= 0:
            entry = json.loads(self.operator.epoch(SINK, committed)["properties"]["spark.end_offsets"])[0]
            start = {int(partition): int(offset) for partition, offset in entry[self.topic].items()}
            self.starting_offsets = json.dumps(entry)  # the entry as it is (batch 0's holds "$start" too)
        else:
            start = self.starts.get(generation - 1, {})
            self.starting_offsets = (
                json.dumps({self.topic: {str(p): o for p, o in start.items()}}) if start else "earliest"
            )
        self.starts[generation] = start
        self.checkpoint = self.work / f"checkpoint-{generation}"  # 4. a new, empty checkpoint location
        record.detail.update(committed_epoch=committed, aborted=answer["aborted_epochs"], generation=generation)
        record.ended_at = time.time()
        self.board.set("up")

    def _lock_kill(self, record: FaultRecord) -> None:
        """Terminate the connection holding a commit lock (when one is held; awaited on the metastore's events)."""
        killed: list[int] = []

        def holder(connection: psycopg.Connection[Any]) -> int | None:
            row = connection.execute(
                "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() LIMIT 1"
            ).fetchone()
            return None if row is None else int(row[0])

        for _ in range(int(record.plan.params["attempts"])):
            try:
                pid = wait_for_change(self.metastore_url, holder, 20)
            except TimeoutError:
                break
            with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
                row = connection.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
            if row is not None and row[0]:
                if not killed:
                    self._begin(record)
                killed.append(pid)
        if not killed:
            record.detail["skipped"] = "no commit lock held in 20 s"
            return
        record.detail["terminated"] = len(killed)
        record.ended_at = time.time()

    def _at_last_batch(self, connection: psycopg.Connection[Any]) -> int | None:
        """The epoch of the Spark sink's batch that reads up to the topic's end, once it is pre-committed."""
        for epoch, metadata in connection.execute(
            "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
            "WHERE s.name = %s AND p.epoch > %s ORDER BY p.epoch DESC LIMIT 3",
            (SINK, self.batch_without_topic),
        ):
            end = checks.end_offsets(precommit_metadata.decode(bytes(metadata)).properties)
            if end is not None and all(end.get(p, 0) >= o for p, o in self.topic_end.items()):
                return int(epoch)
        return None

    def _broker_restart(self, record: FaultRecord) -> None:
        self._begin(record)
        self.board.set("up", False)
        if not self.session.restart_broker(record.plan.params["downtime_seconds"]):
            record.triggered = False
            record.detail["skipped"] = "an external broker (KAFKA_BOOTSTRAP_SERVERS) cannot be restarted"
        record.ended_at = time.time()
        self.board.set("up")
        self._settle_topic()

    def _start_load(self) -> None:
        """latest_under_load: the producer starts while the job resolves its start, after the plan's delay."""
        assert self.load is not None
        record = self.records_of["latest_under_load"]
        self.board.wait(lambda: bool(self.board.terms), RUN_SECONDS)
        self.board.wait(lambda: False, record.plan.params["delay_seconds"])
        self._begin(record)
        self.load.start().join()
        with self.lock:
            self.acknowledged = [*self.acknowledged, *self.load.produced]
            self.positions.update(kafka_faults.positions(self.load.produced))
            self._topic_end()
        self._settle_topic()
        record.ended_at = time.time()
        self.board.set("produced")

    def _settle_topic(self) -> None:
        """After a broker restart, expect what the broker holds: a broker may lose records it acknowledged.

        noida-db did once, over a restart while a producer wrote: it gave 99 later records offsets it had
        already acknowledged for others, so the topic ended below what the producer was told and the job
        (rightly) never read those records. That is the broker's fault, not the pipeline's: it is noted,
        and the table is checked against the records the broker really holds. Called when the restart and
        the load producer are both over, by whichever of their threads ends last.
        """
        restart = self.records_of.get("broker_restart")
        if restart is None or not restart.triggered or restart.ended_at is None:
            return
        if self.load is not None and not self.load.done.is_set():
            return
        with self.lock:
            starts = kafka_faults.log_starts(self.session.bootstrap, self.topic)
            held = kafka_faults.held_keys(self.session.bootstrap, self.topic)
            lost = kafka_faults.lost_by_broker(self.acknowledged, held, starts)
            restart.detail["broker_lost"] = len(lost)
            if not lost:
                return
            self.notes.append(f"the broker lost {len(lost)} records it had acknowledged, over its restart")
            good = {r.key for r in self.acknowledged}
            self.positions = {
                position: int(key)
                for position, key in held.items()
                if key in good and position not in self.bad_positions
            }
            self._topic_end()

    def _retention(self, record: FaultRecord) -> None:
        """The driver died after PreCommit(N): delete part of batch N's records before the job runs again."""
        epoch = int(record.plan.params["epoch"])
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            rows: dict[int, bytes] = dict(
                connection.execute(
                    "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
                    "WHERE s.name = %s AND p.epoch IN (%s, %s)",
                    (SINK, epoch - 1, epoch),
                ).fetchall()
            )
        if epoch not in rows:
            record.detail["skipped"] = "the driver died before the batch's pre-commit"
            return
        properties = precommit_metadata.decode(bytes(rows[epoch])).properties
        end = checks.end_offsets(properties) or {}
        start = checks.start_offsets(properties)
        if start is None:
            start = checks.end_offsets(precommit_metadata.decode(bytes(rows[epoch - 1])).properties) or {}
        self._begin(record)
        cuts = kafka_faults.delete_before(
            self.session.bootstrap, self.topic, start, end, record.plan.params["fraction"]
        )
        self.lost_by_retention = {
            key for (p, o), key in self.positions.items() if p in cuts and start.get(p, 0) <= o < cuts[p]
        }
        self.retention_files = precommit_metadata.decode(bytes(rows[epoch])).paths
        record.detail.update(epoch=epoch, cuts=cuts, deleted=len(self.lost_by_retention))
        record.ended_at = time.time()

    def _after_failure(self) -> None:
        """A failed job: a data-loss failure after retention, or a bad record under `fail`, then the remedy."""
        error = self.board.last_error or ""
        retention = self.records_of.get("retention_before_rerun")
        if retention is not None and retention.triggered and self.fail_on_data_loss:
            if "failOnDataLoss" not in error:
                self.anomalies.append(f"after retention the job failed without the data-loss error: {error[:300]}")
            cause = self._abort_cause(int(retention.detail["epoch"]))
            if cause == "OPERATOR":  # a forced abort gives up the attempt: its files may go at once
                retention.detail["aborted_by"] = cause
            else:
                kept = [path for path in self.retention_files if Path(path.removeprefix("file://")).exists()]
                retention.detail["files_kept"] = f"{len(kept)}/{len(self.retention_files)}"
                if len(kept) != len(self.retention_files):
                    self.anomalies.append("the files of the epoch aborted by recovery were deleted before its re-run")
            self.fail_on_data_loss = False  # the documented remedy: skip what is gone
            return
        recreated = self.records_of.get("topic_recreated")
        if recreated is not None and recreated.triggered and self.fail_on_data_loss:
            if "failOnDataLoss" not in error:
                self.anomalies.append(
                    f"after its topic was deleted the job failed without the data-loss error: {error[:300]}"
                )
            recreated.detail["failed_with"] = error[:200]
            self.fail_on_data_loss = False  # the documented remedy: go on without what is gone
            return
        bad = self.records_of.get("bad_records")
        if bad is not None and self.on_bad_record == "fail" and "does not fit the JSON schema" in error:
            bad.detail["failed_with"] = error[:200]
            positions = {f"partition {p} offset {o}" for p, o in self.bad_positions}
            if not any(position in error for position in positions):
                self.anomalies.append(f"the bad-record failure names no bad record's position: {error[:300]}")
            self.on_bad_record = bad.plan.params["then"]  # the documented remedy: another policy

    def _second_life_positions(self) -> dict[tuple[int, int], int]:
        """The second life's records, at positions apart from the first's (the checks compare keys)."""
        return {(p, SECOND_LIFE_OFFSET + o): key for (p, o), key in self.second_life.items()}

    def _topic_recreated(self, record: FaultRecord) -> None:
        """Delete the topic under the running query, await the data-loss failure and a batch without it, then
        create it again and produce its second life, which the query must read from its start."""
        try:
            with self.lock:
                if self.board.has("done"):
                    return
                self._begin(record)
                read = self._spark_committed_end()  # what the job read for sure before the deletion
                kafka_faults.delete_topic(self.session.bootstrap, self.topic)
            self.lost_with_topic = {key for (p, o), key in self.positions.items() if o >= read.get(p, 0)}
            record.detail.update(unread_when_deleted=len(self.lost_with_topic))
            try:
                epoch = wait_for_change(self.metastore_url, self._batch_without_topic, RUN_SECONDS)
            except TimeoutError:
                self.anomalies.append("no batch ran without the deleted topic (failOnDataLoss=false)")
                return
            with self.lock:
                self.batch_without_topic = epoch
                partitions = int(record.plan.params["partitions"])
                create_topic(self.session.bootstrap, partitions, name=self.topic)
                first_key = self.seed % 1000 * 10_000 + 8000
                keys = range(first_key, first_key + int(record.plan.params["records"]))
                self.second_life = kafka_faults.positions(
                    produce_orders(self.session.bootstrap, self.topic, keys, partitions=partitions)
                )
                self._topic_end()
                record.detail.update(batch_without_topic=epoch, second_life=len(self.second_life))
                record.ended_at = time.time()
        finally:
            self.board.set("recreated")

    def _spark_committed_end(self) -> dict[int, int]:
        """End offsets of the last batch Spark committed (what its sink was handed before now)."""
        commits = self.checkpoint / "commits"
        batches = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.exists() else []
        if not batches:
            return {}
        last_line = (self.checkpoint / "offsets" / str(max(batches))).read_text().strip().splitlines()[-1]
        return checks.partitions_of(json.loads(last_line))

    def _batch_without_topic(self, connection: psycopg.Connection[Any]) -> int | None:
        """A batch planned without the deleted topic, once the coordinator recorded its checkpoint."""
        row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
        checkpointed = -1 if row is None else int(row[0])
        for epoch, metadata in connection.execute(
            "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
            "WHERE s.name = %s AND p.epoch <= %s ORDER BY p.epoch DESC LIMIT 1",
            (SINK, checkpointed),
        ):
            end = checks.end_offsets(precommit_metadata.decode(bytes(metadata)).properties)
            if end == {}:
                return int(epoch)
        return None

    def _abort_cause(self, epoch: int) -> str | None:
        with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
            row = connection.execute(
                "SELECT p.abort_cause::text FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
                "WHERE s.name = %s AND p.epoch = %s",
                (SINK, epoch),
            ).fetchone()
        return None if row is None else row[0]

    def _outage_then_idle(self, record: FaultRecord) -> None:
        """Kill the coordinator as the last batch is pre-committed; restart it after the writer's retries."""
        try:
            epoch = wait_for_change(self.metastore_url, self._at_last_batch, RUN_SECONDS)
        except TimeoutError:
            return
        with self.lock:
            if self.board.has("done"):
                return
            victim = self.coordinators[0]
            with psycopg.connect(libpq_url(self.metastore_url), autocommit=True) as connection:
                row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
            self._begin(record)
            self.board.set("up", False)
            victim.kill()
            record.detail.update(epoch=epoch, report_pending=row is not None and int(row[0]) < epoch)
            self.restart_if_current(victim, record.plan.params["downtime_seconds"])
            record.ended_at = time.time()
            self.board.set("up")

    def _stop_when_recorded(self) -> None:
        """Idle runs: stop the query once the coordinator recorded Spark's last batch, which read the whole topic.

        The query stays up, idle, until then: a checkpoint report that failed while the
        coordinator was away must land by itself (nothing else would send it).
        """

        def recorded(connection: psycopg.Connection[Any]) -> bool | None:
            if self.load is not None and not self.board.has("produced"):
                return None
            if "topic_recreated" in self.records_of and not self.board.has("recreated"):
                return None
            commits = self.checkpoint / "commits"
            spark_last = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1)
            if spark_last < 0 or self._at_last_batch(connection) != spark_last:
                return None
            row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
            return True if row is not None and int(row[0]) >= spark_last else None

        started = time.monotonic()
        while not self.board.has("done"):
            if (self.checkpoint / "commits").exists():
                with contextlib.suppress(TimeoutError):  # looked at again after every change, at least every 10 s
                    wait_for_change(self.metastore_url, recorded, 10)
                    driver = self.driver
                    if driver is not None:
                        driver.stop_query()
                    self.board.wait(lambda: self.board.has("done"), 30, unless=None)
                    continue
            else:  # no batch checkpointed yet: await the next pre-commit
                if self.board.wait(functools.partial(self.board.precommits.__lt__, self.board.precommits), 10):
                    continue
            if time.monotonic() - started > RUN_SECONDS:
                self.anomalies.append("idle query: the coordinator never recorded Spark's last batch")
                return


def _render(url: str) -> str:
    return normalize_url(url).render_as_string(hide_password=False)


def replay_command(seed: int, pool: tuple[str, ...], faults_per_run: int | None = None) -> str:
    faults = "" if set(pool) == set(FAULTS) else f" --faults {','.join(pool)}"
    faults += "" if faults_per_run is None else f" --faults-per-run {faults_per_run}"
    return f"python -m tests.torture --seed {seed}{faults}"


__all__ = ["FAULTS", "FaultPlan", "Run", "RunResult", "Session", "replay_command"]
