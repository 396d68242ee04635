"""Part 1, the pre-commit path: PreCommit throughput and ack latency against raw PostgreSQL commits.

The coordinator is the real process, driven over gRPC by `concurrency` writers (asyncio tasks on one
grpc.aio channel in this process). The raw limit is the same number of psycopg connections in this
process, each running single-row INSERT ... COMMIT transactions into a table identical to
pending_sink_state (same server, same durability settings), with a row of the same size.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import psycopg

from bench.infra import (
    CPU_PARTS,
    Coordinator,
    CpuClock,
    Postgres,
    data_file_message,
    latency_stats,
    linked_copy,
    local_footer,
    postmaster,
    py_spy,
    register_orders_sink,
    spread,
    write_orders_file,
)
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.log.database import libpq_url

FILES_PER_SINK = 8
# The writers' connections to the coordinator (writer w on connection w mod this).
WRITER_CONNECTIONS = 8


# What an epoch of a cell holds: one file named by its path (the coordinator reads its footer), one file with its
# footer and size (as the Spark writer sends every file), or nothing.
ONE_FILE = "one_file"
ONE_FILE_SENT = "one_file_sent"
EMPTY = "empty"
MODES = (ONE_FILE, ONE_FILE_SENT, EMPTY)


@dataclass
class SinkSet:
    """Registered sinks (one table each) with a pool of small Parquet files per sink, and each file's footer and size
    (a linked copy has the same)."""

    names: list[str]
    terms: dict[str, int]
    files: dict[str, list[str]]
    footers: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    next_epoch: dict[str, itertools.count[int]] = field(default_factory=dict)


async def register_sinks(stub: pb_grpc.SinkCoordinatorAsyncStub, prefix: str, count: int, rows: int = 100) -> SinkSet:
    names = [f"{prefix}-{i}" for i in range(count)]
    terms: dict[str, int] = {}
    files: dict[str, list[str]] = {}
    for name in names:
        answer = await register_orders_sink(stub, name, f"bench.{name.replace('-', '_')}")
        terms[name] = answer.writer_term
        files[name] = [write_orders_file(answer.table_location, rows, first=i * rows) for i in range(FILES_PER_SINK)]
    footers = {path: local_footer(path) for paths in files.values() for path in paths}
    return SinkSet(names, terms, files, footers, {name: itertools.count() for name in names})


def _precommit_request(sinks: SinkSet, sink: str, mode: str) -> pb.PreCommitRequest:
    epoch = next(sinks.next_epoch[sink])
    files = []
    if mode != EMPTY:
        sample = sinks.files[sink][epoch % FILES_PER_SINK]
        footers = "sent" if mode == ONE_FILE_SENT else "read"
        files.append(data_file_message(linked_copy(sample), footers, sinks.footers[sample]))
    return pb.PreCommitRequest(sink=sink, epoch=epoch, writer_term=sinks.terms[sink], data_files=files)


async def drive_precommits(
    stubs: Sequence[pb_grpc.SinkCoordinatorAsyncStub],
    sinks: SinkSet,
    concurrency: int,
    seconds: float,
    mode: str,
    clock: CpuClock | None = None,
) -> dict[str, Any]:
    """`concurrency` writers, writer w on sink w mod len(sinks) and connection w mod len(stubs), each
    pre-committing its next epoch (of `mode`) in a loop; with a `clock`, the CPU each call cost (its warm-up's
    calls counted too)."""
    latencies: list[float] = []
    errors: list[str] = []
    calls = 0
    cpu_before = clock.read() if clock is not None else None
    warmup_end = time.monotonic() + min(0.5, seconds / 4)
    end = warmup_end + seconds

    async def writer(index: int) -> None:
        nonlocal calls
        sink = sinks.names[index % len(sinks.names)]
        stub = stubs[index % len(stubs)]
        while True:
            request = _precommit_request(sinks, sink, mode)
            started = time.monotonic()
            if started >= end:
                return
            try:
                answer = await stub.PreCommit(request, timeout=30)
                assert answer.outcome == pb.PreCommitResponse.PERSISTED, answer
            except grpc.aio.AioRpcError as error:
                errors.append(f"{error.code().name}: {error.details()}")
                continue
            calls += 1
            if started >= warmup_end:
                latencies.append(time.monotonic() - started)

    await asyncio.gather(*(writer(i) for i in range(concurrency)))
    return {
        "rate": len(latencies) / seconds,
        **latency_stats(latencies),
        "errors": errors[:3],
        "error_count": len(errors),
        **({"cpu_ms_per_call": clock.per_call(cpu_before, calls)} if clock and cpu_before else {}),
    }


RAW_TABLE = "raw_pending_sink_state"


def prepare_raw_table(database_url: str) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        connection.execute(f"CREATE TABLE {RAW_TABLE} (LIKE pending_sink_state INCLUDING ALL)")
        connection.execute(f"ALTER TABLE {RAW_TABLE} ADD FOREIGN KEY (sink_id) REFERENCES sinks (id) ON DELETE CASCADE")


async def drive_raw(
    database_url: str,
    sink_ids: list[int],
    concurrency: int,
    seconds: float,
    metadata: bytes,
    epochs: itertools.count[int],
    clock: CpuClock | None = None,
) -> dict[str, Any]:
    """`concurrency` connections, each: INSERT one row; COMMIT; in a loop; with a `clock`, the CPU each commit
    cost (the coordinator's is its idling)."""
    connections = [await psycopg.AsyncConnection.connect(libpq_url(database_url)) for _ in range(concurrency)]
    latencies: list[float] = []
    calls = 0
    cpu_before = clock.read() if clock is not None else None
    warmup_end = time.monotonic() + min(0.5, seconds / 4)
    end = warmup_end + seconds
    statement = (
        f"INSERT INTO {RAW_TABLE} (sink_id, epoch, status, metadata, attempt, file_count, record_count, files_cleaned)"
        " VALUES (%s, %s, 'PENDING', %s, 1, 1, 100, false)"
    )

    async def writer(index: int, connection: psycopg.AsyncConnection[Any]) -> None:
        nonlocal calls
        sink_id = sink_ids[index % len(sink_ids)]
        while True:
            started = time.monotonic()
            if started >= end:
                return
            await connection.execute(statement, (sink_id, next(epochs), metadata))
            await connection.commit()
            calls += 1
            if started >= warmup_end:
                latencies.append(time.monotonic() - started)

    try:
        await asyncio.gather(*(writer(i, c) for i, c in enumerate(connections)))
        # Read before the connections close: a backend's CPU goes with it.
        cpu = {"cpu_ms_per_call": clock.per_call(cpu_before, calls)} if clock and cpu_before else {}
    finally:
        for connection in connections:
            await connection.close()
    return {"rate": len(latencies) / seconds, **latency_stats(latencies), **cpu}


def sink_ids(database_url: str, names: list[str]) -> list[int]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        rows = connection.execute("SELECT id FROM sinks WHERE name = ANY(%s) ORDER BY id", (names,)).fetchall()
    return [int(row[0]) for row in rows]


def sample_metadata(database_url: str) -> bytes:
    """The stored metadata of one one-file epoch (the raw rows carry the same bytes)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        row = connection.execute("SELECT metadata FROM pending_sink_state WHERE file_count = 1 LIMIT 1").fetchone()
    return bytes(row[0]) if row else b"{}" * 400


async def run(
    postgres: Postgres,
    root: Path,
    *,
    concurrencies: tuple[int, ...],
    sink_counts: tuple[int, ...],
    modes: tuple[str, ...],
    seconds: float,
    repetitions: int,
    profile: Path | None,
    processes: int = 1,
) -> dict[str, Any]:
    """`processes`: the coordinator's serving processes (SINK_COORDINATOR_PROCESSES)."""
    database_url = postgres.new_database(f"precommit{processes}")
    coordinator = Coordinator(
        database_url, root / f"precommit-{processes}", env={"SINK_COORDINATOR_PROCESSES": str(processes)}
    ).start()
    # Connections of their own (no shared subchannel), which the kernel spreads over the coordinator's serving
    # processes when it has several.
    channels = [
        grpc.aio.insecure_channel(coordinator.target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(WRITER_CONNECTIONS)
    ]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for channel in channels:
                await stack.enter_async_context(channel)
            stubs = [pb_grpc.SinkCoordinatorStub(channel) for channel in channels]
            stub = stubs[0]
            clock = CpuClock([psutil.Process(coordinator.pid)], postmaster(postgres))
            sink_sets = {count: await register_sinks(stub, f"pc{count}", count) for count in sink_counts}
            # One pre-commit per sink set before measuring, so that the raw rows can copy a real metadata row.
            for sinks in sink_sets.values():
                await drive_precommits(stubs, sinks, 1, 0.2, ONE_FILE)
            prepare_raw_table(database_url)
            metadata = sample_metadata(database_url)
            raw_ids = sink_ids(database_url, sink_sets[max(sink_counts)].names)
            raw_epochs = itertools.count()
            raw: dict[int, list[dict[str, Any]]] = {c: [] for c in concurrencies}
            cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {
                (mode, count, c): [] for mode in modes for count in sink_counts for c in concurrencies
            }
            for repetition in range(repetitions):
                # Interleaved, so that the machine's drift hits the baseline and the coordinator alike.
                for concurrency in concurrencies:
                    raw[concurrency].append(
                        await drive_raw(database_url, raw_ids, concurrency, seconds, metadata, raw_epochs, clock)
                    )
                    for mode in modes:
                        for count in sink_counts:
                            profiled = (
                                profile is not None
                                and repetition == 0
                                and mode == ONE_FILE
                                and count == min(sink_counts)
                                and concurrency == max(concurrencies)
                            )
                            with py_spy(coordinator.pid, profile or Path("unused"), profiled):
                                cells[(mode, count, concurrency)].append(
                                    await drive_precommits(stubs, sink_sets[count], concurrency, seconds, mode, clock)
                                )
    finally:
        coordinator.stop()
    return {
        "processes": processes,
        "seconds_per_cell": seconds,
        "repetitions": repetitions,
        "raw": {str(c): summarize(runs) for c, runs in raw.items()},
        "coordinator": [
            {"mode": mode, "sinks": count, "concurrency": c, **summarize(runs)}
            for (mode, count, c), runs in cells.items()
        ],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = [run["cpu_ms_per_call"] for run in runs if "cpu_ms_per_call" in run]
    return {
        **({"cpu_ms_per_call": {part: spread([each[part] for each in cpu]) for part in CPU_PARTS}} if cpu else {}),
        "rate": spread([run["rate"] for run in runs]),
        "p50_ms": spread([run["p50_ms"] for run in runs]),
        "p99_ms": spread([run["p99_ms"] for run in runs]),
        "errors": sum(run.get("error_count", 0) for run in runs),
        "first_errors": next((run["errors"] for run in runs if run.get("errors")), []),
        "runs": runs,
    }
