"""Part 5, scale: how the pre-commit and commit figures grow with files per epoch and with the log's size."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from bench.infra import Coordinator, Postgres, latency_stats, register_orders_sink, write_orders_file
from bench.precommit import drive_precommits, register_sinks
from coordinator_service.rpc import sink_coordinator_pb2 as pb
from coordinator_service.rpc import sink_coordinator_pb2_grpc as pb_grpc


async def files_per_epoch(
    postgres: Postgres, root: Path, *, file_counts: tuple[int, ...], epochs: int
) -> list[dict[str, Any]]:
    """Pre-commit latency and CommitCheckpoint(wait) latency of epochs of 1, 10, 100 small files."""
    database_url = postgres.new_database("files")
    coordinator = Coordinator(database_url, root / "files").start()
    rows: list[dict[str, Any]] = []
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            registration = await register_orders_sink(stub, "files", "bench.files")
            term = registration.writer_term
            epoch = 0
            for count in file_counts:
                precommits: list[float] = []
                commits: list[float] = []
                for _ in range(epochs):
                    paths = [write_orders_file(registration.table_location, 10, first=i * 10) for i in range(count)]
                    started = time.monotonic()
                    await stub.PreCommit(
                        pb.PreCommitRequest(
                            sink="files", epoch=epoch, writer_term=term, data_files=[pb.DataFile(path=p) for p in paths]
                        ),
                        timeout=60,
                    )
                    precommits.append(time.monotonic() - started)
                    started = time.monotonic()
                    await stub.CommitCheckpoint(
                        pb.CommitCheckpointRequest(sink="files", epoch=epoch, writer_term=term, wait=True), timeout=60
                    )
                    commits.append(time.monotonic() - started)
                    epoch += 1
                rows.append({"files": count, "precommit": latency_stats(precommits), "commit": latency_stats(commits)})
    finally:
        coordinator.stop()
    return rows


async def precommit_on_big_log(database_url: str, data_dir: Path, *, seconds: float) -> dict[str, Any]:
    """Pre-commits (one file) of a new sink on a metastore that already holds many sinks and epochs."""
    coordinator = Coordinator(database_url, data_dir).start()
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            sinks = await register_sinks(stub, "biglog", 1)
            await drive_precommits(stub, sinks, 1, 0.3, True)
            return {
                "c1": await drive_precommits(stub, sinks, 1, seconds, True),
                "c8": await drive_precommits(stub, sinks, 8, seconds, True),
            }
    finally:
        coordinator.stop()
