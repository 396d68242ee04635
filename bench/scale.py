"""Part 5, scale: how the pre-commit and commit figures grow with files per epoch and with the log's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from bench.infra import (
    FOOTER_MODES,
    Coordinator,
    Postgres,
    data_file_message,
    files_rows,
    register_orders_sink,
    timed_epoch,
    write_orders_file,
)
from bench.precommit import ONE_FILE, drive_precommits, register_sinks
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc


async def files_per_epoch(
    postgres: Postgres, root: Path, *, file_counts: tuple[int, ...], epochs: int
) -> list[dict[str, Any]]:
    """Pre-commit latency and CommitCheckpoint(wait) latency of epochs of 1, 10, 100 small files, with the
    footers read by the coordinator or sent by the writer (epochs of both kinds alternate)."""
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
                precommits: dict[str, list[float]] = {mode: [] for mode in FOOTER_MODES}
                commits: dict[str, list[float]] = {mode: [] for mode in FOOTER_MODES}
                for _ in range(epochs):
                    for mode in FOOTER_MODES:
                        paths = [write_orders_file(registration.table_location, 10, first=i * 10) for i in range(count)]
                        files = [data_file_message(path, mode) for path in paths]
                        precommit, commit = await timed_epoch(stub, "files", term, epoch, files, 60)
                        precommits[mode].append(precommit)
                        commits[mode].append(commit)
                        epoch += 1
                rows += files_rows(count, precommits, commits)
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
            await drive_precommits([stub], sinks, 1, 0.3, ONE_FILE)
            return {
                "c1": await drive_precommits([stub], sinks, 1, seconds, ONE_FILE),
                "c8": await drive_precommits([stub], sinks, 8, seconds, ONE_FILE),
            }
    finally:
        coordinator.stop()
