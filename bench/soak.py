"""Part 7, soak: a table that takes a commit every second for months, compressed into one run. Part 12: the
same loop at the coordinator's default settings, a commit per epoch.

`commits` commits of one small file each go through the coordinator (PreCommit, then CommitCheckpoint(wait)
timed until COMMITTED) with its table maintenance on and scheduled tightly, beside raw pyiceberg fast
appends to a second table with no maintenance, interleaved with the first `raw_commits` of them (a raw
append's cost grows with every snapshot: a raw run as long as ours would take hours). Reported for both: the
commit p50 over the first and the last 10 % of their commits, and at the end metadata.json's size, the
manifests of the current snapshot, the live data files and the snapshots. Then the time to scan the final
table against an uncompacted twin: the same rows in the original small files (hard links kept aside before
maintenance deleted them), fast-appended to a third table in one commit.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import grpc
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file

from bench.commit import raw_append
from bench.infra import (
    ORDERS,
    Coordinator,
    Postgres,
    latency_stats,
    register_orders_sink,
    timed_epoch,
    write_orders_file,
)
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.tables.iceberg import IcebergGateway

ROWS_PER_FILE = 10
# Tight maintenance, so that a compressed run sees what months of commits would: a run every few seconds,
# at most 100 snapshots, compaction of 5 small files and up.
MAINTENANCE = {
    "SINK_COORDINATOR_MAINTENANCE_ENABLED": "true",
    "SINK_COORDINATOR_MAINTENANCE_INTERVAL_SECONDS": "5",
    "SINK_COORDINATOR_SNAPSHOT_MAX_COUNT": "100",
    "SINK_COORDINATOR_SNAPSHOT_MAX_AGE_SECONDS": "3600",
    "SINK_COORDINATOR_COMPACTION_TARGET_FILE_BYTES": str(1024 * 1024),
    "SINK_COORDINATOR_COMPACTION_MIN_FILES": "5",
    "SINK_COORDINATOR_MANIFEST_MERGE_MIN_COUNT": "16",
    "SINK_COORDINATOR_POLL_INTERVAL_SECONDS": "1",
}


# Part 12: the coordinator's defaults (maintenance on its 300 s clock, at most 500 snapshots, compaction from 5 small
# files) with every epoch committed on its own, as fast as the loop goes: only the commits' own maintenance triggers
# can keep the table within its bounds.
AT_DEFAULTS = {"SINK_COORDINATOR_MAINTENANCE_ENABLED": "true", "SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS": "0"}
WINDOW = 250


def table_shape(table: Any) -> dict[str, Any]:
    snapshot = table.current_snapshot()
    return {
        "metadata_json_bytes": os.path.getsize(table.metadata_location.removeprefix("file://")),
        "snapshots": len(table.snapshots()),
        "manifests": 0 if snapshot is None else len(snapshot.manifests(table.io)),
        "data_files": len(table.inspect.data_files()),
        "rows": table.scan().count(),
    }


def scan_seconds(table: Any, repetitions: int = 3) -> float:
    """Median seconds of a full scan to Arrow (planning included)."""
    timings = []
    for _ in range(repetitions):
        started = time.monotonic()
        table.scan().to_arrow()
        timings.append(time.monotonic() - started)
    return statistics.median(timings)


def _tenths(seconds: list[float]) -> dict[str, Any]:
    tenth = max(1, len(seconds) // 10)
    first, last = latency_stats(seconds[:tenth]), latency_stats(seconds[-tenth:])
    return {
        "commits": len(seconds),
        "first_tenth": first,
        "last_tenth": last,
        "ratio": last["p50_ms"] / first["p50_ms"],
    }


async def run(postgres: Postgres, root: Path, *, commits: int, raw_commits: int) -> dict[str, Any]:
    database_url = postgres.new_database("soak")
    coordinator = Coordinator(database_url, root / "soak", env=MAINTENANCE).start()
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=coordinator.warehouse.as_uri())
    twin_dir = root / "soak-twin-files"
    twin_dir.mkdir(parents=True)
    twin_files: list[str] = []
    coordinated: list[float] = []
    raw: list[float] = []
    started = time.monotonic()
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            registration = await register_orders_sink(stub, "soak", "bench.soak")
            term = registration.writer_term
            raw_location = IcebergGateway(catalog).ensure_table("bench.soak_raw", ORDERS, ())
            for epoch in range(commits):
                path = write_orders_file(registration.table_location, ROWS_PER_FILE, first=epoch * ROWS_PER_FILE)
                twin = twin_dir / f"{epoch}.parquet"
                os.link(path.removeprefix("file://"), twin)
                twin_files.append(twin.as_uri())
                _, commit_seconds = await timed_epoch(stub, "soak", term, epoch, [pb.DataFile(path=path)], 120)
                coordinated.append(commit_seconds)
                if epoch < raw_commits:
                    raw_path = write_orders_file(raw_location, ROWS_PER_FILE, first=epoch * ROWS_PER_FILE)
                    raw.append(await asyncio.to_thread(raw_append, catalog, "bench.soak_raw", raw_path))
        soak_seconds = time.monotonic() - started
    finally:
        coordinator.stop()
    table = catalog.load_table("bench.soak")
    twin_location = IcebergGateway(catalog).ensure_table("bench.soak_twin", ORDERS, ())
    twin_table = catalog.load_table("bench.soak_twin")
    with twin_table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
        for uri in twin_files:
            append.append_data_file(parquet_file_to_data_file(twin_table.io, twin_table.metadata, uri))
    twin_table = catalog.load_table("bench.soak_twin")
    ours_scan, twin_scan = scan_seconds(table), scan_seconds(twin_table)
    return {
        "commits": commits,
        "raw_commits": raw_commits,
        "rows_per_file": ROWS_PER_FILE,
        "wall_seconds": soak_seconds,
        "maintenance": MAINTENANCE,
        "coordinator": _tenths(coordinated),
        "raw": _tenths(raw),
        "table": table_shape(table),
        "raw_table": table_shape(catalog.load_table("bench.soak_raw")),
        "twin_table": {**table_shape(twin_table), "location": twin_location},
        "scan_seconds": {"maintained": ours_scan, "uncompacted_twin": twin_scan, "ratio": ours_scan / twin_scan},
    }


async def run_at_defaults(postgres: Postgres, root: Path, *, commits: int) -> dict[str, Any]:
    """`commits` commits of one small file at the default settings: per window of WINDOW commits, the commit p50
    and the table's live snapshots, manifests and data files at its end."""
    database_url = postgres.new_database("soak_defaults")
    coordinator = Coordinator(database_url, root / "soak-defaults", env=AT_DEFAULTS).start()
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=coordinator.warehouse.as_uri())
    windows: list[dict[str, Any]] = []
    seconds: list[float] = []
    started = time.monotonic()
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            registration = await register_orders_sink(stub, "soak", "bench.soak_defaults")
            term = registration.writer_term
            for epoch in range(commits):
                path = write_orders_file(registration.table_location, ROWS_PER_FILE, first=epoch * ROWS_PER_FILE)
                _, commit_seconds = await timed_epoch(stub, "soak", term, epoch, [pb.DataFile(path=path)], 120)
                seconds.append(commit_seconds)
                if (epoch + 1) % WINDOW == 0:
                    shape = await asyncio.to_thread(table_shape, catalog.load_table("bench.soak_defaults"))
                    windows.append({"commits": epoch + 1, **latency_stats(seconds[-WINDOW:]), **shape})
        soak_seconds = time.monotonic() - started
    finally:
        coordinator.stop()
    return {
        "commits": commits,
        "rows_per_file": ROWS_PER_FILE,
        "wall_seconds": soak_seconds,
        "settings": AT_DEFAULTS,
        "windows": windows,
        "max_snapshots": max(window["snapshots"] for window in windows),
        "p50_last_over_first_window": windows[-1]["p50_ms"] / windows[0]["p50_ms"],
    }
