"""Torture kind schema_churn (issue 24): a producer registers new Avro versions of the value's subject while the job
streams, the job's driver is killed and run again in between, and every record of the table is checked against what
its writer schema says.

The run's seed draws the versions and the records. Before the job first starts, version 1 writes `qty` as an int and
`amount` as a float, and version 2 widens them (long, double): the table takes the newest version's types at the
first start, so the records of version 1, written before and after version 2, are read widened. Then each new version
adds a field (of a type drawn from those the writer decodes, under a name never used before: a column never changes
its type) or drops one, and producers keep writing with older versions too. The driver is `sink-writer` in a process
group of its own, as in production:

1. a first run is killed (SIGKILL to its group) right after the pre-commit of a drawn epoch, while a new version is
   registered behind it; another is registered while it is down;
2. a second run on the same checkpoint (it reads the subject's newest version at start) streams while the last
   versions come, and is stopped by a SIGTERM to its group between two batches (exit code 143);
3. a third drains the topic (--available-now, exit code 0).

Checked: each produced record is in the table once (by its Kafka position), its row holds what its writer schema
says (each of its fields' values as written, widened to the column's type; null in every other column), and the
table has a column for every field of every version, of the widest type.

    python -m tests.torture.schema_churn --runs N [--seed S]   # one seeded run: tests/torture/test_torture_short.py
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import random
import signal
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog import Catalog, load_catalog

from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.kafka_broker import create_topic, produce_records
from tests.fixtures.schema_registry import SchemaRegistryServer
from tests.fixtures.sink_writer_process import WriterProcess, killable_driver_command, sink_writer_command
from tests.fixtures.verification import verify_sink

PARTITIONS: Final = 2
PER_BATCH: Final = 40  # --max-offsets-per-trigger
CHUNK: Final = (40, 90)  # records produced at each step, drawn between
SPARK_SECONDS: Final = 300.0  # a driver's start (a JVM) and its batches on a loaded machine
LATE_PRODUCER: Final = 0.3  # the share of a step's records written with an older version than the newest
KAFKA_COLUMNS: Final = frozenset({"kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp"})
EPOCH: Final = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
TEXT: Final = "az é€😀 \t\"'\\"
SHOWN: Final = 20  # anomalies of one kind listed at most

Draw = Callable[[random.Random], Any]


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


# kind -> (Avro type, how a value is drawn, what the table holds for it)
KINDS: Final[dict[str, tuple[Any, Draw, Callable[[Any], Any]]]] = {
    "int": ("int", lambda rng: rng.randrange(-(2**31), 2**31), int),
    "long": ("long", lambda rng: rng.randrange(-(2**63), 2**63), int),
    "float": ("float", lambda rng: rng.uniform(-1e6, 1e6), _float32),
    "double": ("double", lambda rng: rng.uniform(-1e12, 1e12), float),
    "string": ("string", lambda rng: "".join(rng.choice(TEXT) for _ in range(rng.randrange(9))), str),
    "boolean": ("boolean", lambda rng: rng.random() < 0.5, bool),
    "optional string": (
        ["null", "string"],
        lambda rng: None if rng.random() < 0.3 else f"s{rng.randrange(10**6)}",
        str,
    ),
    "timestamp": (
        {"type": "long", "logicalType": "timestamp-micros"},
        lambda rng: EPOCH + dt.timedelta(microseconds=rng.randrange(2**50)),
        lambda value: value,
    ),
}
ADDED_KINDS: Final = ("long", "double", "string", "boolean", "optional string", "timestamp")


@dataclass(frozen=True)
class Field:
    name: str
    kind: str

    def avro(self) -> dict[str, Any]:
        avro_type = KINDS[self.kind][0]
        return {
            "name": self.name,
            "type": avro_type,
            **({"default": None} if isinstance(avro_type, list) and avro_type[0] == "null" else {}),
        }


Version = tuple[Field, ...]


def plan_versions(rng: random.Random) -> list[Version]:
    """Version 1 (narrow qty and amount), version 2 (widened), then 3 to 5 versions that each add or drop a field."""
    order_id, note = Field("order_id", "long"), Field("note", "string")
    versions: list[Version] = [
        (order_id, Field("qty", "int"), Field("amount", "float"), note),
        (order_id, Field("qty", "long"), Field("amount", "double"), note),
    ]
    names = itertools.count(1)
    for _ in range(rng.randint(3, 5)):
        fields = list(versions[-1])
        droppable = [field for field in fields if field is not order_id]
        if len(droppable) > 2 and rng.random() < 0.35:
            fields.remove(rng.choice(droppable))
        else:
            fields.insert(rng.randrange(1, len(fields) + 1), Field(f"f{next(names)}", rng.choice(ADDED_KINDS)))
        versions.append(tuple(fields))
    return versions


def avro_schema(version: Version) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "churn", "fields": [f.avro() for f in version]})


@dataclass
class Produced:
    """A record: the version it was written with, and what its row must hold."""

    version: int
    expected: dict[str, Any]


@dataclass
class Producer:
    """Writes records with any version registered so far; a version is registered at its first record."""

    rng: random.Random
    bootstrap: str
    topic: str
    registry_url: str
    versions: list[Version]
    registered: int = 0
    records: dict[tuple[int, int], Produced] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _serializers: dict[int, AvroSerializer] = field(default_factory=dict)

    def step(self, *, new_version: bool = True) -> None:
        """Write a chunk with the newest version (registered at its first record when `new_version`), some of it
        (late producers) with older ones."""
        if new_version:
            self.registered += 1
        newest = self.registered - 1
        count = self.rng.randint(*CHUNK)
        chosen = [newest] + [
            self.rng.randrange(newest) if newest and self.rng.random() < LATE_PRODUCER else newest
            for _ in range(count - 1)
        ]
        self._write(chosen)

    def _write(self, versions: list[int]) -> None:
        client = registry_client(RegistrySettings.of(self.registry_url))
        context = SerializationContext(self.topic, MessageField.VALUE)
        batch, written = [], {}
        for index in versions:
            serialize = self._serializers.setdefault(
                index, AvroSerializer(client, avro_schema(self.versions[index]), conf={"auto.register.schemas": True})
            )
            order_id = next(self._ids)
            values = {f.name: KINDS[f.kind][1](self.rng) for f in self.versions[index]}
            values["order_id"] = order_id
            expected = {
                f.name: None if values[f.name] is None else KINDS[f.kind][2](values[f.name])
                for f in self.versions[index]
            }
            key = str(order_id).encode()
            written[key] = Produced(index, expected)
            batch.append((self.rng.randrange(PARTITIONS), key, serialize(values, context)))
        for landed in produce_records(self.bootstrap, self.topic, batch):
            self.records[(landed.partition, landed.offset)] = written[landed.key]


@dataclass(frozen=True)
class Services:
    bootstrap: str
    registry_url: str
    coordinator: str  # its gRPC address
    catalog: Catalog  # the coordinator's
    metastore_url: str  # the coordinator's (the verifier reads its log)


@dataclass
class ChurnRun:
    seed: int
    services: Services
    work: Path
    topic: str = ""
    anomalies: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    exits: list[int] = field(default_factory=list)

    @property
    def table(self) -> str:
        return f"shop.churn_{self.seed}"

    def flags(self, run: int) -> list[str]:
        return [
            "--bootstrap-servers", self.services.bootstrap,
            "--topic", self.topic,
            "--format", "avro",
            "--schema-registry-url", self.services.registry_url,
            "--kafka-metadata",
            "--max-offsets-per-trigger", str(PER_BATCH),
            "--sink", f"churn-{self.seed}",
            "--table", self.table,
            "--coordinator", self.services.coordinator,
            "--checkpoint-location", str(self.work / "checkpoint"),
            "--spark-log-file", str(self.work / f"spark-{run}.log"),
            "--master", "local[2]",
        ]  # fmt: skip

    def execute(self) -> dict[str, Any]:
        started = time.monotonic()
        rng = random.Random(self.seed)
        versions = plan_versions(rng)
        self.work.mkdir(parents=True, exist_ok=True)
        self.topic = create_topic(self.services.bootstrap, PARTITIONS, prefix=f"churn-{self.seed}")
        producer = Producer(rng, self.services.bootstrap, self.topic, self.services.registry_url, versions)
        kill_epoch = rng.randint(1, 2)
        self.facts.update(versions=len(versions), kill_epoch=kill_epoch)
        try:
            self._stream(producer, kill_epoch)
            self._check(producer)
        except Exception as error:  # a step that fails is an anomaly of the run, with its seed and where it failed
            where = traceback.extract_tb(error.__traceback__)[-3:]
            self.anomalies.append(
                f"{type(error).__name__}: {error} (at {'; '.join(f'{f.name}:{f.lineno}' for f in where)})"
            )
        self.facts.update(records=len(producer.records), exits=self.exits, seconds=round(time.monotonic() - started, 1))
        return {
            "kind": "schema_churn",
            "seed": self.seed,
            "facts": self.facts,
            "anomalies": self.anomalies,
            "replay": f"python -m tests.torture.schema_churn --runs 1 --seed {self.seed}",
        }

    def _stream(self, producer: Producer, kill_epoch: int) -> None:
        producer.step()  # version 1
        producer.step()  # version 2, widening; version 1 keeps writing
        producer.step(new_version=False)  # more of both: batches enough for the kill epoch
        killed = self._start(1, killable_driver_command("after-precommit", kill_epoch))
        killed.wait_for_count("batch pre-committed", 1, SPARK_SECONDS)
        producer.step()  # behind the running job
        self._expect(1, killed, -signal.SIGKILL, f"the first run, to be killed after pre-committing epoch {kill_epoch}")
        producer.step()  # while it is down
        running = self._start(2, sink_writer_command())
        batches = 1
        while producer.registered < len(producer.versions):
            running.wait_for_count("batch pre-committed", batches, SPARK_SECONDS)
            producer.step()
            batches += 1
        running.wait_for_count("batch pre-committed", batches, SPARK_SECONDS)
        running.signal_group(signal.SIGTERM)
        self._expect(2, running, 128 + signal.SIGTERM, "the second run, stopped by SIGTERM to its group")
        draining = self._start(3, sink_writer_command(), "--available-now")
        self._expect(3, draining, 0, "the third run, draining the topic")

    def _start(self, run: int, command: list[str], *extra: str) -> WriterProcess:
        return WriterProcess(command, [*self.flags(run), *extra])

    def _expect(self, run: int, process: WriterProcess, exit_code: int, what: str) -> None:
        """The run's end: its exit code, its output kept beside its Spark log."""
        finished = process.finish(SPARK_SECONDS)
        (self.work / f"driver-{run}.log").write_text("\n".join(finished.lines))
        self.exits.append(finished.exit_code)
        if finished.exit_code != exit_code:
            raise AssertionError(
                f"{what} ended with {finished.exit_code}, not {exit_code}: "
                f"{finished.lines[-1] if finished.lines else '(no output)'}"
            )

    def _check(self, producer: Producer) -> None:
        table = self.services.catalog.load_table(self.table)
        columns = set(table.schema().column_names)
        fields = {f.name: f for version in producer.versions for f in version}
        if columns != set(fields) | KAFKA_COLUMNS:
            self.anomalies.append(f"table columns {sorted(columns)}, not the versions' {sorted(fields)} + kafka_*")
        widened = {name: str(table.schema().find_field(name).field_type) for name in ("qty", "amount")}
        if widened != {"qty": "long", "amount": "double"}:
            self.anomalies.append(f"the narrow fields of version 1 are {widened} in the table, not long and double")
        rows = table.scan().to_arrow().to_pylist()
        seen = Counter((row["kafka_partition"], row["kafka_offset"]) for row in rows)
        duplicates = sorted(position for position, count in seen.items() if count > 1)
        missing = sorted(set(producer.records) - set(seen))
        unexpected = sorted(set(seen) - set(producer.records))
        for name, positions in (("duplicated", duplicates), ("missing", missing), ("never produced", unexpected)):
            if positions:
                self.anomalies.append(f"{len(positions)} record(s) {name}: {positions[:SHOWN]}")
        wrong = []
        for row in rows:
            produced = producer.records.get((row["kafka_partition"], row["kafka_offset"]))
            if produced is None:
                continue
            differing = {
                name: (row.get(name), produced.expected.get(name))
                for name in fields
                if row.get(name) != produced.expected.get(name)
            }
            if differing:
                wrong.append(
                    f"offset {row['kafka_partition']}/{row['kafka_offset']} (v{produced.version + 1}): {differing}"
                )
        if wrong:
            self.anomalies.append(f"{len(wrong)} row(s) not what their writer schema says: " + "; ".join(wrong[:SHOWN]))
        self.facts.update(rows=len(rows), columns=len(columns))
        # The verifier, deep and against the topic, agrees with the checks above.
        verification = verify_sink(
            self.services.metastore_url, self.services.catalog, f"churn-{self.seed}", self.services.bootstrap
        )
        self.facts.update(
            verifier_faults=len(verification.faults), verifier_missed=int(bool(self.anomalies) and verification.ok)
        )
        if verification.faults and not self.anomalies:
            self.anomalies.append(
                "the verifier disagrees with the run's exactly-once checks, which found nothing: "
                + "; ".join(str(fault) for fault in verification.faults[:5])
            )


