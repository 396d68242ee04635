"""`python -m bench.verification [--quick] [--rows N]`: what verifying a sink costs (issue 31).

A sink of the real coordinator process (embedded PostgreSQL, its SQL catalog, local files) whose table carries the
writer's Kafka position columns, built of epochs of EPOCH_ROWS rows each (pre-committed and committed through gRPC,
their end offsets in their properties). Measured in the same run:

- a full verification (shallow and deep: every live row's kafka_topic, kafka_partition, kafka_offset read and
  checked), in rows per second of the table (goal: 1,000,000 rows/s on 10,000,000 rows);
- the incremental verification the maintenance step makes after each new epoch, against that epoch's commit work
  (its PreCommit until PERSISTED plus its CommitCheckpoint(wait) until COMMITTED), as a ratio (goal <= 5 %); and
  the same once per INTERVAL_EPOCHS epochs, against their commits' work.

Writes bench/results/verification.md and verification.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog

from bench.infra import Coordinator, Postgres, machine_facts, spread, temp_root
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.contract.source_positions import END_OFFSETS
from coordinator_service.engine.verification.verifier import VerifiedTable, Verifier
from coordinator_service.log.database import ConnectionOptions, Database, normalize_url
from coordinator_service.tables.iceberg import IcebergGateway

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "orders"
PARTITIONS = 4
EPOCH_ROWS = 1_000_000
# Epochs one incremental verification covers in the second measure.
INTERVAL_EPOCHS = 20
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
    ]
)
SINK = "verified"


def epoch_file(location: str, epoch: int, rows: int, first: int) -> tuple[str, dict[str, int]]:
    """One Parquet file of an epoch's `rows` records, spread over the partitions from offset `first` of each (where
    the epoch before ended); its URI and the epoch's end offsets."""
    per_partition = rows // PARTITIONS
    # In no order: the check sorts each partition's offsets, and sorted input would flatter it.
    shuffled = np.random.default_rng(epoch).permutation(per_partition * PARTITIONS)
    partition = np.repeat(np.arange(PARTITIONS, dtype=np.int32), per_partition)[shuffled]
    offset = np.tile(np.arange(first, first + per_partition, dtype=np.int64), PARTITIONS)[shuffled]
    order_id = partition.astype(np.int64) * 10**12 + offset
    table = pa.table(
        {
            "order_id": order_id,
            "amount": order_id.astype(np.float64) * 0.5,
            "kafka_topic": pa.array([TOPIC] * len(order_id), pa.string()).dictionary_encode().cast(pa.string()),
            "kafka_partition": partition,
            "kafka_offset": offset,
        },
        schema=SCHEMA,
    )
    directory = Path(location.removeprefix("file://")) / "data"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"epoch-{epoch:05d}.parquet"
    pq.write_table(table, path, row_group_size=256 * 1024)
    return path.as_uri(), {str(p): first + per_partition for p in range(PARTITIONS)}


@dataclass
class EpochWriter:
    """The sink's writer: each epoch goes on where the one before ended."""

    stub: Any
    registration: Any
    epoch: int = 0
    next_offset: int = 0

    async def commit(self, rows: int) -> float:
        """Write, pre-commit and commit the next epoch; the seconds of its commit work (PreCommit +
        CommitCheckpoint(wait))."""
        path, ends = epoch_file(self.registration.table_location, self.epoch, rows, self.next_offset)
        properties = {END_OFFSETS: json.dumps({TOPIC: ends})}
        if self.epoch == 0:
            start = {TOPIC: dict.fromkeys(ends, 0)}
            properties["spark.end_offsets"] = json.dumps([{"$start": start, TOPIC: ends}])
        term = self.registration.writer_term
        started = time.monotonic()
        await self.stub.PreCommit(
            pb.PreCommitRequest(
                sink=SINK,
                epoch=self.epoch,
                writer_term=term,
                data_files=[pb.DataFile(path=path)],
                properties=properties,
            )
        )
        await self.stub.CommitCheckpoint(
            pb.CommitCheckpointRequest(sink=SINK, epoch=self.epoch, writer_term=term, wait=True)
        )
        seconds = time.monotonic() - started
        self.epoch, self.next_offset = self.epoch + 1, ends["0"]
        return seconds


