"""Part 10, the console: the sink list of 1,000 sinks, served and drawn, beside the admin API's JSON of the same sinks.

The page reads, filters and sorts every sink and shows the first PAGE_ROWS. The baseline is GET /api/v1/sinks
(the same read of the metastore, every sink as JSON) in the same run, interleaved. The
page is timed as an HTTP fetch (the coordinator's render and the transfer) and, where Chromium is installed, as a
browser's first contentful paint of a fresh load (what an operator waits for).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
from playwright.sync_api import sync_playwright

from bench.infra import Coordinator, Postgres, latency_stats, register_orders_sink
from coordinator_service.admin.console_routes import PAGE_ROWS
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc

TABLES = 10


def run(postgres: Postgres, root: Path, *, sinks: int, loads: int) -> dict[str, Any]:
    database_url = postgres.new_database("console")
    coordinator = Coordinator(database_url, root / "console").start()
    try:
        started = time.monotonic()
        asyncio.run(_sinks(coordinator, sinks))
        setup_seconds = time.monotonic() - started
        page, api = [], []
        page_bytes = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{coordinator.http_port}", timeout=60) as client:
            for attempt in range(loads + 1):
                began = time.perf_counter()
                answer = client.get("/console")
                took = time.perf_counter() - began
                answer.raise_for_status()
                assert answer.text.count("data-sink=") == min(sinks, PAGE_ROWS), "the page lists the wrong sinks"
                began = time.perf_counter()
                client.get("/api/v1/sinks").raise_for_status()
                api_took = time.perf_counter() - began
                if attempt:  # the first of each is a warm-up
                    page.append(took)
                    api.append(api_took)
                    page_bytes = len(answer.content)
        paint = _first_paints(f"http://127.0.0.1:{coordinator.http_port}/console", loads)
    finally:
        coordinator.stop()
    page_stats, api_stats = latency_stats(page), latency_stats(api)
    return {
        "sinks": sinks,
        "setup_seconds": setup_seconds,
        "page": page_stats,
        "api": api_stats,
        "ratio_p50": page_stats["p50_ms"] / api_stats["p50_ms"],
        "page_bytes": page_bytes,
        "page_rows": min(sinks, PAGE_ROWS),
        "first_paint": paint,
    }


async def _sinks(coordinator: Coordinator, count: int) -> None:
    async with grpc.aio.insecure_channel(coordinator.target) as channel:
        stub = pb_grpc.SinkCoordinatorStub(channel)
        for index in range(count):
            name = f"console-{index}"
            registration = await register_orders_sink(stub, name, f"bench.console_{index % TABLES}")
            # Some lag to show: an empty epoch pre-committed, every third one left unchecked.
            await stub.PreCommit(pb.PreCommitRequest(sink=name, epoch=0, writer_term=registration.writer_term))
            if index % 3:
                await stub.CommitCheckpoint(
                    pb.CommitCheckpointRequest(sink=name, epoch=0, writer_term=registration.writer_term)
                )


def _first_paints(url: str, loads: int) -> dict[str, float] | None:
    """First contentful paint of fresh loads in headless Chromium, in ms; None without Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return None
    paints: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            for attempt in range(loads + 1):
                page = browser.new_page()
                page.goto(url, wait_until="load")
                paint = page.evaluate(
                    "() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null"
                )
                page.close()
                if attempt and paint is not None:
                    paints.append(float(paint) / 1000)
        finally:
            browser.close()
    return latency_stats(paints) if paints else None