@contextlib.contextmanager
def services(work: Path) -> Iterator[Services]:
    """A broker, a schema registry, PostgreSQL and a coordinator of the runs' own (python -m)."""
    from tests.torture.session import Session  # the torture runs' broker and PostgreSQL servers

    registry = SchemaRegistryServer()
    with Session.open(work / "session") as session:
        url = session.metastore.create_database("schema_churn")
        migrate(normalize_url(url))
        coordinator = CoordinatorProcess(database_url=url, data_dir=work / "coordinator").start()
        warehouse = work / "coordinator" / "warehouse"
        try:
            catalog = load_catalog("default", type="sql", uri=url, warehouse=warehouse.as_uri())
            yield Services(session.bootstrap, registry.url, coordinator.target, catalog, url)
        finally:
            coordinator.stop()
            registry.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture.schema_churn", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=None, help="seed of the first run (default: random)")
    parser.add_argument("--work-dir", type=Path, default=Path("schema-churn"), help="the runs' files")
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    anomalies = 0
    with services(args.work_dir) as shared:
        for seed in range(first, first + args.runs):
            result = ChurnRun(seed, shared, args.work_dir / f"run-{seed}").execute()
            print(json.dumps(result, default=str), flush=True)
            anomalies += len(result["anomalies"])
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