async def measure(root: Path, rows: int, incremental_epochs: int, repetitions: int) -> dict[str, Any]:
    postgres = Postgres(root)
    try:
        database_url = postgres.new_database("verification")
        coordinator = Coordinator(database_url, root / "coordinator").start()
        try:
            catalog = load_catalog("default", type="sql", uri=database_url, warehouse=coordinator.warehouse.as_uri())
            database = Database(normalize_url(database_url), ConnectionOptions(pool_size=2))
            verifier = Verifier(database, IcebergGateway(catalog))
            async with grpc.aio.insecure_channel(coordinator.target) as channel:
                stub = pb_grpc.SinkCoordinatorStub(channel)
                registration = await stub.RegisterWriter(
                    pb.RegisterWriterRequest(
                        sink=SINK,
                        table="bench.verified",
                        checkpointed_epoch=-1,
                        arrow_schema=SCHEMA.serialize().to_pybytes(),
                    )
                )
                writer = EpochWriter(stub, registration)
                started = time.monotonic()
                epochs = -(-rows // EPOCH_ROWS)
                for _ in range(epochs):
                    await writer.commit(EPOCH_ROWS)
                built = time.monotonic() - started
                full: list[float] = []
                for _ in range(repetitions):
                    started = time.monotonic()
                    whole = await verifier.verify(SINK)
                    full.append(time.monotonic() - started)
                    assert whole.ok, whole.faults
                [table] = whole.tables
                assert table.rows_read == epochs * EPOCH_ROWS, table.rows_read
                since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, whole.end_offsets)}
                # After every epoch (the step's interval as short as the commits'), then once per INTERVAL_EPOCHS
                # epochs (the step's default interval covers 60 commits at the default commit interval).
                commits: list[float] = []
                increments: list[float] = []
                ratios: list[float] = []
                for per in (1, INTERVAL_EPOCHS):
                    for _ in range(incremental_epochs if per == 1 else repetitions):
                        work = [await writer.commit(EPOCH_ROWS // 10) for _ in range(per)]
                        started = time.monotonic()
                        later = await verifier.verify(SINK, since=since)
                        seconds = time.monotonic() - started
                        assert later.ok, later.faults
                        [table] = later.tables
                        since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, later.end_offsets)}
                        if per == 1:
                            commits.extend(work)
                            increments.append(seconds)
                        else:
                            ratios.append(seconds / sum(work))
            await database.dispose()
        finally:
            coordinator.stop()
        return {
            "rows": epochs * EPOCH_ROWS,
            "files": epochs,
            "build_seconds": round(built, 1),
            "full_s": spread(full),
            "full_rows_per_s": epochs * EPOCH_ROWS / float(np.median(full)),
            "rows_read": table.rows_read,
            "incremental_epoch_rows": EPOCH_ROWS // 10,
            "commit_s": spread(commits),
            "incremental_s": spread(increments),
            "incremental_ratio": spread([i / c for i, c in zip(increments, commits, strict=True)]),
            "interval_epochs": INTERVAL_EPOCHS,
            "interval_ratio": spread(ratios),
            "machine": machine_facts(postgres),
        }
    finally:
        postgres.stop()


def render(results: dict[str, Any]) -> str:
    full, commit, increment, ratio = (
        results["full_s"],
        results["commit_s"],
        results["incremental_s"],
        results["incremental_ratio"],
    )
    interval = results["interval_ratio"]
    machine = results["machine"]
    rate = results["full_rows_per_s"]
    lines = [
        "# Verification (bench/verification.py, issue 31)",
        "",
        f"Run: {results['date']}, {'quick' if results['quick'] else 'full'}, median (min-max), "
        f"{machine['cores']} cores, {machine['cpu_model']}, pyiceberg {machine['pyiceberg']}; the real coordinator "
        f"process on embedded PostgreSQL, its SQL catalog, local files; {PARTITIONS} Kafka partitions.",
        "",
        "| | measured | goal |",
        "|---|---|---|",
        f"| full verification of {results['rows']:,} rows ({results['files']} files), s | {full['median']:.2f} "
        f"({full['min']:.2f}-{full['max']:.2f}) | |",
        f"| deep verification, rows/s | {rate:,.0f} | 1,000,000 rows/s on 10,000,000 rows: "
        f"{'met' if rate >= 1_000_000 and results['rows'] >= 10_000_000 else 'not met'} |",
        f"| an epoch's commit work ({results['incremental_epoch_rows']:,} rows: PreCommit + CommitCheckpoint(wait)), "
        f"s | {commit['median']:.3f} ({commit['min']:.3f}-{commit['max']:.3f}) | |",
        f"| the incremental verification after it, s | {increment['median']:.3f} "
        f"({increment['min']:.3f}-{increment['max']:.3f}) | |",
        f"| incremental / commit, verified after every epoch | {ratio['median']:.1%} ({ratio['min']:.1%}-"
        f"{ratio['max']:.1%}) | <= 5 %: {'met' if ratio['median'] <= 0.05 else 'not met'} |",
        f"| incremental / commits, verified once per {results['interval_epochs']} epochs | "
        f"{interval['median']:.1%} ({interval['min']:.1%}-{interval['max']:.1%}) | <= 5 %: "
        f"{'met' if interval['median'] <= 0.05 else 'not met'} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verification", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2,000,000 rows, 3 incremental epochs")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of verification.md and .json")
    args = parser.parse_args(argv)
    rows = 2_000_000 if args.quick else args.rows
    root = temp_root()
    try:
        measured = asyncio.run(measure(root, rows, 3 if args.quick else 8, 2 if args.quick else args.repetitions))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {"date": time.strftime("%Y-%m-%d"), "quick": args.quick, **measured}
    report = render(results)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "verification.md").write_text(report)
    (args.output / "verification.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
