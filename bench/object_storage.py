"""Part 8, pre-commit on far object storage: epochs of 1, 10 and 100 files on S3 with a latency per request.

SeaweedFS's S3 server on 127.0.0.1 stands for the object store; the coordinator reaches it (table metadata, footer
reads, existence checks) only through a proxy that adds `delay_seconds` in each direction (about a request
to a nearby region's endpoint). Files are written straight to the store beforehand, as executors would have:
their upload is not what is measured. Each epoch is pre-committed with the footers read by the coordinator
(an old writer) or sent by the writer with the file's size (the Spark writer), alternating, then committed
(CommitCheckpoint, wait) so that the log stays short; both latencies are reported per file count.

The baseline, taken in the same run before each epoch with footers sent: the same files' metadata requests
(HEAD, one per file) made straight from this process through the same proxy, on as many threads as the
coordinator checks files with. What PreCommit costs beyond it is the coordinator's; what the baseline costs
with more files is the storage's (on SeaweedFS here, its own CPU per request, which a real endpoint does not
share with the coordinator's machine).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO

from bench.infra import (
    FOOTER_MODES,
    ORDERS,
    Coordinator,
    Postgres,
    files_rows,
    latency_stats,
    register_orders_sink,
    timed_epoch,
)
from bench.latency_proxy import LatencyProxy
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.tables.precommit_files import MAX_CONCURRENT_FILE_CHECKS
from sink_coordinator_demo.object_store import local_object_store
from spark_writer.sink.parquet_writer import data_directory_uri

BUCKET = "bench-precommit"
# Footers read by the coordinator, sent (a HEAD per file), sent with the epoch's directory (one listing).
MODES = (*FOOTER_MODES, "listed")


def _orders(first: int, rows: int) -> pa.Table:
    ids = np.arange(first, first + rows, dtype=np.int64)
    customers = pa.array([f"c{i % 7}" for i in range(rows)], pa.string())
    return pa.table({"order_id": ids, "customer": customers, "amount": ids.astype(np.float64) * 1.5}, schema=ORDERS)


def _directory(location: str, epoch: int) -> str:
    """The epoch's own directory, as the Spark writer names it on an object store (listed once by PreCommit)."""
    return f"{data_directory_uri(location)}/{epoch:08d}"


def _upload(io: PyArrowFileIO, location: str, first: int, footers: str, epoch: int) -> pb.DataFile:
    """One 10-row Parquet file, uploaded under the table's data/ (listed: under the epoch's directory)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(_orders(first, 10), buffer)
    body = buffer.getvalue().to_pybytes()
    directory = _directory(location, epoch) if footers == "listed" else data_directory_uri(location)
    uri = f"{directory}/{uuid.uuid4().hex}.parquet"
    with io.new_output(uri).create() as stream:
        stream.write(body)
    if footers == "read":
        return pb.DataFile(path=uri)
    footer = pa.BufferOutputStream()
    pq.read_metadata(pa.BufferReader(body)).write_metadata_file(footer)
    return pb.DataFile(path=uri, parquet_footer=footer.getvalue().to_pybytes(), file_size_in_bytes=len(body))


async def run(
    postgres: Postgres, root: Path, *, file_counts: tuple[int, ...], epochs: int, delay_seconds: float
) -> dict[str, Any]:
    proxy: LatencyProxy | None = None
    coordinator: Coordinator | None = None
    with local_object_store(root / "object-store", BUCKET) as store:
        try:
            host, port = urlsplit(store.endpoint).hostname, urlsplit(store.endpoint).port
            assert host is not None and port is not None
            proxy = LatencyProxy(host, port, delay_seconds).start()
            database_url = postgres.new_database("s3")
            far = {**store.properties, "s3.endpoint": proxy.url}
            catalog = store.catalog_properties("sql", store.uri("warehouse"), database_url) | far
            coordinator = Coordinator(
                database_url,
                root / "s3",
                env={f"SINK_COORDINATOR_CATALOG__{key}": value for key, value in catalog.items()},
            ).start()
            rows = await _measure(coordinator, PyArrowFileIO(store.properties), PyArrowFileIO(far), file_counts, epochs)
            return {"delay_ms_each_way": delay_seconds * 1000, "epochs_per_cell": epochs, "rows": rows}
        finally:
            if coordinator is not None:
                coordinator.stop()
            if proxy is not None:
                proxy.stop()


def _head_all(io: PyArrowFileIO, files: list[pb.DataFile]) -> float:
    """Seconds to look up every file's size, MAX_CONCURRENT_FILE_CHECKS at a time (the baseline)."""
    started = time.monotonic()
    with ThreadPoolExecutor(MAX_CONCURRENT_FILE_CHECKS) as pool:
        sizes = list(pool.map(lambda file: len(io.new_input(file.path)), files))
    assert sizes == [file.file_size_in_bytes for file in files]
    return time.monotonic() - started


async def _measure(
    coordinator: Coordinator, io: PyArrowFileIO, far: PyArrowFileIO, file_counts: tuple[int, ...], epochs: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with grpc.aio.insecure_channel(coordinator.target) as channel:
        stub = pb_grpc.SinkCoordinatorStub(channel)
        registration = await register_orders_sink(stub, "s3", "bench.s3")
        term, epoch = registration.writer_term, 0
        for count in file_counts:
            precommits: dict[str, list[float]] = {mode: [] for mode in MODES}
            commits: dict[str, list[float]] = {mode: [] for mode in MODES}
            heads: list[float] = []
            for _ in range(epochs):
                for mode in MODES:
                    location = registration.table_location
                    files = await asyncio.gather(
                        *(asyncio.to_thread(_upload, io, location, i * 10, mode, epoch) for i in range(count))
                    )
                    if mode == "sent":
                        heads.append(await asyncio.to_thread(_head_all, far, files))
                    directory = _directory(location, epoch) if mode == "listed" else ""
                    precommit, commit = await timed_epoch(stub, "s3", term, epoch, files, 120, directory)
                    precommits[mode].append(precommit)
                    commits[mode].append(commit)
                    epoch += 1
            cell = files_rows(count, precommits, commits)
            next(row for row in cell if row["footers"] == "sent")["baseline_heads"] = latency_stats(heads)
            rows += cell
    return rows
