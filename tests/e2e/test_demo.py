"""`make demo` as a newcomer runs it (issues 26.8, 26.11): exactly once, the lines that read its table (which read
it), and no broker data left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka.admin import AdminClient

from sink_coordinator_demo.console_output import while_serving
from sink_coordinator_demo.ports import free_port
from tests.fixtures.duckdb_reader import duckdb_rows

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def verified(said: str, data_dir: Path) -> dict[str, Any]:
    """The verifier's answer (`sink-coordinator verify --json`) on the sink whose table the demo said, from its data
    dir once it ended (its broker went with it: no check against Kafka); it must find no fault."""
    [table] = re.findall(r"catalog\.load_table\('demo\.(\w+)'\)", said)
    named = re.fullmatch(r"(.+)_(\d{8}_\d{6})", table)  # demo.<kind>_<run>, the sink demo-<kind>-<run>
    assert named is not None, table
    kind, run = named.groups()
    sink = f"demo-{kind.replace('_', '-')}-{run}"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", "verify", sink, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    answer: dict[str, Any] = json.loads(result.stdout)
    assert answer["ok"] and answer["sink"] == sink, answer
    return answer


def test_the_demo_says_how_to_read_its_table_and_leaves_no_broker_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "sink_coordinator_demo", "--events", "300", "--partitions", "1", "--data-dir", data_dir],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "exactly once? yes" in result.stdout
    # Nothing failed on the way (the progress bar's listener once failed on every query's first batch).
    assert "Traceback" not in result.stdout + result.stderr, result.stdout[-3000:] + result.stderr[-3000:]
    said = result.stdout
    # What the newcomer pastes: DuckDB reads the table from its metadata file (pyiceberg's lines need the
    # coordinator's PostgreSQL, which stopped with the demo).
    assert "from pyiceberg.catalog import load_catalog" in said
    [table] = re.findall(r"catalog\.load_table\('(demo\.orders_\d{8}_\d{6})'\)", said)
    [metadata] = re.findall(r"iceberg_scan\('([^']+)'\)", said)
    assert len(duckdb_rows(metadata, "order_id")) == 300
    assert f"sink-coordinator catalog {table} --data-dir {data_dir}" in said
    assert "its data deleted, when the demo ends" in said
    assert not (data_dir / "kafka").exists()  # the demo's broker data: 1.4 GB after a few runs, before
    assert (data_dir / "kafka.log").exists()
    # The demo's own check ("exactly once? yes") and the verifier's agree; its table has no Kafka positions: shallow.
    assert [each["deep"] for each in verified(said, data_dir)["tables"]] == [False]


def test_the_cdc_demo_mirrors_the_orders_change_stream_and_checks_it_against_the_model(tmp_path: Path) -> None:
    """`make demo DEMO_ARGS=--cdc` (issue 29.6): Debezium's changes of orders whose status moves through its life;
    the keyed table holds each existing order once at its last change, as the demo's check and DuckDB read it."""
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "sink_coordinator_demo", "--cdc", "--events", "2000", "--partitions", "2",
         "--data-dir", data_dir],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = result.stdout
    assert "the table mirrors the orders? yes" in said

    def shown(label: str) -> int:
        [value] = re.findall(rf"│ {re.escape(label)}\s+│\s+([\d,]+) │", said)
        return int(value.replace(",", ""))

    existing = shown("orders that exist (the model: each order's last change)")
    assert shown("rows in the Iceberg table") == existing > 0
    for difference in (
        "duplicates (orders in more than one row)",
        "missing (existing orders not in the table)",
        "deleted orders still in the table",
        "rows not at their order's last change",
    ):
        assert shown(difference) == 0, difference
    statuses = ("created", "paid", "shipped", "delivered", "cancelled")
    assert sum(shown(f"orders {status}") for status in statuses) == existing
    assert all(shown(f"orders {status}") > 0 for status in statuses)
    [metadata] = re.findall(r"iceberg_scan\('([^']+)'\)", said)
    rows = duckdb_rows(metadata, "order_id", "order_id, status")
    assert len(rows) == existing == len({order_id for order_id, _ in rows})
    assert sorted(Counter(status for _, status in rows).items()) == sorted(
        (status, shown(f"orders {status}")) for status in statuses
    )
    # The demo's own check (the table mirrors the model) and the verifier's agree; the keyed table's keys: deep.
    assert [each["deep"] for each in verified(said, data_dir)["tables"]] == [True]


def test_the_s3_demo_does_not_send_you_to_make_serve() -> None:
    """Issue 26.12: `make serve` has another data dir, and the emulator holding the table goes with the demo."""
    assert "make serve" not in while_serving(keep_serving=False, s3=True)
    assert "--keep-serving" in while_serving(keep_serving=False, s3=True)
    assert "make serve" in while_serving(keep_serving=False, s3=False)
    assert while_serving(keep_serving=True, s3=True) == ""


def test_a_broker_for_your_own_topics_starts_says_where_and_stops(tmp_path: Path) -> None:
    """Issue 26.8: only the demo's code knew how to start noida-db."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = subprocess.run(
            [sys.executable, "-m", "sink_coordinator_demo", "broker", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
            env=env,
        )
    # Refused before anything started: no broker was given a data directory.
    assert not (tmp_path / ".sink-coordinator").exists()
    assert busy.returncode == 1
    assert busy.stdout.strip().splitlines() == [
        f"cannot start the broker: port {port} is in use: choose another with --port"
    ]

    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "sink_coordinator_demo", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert broker.stdout is not None
        said = broker.stdout.readline()
        assert said.startswith(f"Kafka-protocol broker on 127.0.0.1:{port} (topics in .sink-coordinator/broker")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        assert admin.list_topics(timeout=10).brokers
    finally:
        broker.send_signal(signal.SIGINT)
        out, _ = broker.communicate(timeout=60)
    assert broker.returncode == 0, out
    assert "broker stopped" in out
    assert (tmp_path / ".sink-coordinator" / "broker").is_dir()  # your topics stay


def processes_of(data_dir: Path) -> list[str]:
    """The command lines of the processes that name `data_dir` (its PostgreSQL, broker, coordinator, Spark's JVM)."""
    lines = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if str(data_dir) in line and process.pid != os.getpid():
            lines.append(line)
    return lines


def test_a_demo_interrupted_while_spark_starts_stops_everything_it_started(tmp_path: Path) -> None:
    """Spark starts in the background from the demo's first step (sink_coordinator_demo.spark_start): Ctrl-C while
    the coordinator starts, before the demo waits for Spark, stops the JVM it started with the services."""
    data_dir = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "sink_coordinator_demo", "--events", "300", "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    try:
        # Spark's JVM: its command line names the demo's Spark log.
        deadline = time.monotonic() + 120
        while not any("sink_writer.spark_log_file" in line for line in processes_of(data_dir)):
            assert demo.poll() is None and time.monotonic() < deadline, "no JVM started"
            time.sleep(0.05)
    finally:
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=120)
    assert demo.returncode == 130, out[-3000:]
    assert "interrupted: stopping" in out
    assert "stream into Iceberg" not in out  # it was interrupted before it streamed
    assert processes_of(data_dir) == []
