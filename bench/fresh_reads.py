"""`python -m bench.fresh_reads [--quick]`: what a fresh read (spark_writer.fresh, issue 31) gives and costs.

A sink of the real coordinator process (embedded PostgreSQL, its SQL catalog, local files) fed by the Spark writer
(`start_job`, JSON orders with the kafka_* columns, a 1-second trigger) from a real broker (noida-db); its table
holds TABLE_RECORDS records before the measures start. Then a producer sends RATE records a second, and every
READ_INTERVAL_SECONDS a fresh read (`read_arrow`) is made. For each read:

- staleness: of the records the broker acknowledged before the read began, how many the result lacks (goal 0), and
  the table's own lag at that moment: the age of the oldest acknowledged record beyond the end offsets of the
  snapshot the read used (what a plain read of the table would lack);
- time: the fresh read's, against reading the table alone (pyiceberg, at the snapshot the read used) plus reading the
  tail from Kafka (the same ranges, confluent-kafka, undecoded) right after it (goal <= 1.5x).

Writes bench/results/fresh_reads.md and fresh_reads.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from bench.e2e import ORDER_DDL, local_pipeline
from bench.infra import Postgres, machine_facts, spread, temp_root
from spark_writer.kafka.offsets import OffsetRange, Offsets, PartitionKey, offsets_from_json

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 3
TABLE_RECORDS = 500_000
RATE = 2_000
READ_INTERVAL_SECONDS = 2.0
SINK = "fresh"
TABLE = "bench.fresh"
TRIGGER = "1 second"


@dataclass
class Acknowledged:
    """Where each record the producer sent landed and when the broker acknowledged it (monotonic seconds)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    records: list[tuple[int, int, float]] = field(default_factory=list)

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is None:
            with self.lock:
                self.records.append((int(message.partition()), int(message.offset()), time.monotonic()))

    def before(self, moment: float) -> list[tuple[int, int, float]]:
        with self.lock:
            return [record for record in self.records if record[2] < moment]


def order_value(order_id: int) -> bytes:
    countries = ("DE", "FR", "US")
    record = {"order_id": order_id, "customer": f"c{order_id % 97}", "amount": order_id * 0.5}
    return json.dumps({**record, "country": countries[order_id % 3]}).encode()


def produce_steadily(bootstrap: str, topic: str, acknowledged: Acknowledged, stop: threading.Event, first: int) -> None:
    """RATE records a second, round robin over the partitions, each acknowledgement noted, until `stop`."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    order_id, started = first, time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * RATE) + first
        while order_id < due:
            producer.produce(
                topic, order_value(order_id), partition=order_id % PARTITIONS, on_delivery=acknowledged.on_delivery
            )
            order_id += 1
        producer.poll(0.01)
    producer.flush(30)


def table_end(catalog: Any, snapshot_id: int | None) -> Offsets:
    """The end offsets of the newest snapshot of the sink's at or below `snapshot_id`."""
    from pyiceberg.table.snapshots import ancestors_of

    from coordinator_service.contract.markers import snapshot_properties
    from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS

    if snapshot_id is None:
        return {}
    table = catalog.load_table(TABLE)
    for snapshot in ancestors_of(table.snapshot_by_id(snapshot_id), table.metadata):
        properties = snapshot_properties(snapshot)
        if SNAPSHOT_END_OFFSETS in properties:
            return offsets_from_json(json.loads(properties[SNAPSHOT_END_OFFSETS]))
    return {}


def wait_for_table(catalog: Any, records: int, timeout: float = 600.0) -> None:
    """Until the table's newest snapshot of the sink ends past `records` records (the writer's first batches)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = catalog.load_table(TABLE) if catalog.table_exists(TABLE) else None
        current = None if table is None else table.current_snapshot()
        if current is not None and sum(table_end(catalog, current.snapshot_id).values()) >= records:
            return
        time.sleep(1)
    raise TimeoutError(f"the writer did not commit {records} records in {timeout} s")


def baseline_seconds(catalog: Any, bootstrap: str, topic: str, snapshot_id: int | None, ends: dict[str, Any]) -> float:
    """Reading the table alone at the snapshot, plus the tail's records from Kafka, undecoded."""
    from spark_writer.kafka.options import parse_options
    from spark_writer.kafka.range_reader import read_range

    started = time.monotonic()
    if snapshot_id is not None:
        catalog.load_table(TABLE).scan(snapshot_id=snapshot_id).to_arrow()
    start = table_end(catalog, snapshot_id)
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    for key, end in offsets_from_json(ends).items():
        for _ in read_range(OffsetRange(key.topic, key.partition, start.get(key, 0), end), options):
            pass
    return time.monotonic() - started


