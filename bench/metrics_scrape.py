"""Part 11, the /metrics scrape at many sinks: its size, series and time, per-sink histograms against aggregated.

Issue 27 measured 70,675 series, 5 MB and up to 0.9 s a scrape at 1,502 sinks (every replica exporting every
sink's gauges and per-sink histograms), and a scrape stalling /healthz for 0.36 s. The same coordinator is run
twice on the same log of SINKS sinks, each sink pre-committing and committing one epoch through it: first with
the per-sink histograms of before (METRICS_SINK_DETAIL_MAX_SINKS above the sink count), then with the default
(histograms without the sink label above 200 sinks), with a second replica beside it that does not hold the log
reporter's lease (it exports only what is its own). Each scrape reads the metastore (METRICS_CACHE_SECONDS=0);
/healthz is asked every 20 ms meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench.infra import Coordinator, Postgres, latency_stats, register_orders_sink
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.metrics import scrape

TABLES = 10
# The families the log reporter alone exports.
LOG_FAMILIES = frozenset({name for name, _, _ in scrape.LOG_GAUGES} | {"sink_coordinator_table_committed_epoch"})
# Sinks registered, pre-committed and committed at a time while the log is filled.
CONCURRENCY = 16
BEFORE = {"SINK_COORDINATOR_METRICS_SINK_DETAIL_MAX_SINKS": "1000000"}


def run(postgres: Postgres, root: Path, *, sinks: int, scrapes: int) -> dict[str, Any]:
    database_url = postgres.new_database("scrape")
    common = {"SINK_COORDINATOR_METRICS_CACHE_SECONDS": "0"}
    results: dict[str, Any] = {"sinks": sinks, "scrapes": scrapes}
    started = time.monotonic()
    before = Coordinator(database_url, root / "scrape-before", env={**common, **BEFORE}).start()
    try:
        asyncio.run(_epoch_of_every_sink(before, sinks, epoch=0, register=True))
        results["setup_seconds"] = time.monotonic() - started
        results["before"] = _scraped(before, scrapes)
    finally:
        before.stop()
    after = Coordinator(database_url, root / "scrape-after", env=common).start()
    second = Coordinator(database_url, root / "scrape-second", env=common).start()
    try:
        asyncio.run(_epoch_of_every_sink(after, sinks, epoch=1, register=False))
        results["after"] = _scraped(after, scrapes)  # the first scrape takes the reporter's lease
        results["second_replica"] = _scraped(second, scrapes)
    finally:
        second.stop()
        after.stop()
    # Two replicas that both serve every sink: before, each exported everything; after, the second one exports
    # what the first does but the log's gauges (measured idle, the second replica lacks this traffic's counters).
    after, before_ = results["after"], results["before"]
    for key in ("bytes", "series"):
        results[f"{key}_ratio"] = after[key] / before_[key]
        results[f"fleet_{key}_ratio"] = (2 * after[key] - after[f"log_{key}"]) / (2 * before_[key])
    results["time_ratio_p50"] = results["after"]["scrape"]["p50_ms"] / results["before"]["scrape"]["p50_ms"]
    return results


async def _epoch_of_every_sink(coordinator: Coordinator, sinks: int, *, epoch: int, register: bool) -> None:
    """Each sink pre-commits an empty epoch and waits for its commit, CONCURRENCY sinks at a time (registered
    first when `register`): every sink is in this process's histograms."""
    slots = asyncio.Semaphore(CONCURRENCY)
    async with grpc.aio.insecure_channel(coordinator.target) as channel:
        stub = pb_grpc.SinkCoordinatorStub(channel)

        async def one(index: int) -> None:
            name = f"scrape-{index}"
            async with slots:
                if register:
                    term = (await register_orders_sink(stub, name, f"bench.scrape_{index % TABLES}")).writer_term
                else:
                    term = (await stub.GetSinkState(pb.GetSinkStateRequest(sink=name))).writer_term
                await stub.PreCommit(pb.PreCommitRequest(sink=name, epoch=epoch, writer_term=term), timeout=60)
                await stub.CommitCheckpoint(
                    pb.CommitCheckpointRequest(sink=name, epoch=epoch, writer_term=term, wait=True), timeout=60
                )

        await asyncio.gather(*(one(index) for index in range(sinks)))


def _family(line: str) -> str:
    """The metric a line of the text format is about (a sample, or its HELP or TYPE)."""
    if line.startswith("# "):
        parts = line.split(" ")
        return parts[2] if len(parts) > 2 else ""
    return line.split("{")[0].split(" ")[0]


def _scraped(coordinator: Coordinator, scrapes: int) -> dict[str, Any]:
    """`scrapes` scrapes after a warm-up, timed, with /healthz asked every 20 ms meanwhile."""
    base = f"http://127.0.0.1:{coordinator.http_port}"
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not done.is_set():
                began = time.perf_counter()
                client.get("/healthz").raise_for_status()
                probes.append(time.perf_counter() - began)
                done.wait(0.02)

    times: list[float] = []
    body = b""
    with httpx.Client(base_url=base, timeout=60) as client:
        client.get("/metrics").raise_for_status()  # warm-up
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        try:
            for _ in range(scrapes):
                began = time.perf_counter()
                answer = client.get("/metrics")
                times.append(time.perf_counter() - began)
                answer.raise_for_status()
                body = answer.content
        finally:
            done.set()
            prober.join(timeout=30)
    text = body.decode()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    log_lines = [line for line in text.splitlines() if _family(line) in LOG_FAMILIES]
    return {
        "bytes": len(body),
        "series": len(series),
        "log_series": sum(1 for line in log_lines if not line.startswith("#")),
        "log_bytes": sum(len(line) + 1 for line in log_lines),
        "per_sink_histogram_series": sum(
            1
            for line in series
            if line.startswith("sink_coordinator_")
            and "_seconds_" in line
            and 'sink="' in line
            and 'sink=""' not in line
        ),
        "log_reporter": "sink_coordinator_log_reporter 1.0" in text,
        "scrape": latency_stats(times),
        "healthz_during_scrapes": latency_stats(probes),
    }
