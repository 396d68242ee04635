"""Part 6, fairness: many busy sinks and few commit slots; every sink's checkpoint -> COMMITTED stays bounded.

`sinks` sinks (a table each) each pre-commit a one-file epoch every `batch_seconds` and report its checkpoint
(CommitCheckpoint without waiting), as a Spark writer does (`stream_epochs`, which part 16, capacity, shares).
The coordinator runs with COMMIT_CONCURRENCY and COMMIT_INTERVAL_SECONDS as the chart's production values set
them. An epoch's latency runs from its CommitCheckpoint call to the commit time of the snapshot that holds it
(`checkpoint_to_commit`). The baseline, in the same run: one sink alone on the same
settings. Reported: each sink's p50/p99, the worst sink's p99 against the baseline's p99, and the interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from pyiceberg.catalog import load_catalog

from bench.infra import Coordinator, Postgres, latency_stats, linked_copy, register_orders_sink, write_orders_file
from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_SINK, snapshot_properties
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc

# The wait before a refused call is sent again (a writer backs off rather than adding to the overload).
REFUSED_RETRY_SECONDS = 0.1


@dataclass
class EpochStream:
    """What one writer did: when it reported each epoch's checkpoint (wall clock), and how late each epoch
    started against its schedule (a writer whose calls take longer than its trigger falls behind)."""

    checkpoints: dict[int, float] = field(default_factory=dict)
    lags: list[float] = field(default_factory=list)
    # Calls answered UNAVAILABLE (an overloaded server refuses new streams) and sent again, as a writer does.
    refused: int = 0

    async def call(self, method: Callable[..., Awaitable[Any]], request: Any, deadline_seconds: float) -> Any:
        while True:
            try:
                return await method(request, timeout=deadline_seconds)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self.refused += 1
                await asyncio.sleep(REFUSED_RETRY_SECONDS)


async def stream_epochs(
    stub: pb_grpc.SinkCoordinatorAsyncStub,
    sink: str,
    registration: pb.RegisterWriterResponse,
    *,
    seconds: float,
    batch_seconds: float,
    offset: float,
) -> EpochStream:
    """One registered writer at a fixed trigger: a one-file epoch pre-committed and its checkpoint reported (without
    waiting) every `batch_seconds` for `seconds`, starting `offset` seconds in; the last epoch is then waited for,
    so the run ends with every epoch in the table."""
    term = registration.writer_term
    sample = write_orders_file(registration.table_location, 10)
    stream = EpochStream()
    await asyncio.sleep(offset)  # the writers' batches are spread over the batch interval, as real streams are
    started = time.monotonic()
    epoch = 0
    while time.monotonic() - started < seconds:
        due = started + epoch * batch_seconds
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
        stream.lags.append(time.monotonic() - due)
        files = [pb.DataFile(path=linked_copy(sample))]
        await stream.call(
            stub.PreCommit, pb.PreCommitRequest(sink=sink, epoch=epoch, writer_term=term, data_files=files), 60
        )
        stream.checkpoints[epoch] = time.time()
        await stream.call(
            stub.CommitCheckpoint, pb.CommitCheckpointRequest(sink=sink, epoch=epoch, writer_term=term), 60
        )
        epoch += 1
    await stream.call(
        stub.CommitCheckpoint,
        pb.CommitCheckpointRequest(sink=sink, epoch=epoch - 1, writer_term=term, wait=True),
        600,
    )
    return stream


async def stream_sinks(
    stubs: Sequence[pb_grpc.SinkCoordinatorAsyncStub],
    sinks: Sequence[str],
    registrations: Sequence[pb.RegisterWriterResponse],
    *,
    seconds: float,
    batch_seconds: float,
) -> list[EpochStream]:
    """Every sink's writer (`stream_epochs`, on the stub of the same index), their batches spread evenly over the
    batch interval, as real streams' are."""
    count = len(sinks)
    return list(
        await asyncio.gather(
            *(
                stream_epochs(
                    stub,
                    sink,
                    registration,
                    seconds=seconds,
                    batch_seconds=batch_seconds,
                    offset=batch_seconds * index / count,
                )
                for index, (stub, sink, registration) in enumerate(zip(stubs, sinks, registrations, strict=True))
            )
        )
    )


def checkpoint_to_commit(catalog: Any, sink: str, checkpoints: dict[int, float]) -> list[float]:
    """Seconds from each epoch's checkpoint to the commit of the snapshot that holds it (the snapshot's own
    timestamp: same machine, same clock, so measuring adds no load)."""
    table = catalog.load_table(sink_table(sink))
    committed = sorted(
        (int(snapshot_properties(snapshot)[MARKER_EPOCH]), snapshot.timestamp_ms / 1000.0)
        for snapshot in table.snapshots()
        if snapshot_properties(snapshot).get(MARKER_SINK) == sink
    )
    latencies = []
    for epoch, checkpointed_at in checkpoints.items():
        holder = next(at for marker, at in committed if marker >= epoch)
        latencies.append(max(0.0, holder - checkpointed_at))
    return latencies


def sink_table(sink: str) -> str:
    return f"bench.{sink.replace('-', '_')}"


async def _measure(
    postgres: Postgres, root: Path, name: str, *, sinks: int, concurrency: int, interval: float, seconds: float
) -> dict[str, Any]:
    database_url = postgres.new_database(name)
    coordinator = Coordinator(
        database_url,
        root / name,
        env={
            "SINK_COORDINATOR_COMMIT_CONCURRENCY": str(concurrency),
            "SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS": str(interval),
        },
    ).start()
    batch_seconds = 1.0
    try:
        async with grpc.aio.insecure_channel(coordinator.target) as channel:
            stub = pb_grpc.SinkCoordinatorStub(channel)
            names = [f"{name}-{index}" for index in range(sinks)]
            registrations = [await register_orders_sink(stub, sink, sink_table(sink)) for sink in names]
            runs = await stream_sinks(
                [stub] * sinks, names, registrations, seconds=seconds, batch_seconds=batch_seconds
            )
    finally:
        coordinator.stop()
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=coordinator.warehouse.as_uri())
    per_sink = {
        sink: latency_stats(checkpoint_to_commit(catalog, sink, run.checkpoints))
        for sink, run in zip(names, runs, strict=True)
    }
    p99s = [stats["p99_ms"] for stats in per_sink.values()]
    return {
        "sinks": sinks,
        "concurrency": concurrency,
        "interval_seconds": interval,
        "batch_seconds": batch_seconds,
        "seconds": seconds,
        "epochs": sum(stats["n"] for stats in per_sink.values()),
        "sink_p99_ms": {"median": float(np.median(p99s)), "max": float(max(p99s)), "min": float(min(p99s))},
        "sink_p50_ms_median": float(np.median([stats["p50_ms"] for stats in per_sink.values()])),
        "worst_sink_max_ms": float(max(stats["max_ms"] for stats in per_sink.values())),
    }


async def run(
    postgres: Postgres, root: Path, *, sinks: int, concurrency: int, interval: float, seconds: float
) -> dict[str, Any]:
    alone = await _measure(
        postgres, root, "alone", sinks=1, concurrency=concurrency, interval=interval, seconds=seconds
    )
    crowd = await _measure(
        postgres, root, "crowd", sinks=sinks, concurrency=concurrency, interval=interval, seconds=seconds
    )
    return {
        "alone": alone,
        "crowd": crowd,
        "ratio_worst_p99_to_alone_p99": crowd["sink_p99_ms"]["max"] / alone["sink_p99_ms"]["max"],
    }