def measure(root: Path, table_records: int, reads: int) -> dict[str, Any]:
    from coordinator_service.contract.source_positions import SNAPSHOT_END_OFFSETS
    from spark_writer import fresh
    from spark_writer.fresh.table_head import SNAPSHOT_ID_METADATA
    from spark_writer.job import start_job
    from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
    from tests.fixtures.kafka_broker import create_topic, produce_records

    postgres = Postgres(root)
    results: dict[str, Any] = {"machine": machine_facts(postgres)}
    with ExitStack() as stack:
        stack.callback(postgres.stop)
        bootstrap, coordinator, catalog, spark = local_pipeline(stack, root, postgres, "fresh", records_in_jvm=False)
        topic = create_topic(bootstrap, PARTITIONS, prefix="bench")
        produce_records(
            bootstrap, topic, ((i % PARTITIONS, str(i).encode(), order_value(i)) for i in range(table_records))
        )
        query = start_job(
            spark,
            KafkaSettings(bootstrap, (topic,)),
            ParseSettings(schema_ddl=ORDER_DDL, evolve_schema=False, kafka_metadata=True),
            SinkSettings(SINK, TABLE, coordinator.target, str(root / "checkpoint"), processing_time=TRIGGER),
        )
        stack.callback(query.stop)
        wait_for_table(catalog, table_records)
        acknowledged, stop = Acknowledged(), threading.Event()
        producer = threading.Thread(
            target=produce_steadily, args=(bootstrap, topic, acknowledged, stop, table_records), daemon=True
        )
        producer.start()
        stack.callback(producer.join, 60)
        stack.callback(stop.set)
        flags: dict[str, Any] = {"bootstrap_servers": bootstrap, "topic": topic, "kafka_metadata": True}
        missing, lags, fresh_s, base_s, rows, tails = [], [], [], [], [], []
        for _ in range(reads):
            time.sleep(READ_INTERVAL_SECONDS)
            began = time.monotonic()
            read = fresh.read_arrow(sink=SINK, coordinator=coordinator.target, catalog=catalog, **flags)
            fresh_s.append(time.monotonic() - began)
            sent = acknowledged.before(began)
            positions = set(zip(read["kafka_partition"].to_pylist(), read["kafka_offset"].to_pylist(), strict=True))
            missing.append(sum((partition, offset) not in positions for partition, offset, _ in sent))
            metadata = read.schema.metadata or {}
            snapshot = metadata.get(SNAPSHOT_ID_METADATA.encode())
            snapshot_id = None if snapshot is None else int(snapshot)
            ends = json.loads(metadata[SNAPSHOT_END_OFFSETS.encode()])
            in_table = table_end(catalog, snapshot_id)
            beyond = [at for partition, offset, at in sent if offset >= in_table.get(PartitionKey(topic, partition), 0)]
            lags.append(began - min(beyond) if beyond else 0.0)
            tails.append(sum(ends[topic].values()) - sum(in_table.values()))
            rows.append(read.num_rows)
            base_s.append(baseline_seconds(catalog, bootstrap, topic, snapshot_id, ends))
        results.update(
            {
                "table_records": table_records,
                "reads": reads,
                "rate": RATE,
                "missing": missing,
                "table_lag_s": spread(lags),
                "fresh_s": spread(fresh_s),
                "baseline_s": spread(base_s),
                "ratio": spread([f / b for f, b in zip(fresh_s, base_s, strict=True)]),
                "tail_records": spread([float(each) for each in tails]),
                "rows": spread([float(each) for each in rows]),
                "table_lag_p50_s": float(np.median(lags)),
            }
        )
    return results


def render(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lag, fresh_s, base_s, ratio, tail = (
        results["table_lag_s"],
        results["fresh_s"],
        results["baseline_s"],
        results["ratio"],
        results["tail_records"],
    )
    missing = sum(results["missing"])
    lines = [
        "# Fresh reads (bench/fresh_reads.py, issue 31)",
        "",
        f"Run: {results['date']}, {'quick' if results['quick'] else 'full'}, median (min-max) over {results['reads']} "
        f"reads, {machine['cores']} cores, {machine['cpu_model']}; the real coordinator process on embedded "
        f"PostgreSQL, its SQL catalog, local files; noida-db; the Spark writer at a {TRIGGER} trigger; a table of "
        f"{results['table_records']:,} records, then {results['rate']:,} records/s over {PARTITIONS} partitions.",
        "",
        "| | measured | goal |",
        "|---|---|---|",
        f"| records acknowledged before a read began and missing from it (all reads) | {missing} | 0: "
        f"{'met' if missing == 0 else 'not met'} |",
        f"| the table's own lag at the read (the oldest acknowledged record it lacks), s | {lag['median']:.2f} "
        f"({lag['min']:.2f}-{lag['max']:.2f}) | |",
        f"| tail records a read took from Kafka | {tail['median']:,.0f} ({tail['min']:,.0f}-{tail['max']:,.0f}) | |",
        f"| fresh read, s | {fresh_s['median']:.3f} ({fresh_s['min']:.3f}-{fresh_s['max']:.3f}) | |",
        f"| the table alone (pyiceberg, same snapshot) + the tail from Kafka (undecoded), s | {base_s['median']:.3f} "
        f"({base_s['min']:.3f}-{base_s['max']:.3f}) | |",
        f"| fresh / (table + tail) | {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) | <= 1.5: "
        f"{'met' if ratio['median'] <= 1.5 else 'not met'} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fresh_reads", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a table of 50,000 records, 4 reads")
    parser.add_argument("--reads", type=int, default=10)
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of fresh_reads.md and .json")
    args = parser.parse_args(argv)
    root = temp_root()
    try:
        started = time.monotonic()
        results = measure(root, 50_000 if args.quick else TABLE_RECORDS, 4 if args.quick else args.reads)
        results.update({"quick": args.quick, "date": date.today().isoformat()})
        results["wall_s"] = round(time.monotonic() - started)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "fresh_reads.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.output / "fresh_reads.md").write_text(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
