"""Part 2, the commit path: CommitCheckpoint(wait=True) until COMMITTED, against a raw pyiceberg fast append.

Each iteration pre-commits one epoch of one small Parquet file, then times CommitCheckpoint(epoch, wait=True)
(the checkpoint record, the committer's marker walk, the append with the marker, the COMMITTED update and
the answer). The raw side, interleaved with it, times what a plain writer does for the same kind of file on
the same catalog: load the table, fast-append a DataFile built from the footer beforehand, commit.

Coalescing: a coordinator with COMMIT_INTERVAL_SECONDS and COMMIT_MAX_EPOCHS is offered epochs at rising
rates (pre-commit, then CommitCheckpoint without waiting); the table shows snapshots per second staying
bounded while epochs per second grow.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file

from bench.infra import (
    ORDERS,
    Coordinator,
    Postgres,
    latency_stats,
    linked_copy,
    py_spy,
    register_orders_sink,
    timed_epoch,
    write_orders_file,
)
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.tables.iceberg import IcebergGateway


def _catalog(database_url: str, warehouse: Path) -> Any:
    warehouse.mkdir(parents=True, exist_ok=True)
    return load_catalog("default", type="sql", uri=database_url, warehouse=warehouse.as_uri())


def raw_append(catalog: Any, identifier: str, path: str) -> float:
    """Seconds of a plain writer's commit of one file: load the table, fast-append, commit (footer read before)."""
    table = catalog.load_table(identifier)
    data_file = parquet_file_to_data_file(table.io, table.metadata, path)
    started = time.monotonic()
    table = catalog.load_table(identifier)
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return time.monotonic() - started


async def commit_latency(
    postgres: Postgres, root: Path, *, commits: int, profile: Path | None, rows: int = 100
) -> dict[str, Any]:
    database_url = postgres.new_database("commit")
    coordinator = Coordinator(database_url, root / "commit").start()
    catalog = _catalog(database_url, coordinator.warehouse)
    coordinated: list[float] = []
    raw: list[float] = []
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            registration = await register_orders_sink(stub, "commit", "bench.commit")
            raw_location = IcebergGateway(catalog).ensure_table("bench.raw_commit", ORDERS, ())
            with py_spy(coordinator.pid, profile or Path("unused"), profile is not None):
                for epoch in range(commits):
                    path = write_orders_file(registration.table_location, rows, first=epoch * rows)
                    files = [pb.DataFile(path=path)]
                    _, seconds = await timed_epoch(stub, "commit", registration.writer_term, epoch, files, 60)
                    coordinated.append(seconds)
                    raw_path = write_orders_file(raw_location, rows, first=epoch * rows)
                    raw.append(await asyncio.to_thread(raw_append, catalog, "bench.raw_commit", raw_path))
    finally:
        coordinator.stop()
    tenth = max(1, commits // 10)
    result: dict[str, Any] = {
        "commits": commits,
        "coordinator": latency_stats(coordinated),
        "raw": latency_stats(raw),
        # How the cost grows with the table's history (metadata and snapshot list grow with each commit).
        "coordinator_first_tenth": latency_stats(coordinated[:tenth]),
        "coordinator_last_tenth": latency_stats(coordinated[-tenth:]),
        "raw_first_tenth": latency_stats(raw[:tenth]),
        "raw_last_tenth": latency_stats(raw[-tenth:]),
    }
    result["ratio_p50"] = result["coordinator"]["p50_ms"] / result["raw"]["p50_ms"]
    return result


async def coalescing(
    postgres: Postgres,
    root: Path,
    *,
    interval_seconds: float,
    max_epochs: int,
    offered_rates: tuple[float, ...],
    window_seconds: float,
) -> dict[str, Any]:
    """Epochs per second offered vs snapshots per second written, with commit coalescing on."""
    database_url = postgres.new_database("coalesce")
    coordinator = Coordinator(
        database_url,
        root / "coalesce",
        env={
            "SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS": str(interval_seconds),
            "SINK_COORDINATOR_COMMIT_MAX_EPOCHS": str(max_epochs),
        },
    ).start()
    catalog = _catalog(database_url, coordinator.warehouse)
    rows_out: list[dict[str, Any]] = []
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            registration = await register_orders_sink(stub, "coalesce", "bench.coalesce")
            term = registration.writer_term
            files = [write_orders_file(registration.table_location, 10, first=i * 10) for i in range(16)]
            epoch = 0
            for rate in offered_rates:
                first_epoch = epoch
                started = time.monotonic()
                deadline = started + window_seconds
                while time.monotonic() < deadline:
                    due = started + (epoch - first_epoch) / rate
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                    await stub.PreCommit(
                        pb.PreCommitRequest(
                            sink="coalesce",
                            epoch=epoch,
                            writer_term=term,
                            data_files=[pb.DataFile(path=linked_copy(files[epoch % 16]))],
                        )
                    )
                    await stub.CommitCheckpoint(
                        pb.CommitCheckpointRequest(sink="coalesce", epoch=epoch, writer_term=term)
                    )
                    epoch += 1
                offered_seconds = time.monotonic() - started
                # Drain: the last checkpoint, waited for.
                await stub.CommitCheckpoint(
                    pb.CommitCheckpointRequest(sink="coalesce", epoch=epoch - 1, writer_term=term, wait=True),
                    timeout=60,
                )
                drained = time.monotonic() - started
                table = catalog.load_table("bench.coalesce")
                snapshots = [
                    s
                    for s in table.snapshots()
                    if snapshot_properties(s).get(MARKER_SINK) == "coalesce"
                    and first_epoch <= int(snapshot_properties(s)[MARKER_EPOCH]) < epoch
                ]
                epochs = epoch - first_epoch
                rows_out.append(
                    {
                        "offered_epochs_per_s": epochs / offered_seconds,
                        "snapshots": len(snapshots),
                        "epochs": epochs,
                        "snapshots_per_s": len(snapshots) / drained,
                        "epochs_per_snapshot": epochs / max(1, len(snapshots)),
                    }
                )
    finally:
        coordinator.stop()
    return {"interval_seconds": interval_seconds, "max_epochs": max_epochs, "rows": rows_out}
