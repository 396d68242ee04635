"""`python -m bench.upsert_rate [--quick]`: an upsert stream's sustained rate against the append stream of the same
records (issue 29's goal: at least 0.5 x).

One topic of JSON orders, half of its records updates of keys written before (the keys spread uniformly, every
record of a key in one partition), read twice from its start by the real job (spark_writer.job_run.start_job, the
code `sink-writer` runs, availableNow, `local[2]`) into two tables of the real coordinator process: once as an append
stream (every record a row) and once as an upsert stream (`--mode upsert --key order_id`: each epoch's last version
of a key written, the keys' earlier rows deleted by position at commit through the key index). Rate = records /
(query start to termination, including the last commit); the two runs alternate, so that a drift of the machine
falls on both. Each run's table is checked: the append table holds every record, the upsert table every key once
with its last version.

Writes bench/results/upsert_rate.md and upsert_rate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.e2e import local_pipeline
from bench.infra import Coordinator, Postgres, machine_facts, spread, temp_root

RESULTS = Path(__file__).parent / "results"
ORDER_DDL = "order_id BIGINT NOT NULL, customer STRING, amount DOUBLE, country STRING"
PARTITIONS = 4
BATCHES = 5
# The goal: the upsert stream's rate at least this share of the append stream's.
GOAL = 0.5


def stream(records: int, seed: int) -> list[tuple[int, dict[str, Any]]]:
    """`records` orders: the first version of records / 2 keys and as many updates of keys drawn uniformly among
    them, in a random order in which each key's first record creates it."""
    generator = random.Random(seed)
    keys = records // 2
    order = list(range(keys)) + [generator.randrange(keys) for _ in range(records - keys)]
    generator.shuffle(order)
    countries = ("DE", "FR", "US")
    return [
        (key, {"order_id": key, "customer": f"c{seq % 11}", "amount": seq * 1.25, "country": countries[seq % 3]})
        for seq, key in enumerate(order)
    ]


def produce(bootstrap: str, orders: list[tuple[int, dict[str, Any]]]) -> str:
    from tests.fixtures.kafka_broker import create_topic, produce_records

    topic = create_topic(bootstrap, PARTITIONS, prefix="bench-upsert")

    def records() -> Iterator[tuple[int, bytes, bytes]]:
        for key, order in orders:
            yield key % PARTITIONS, json.dumps({"order_id": key}).encode(), json.dumps(order).encode()

    produce_records(bootstrap, topic, records())
    return topic


def run_job(
    spark: Any, coordinator: Coordinator, bootstrap: str, topic: str, records: int, name: str, root: Path, upsert: bool
) -> float:
    """The job over the whole topic as `name`'s sink; its seconds from start to termination."""
    from spark_writer.job_run import start_job
    from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
    from spark_writer.mutations.modes import MutationMode, Mutations

    mutations = Mutations(MutationMode.UPSERT, ("order_id",)) if upsert else Mutations()
    settings = (
        KafkaSettings(bootstrap, (topic,), max_offsets_per_trigger=max(1, records // BATCHES)),
        ParseSettings(schema_ddl=ORDER_DDL, evolve_schema=False, mutations=mutations),
        SinkSettings(
            sink=name,
            table=f"bench.{name}",
            coordinator=coordinator.target,
            checkpoint_location=str(root / f"ckpt-{name}"),
            available_now=True,
        ),
    )
    started = time.monotonic()
    query = start_job(spark, *settings)
    assert query.await_termination(900), f"{name} did not finish"
    return time.monotonic() - started


def check_tables(catalog: Any, append: str, upsert: str, orders: list[tuple[int, dict[str, Any]]]) -> None:
    """The append table holds every record; the upsert table the last version of each key, once."""
    appended = catalog.load_table(f"bench.{append}").scan().to_arrow()
    assert appended.num_rows == len(orders), (appended.num_rows, len(orders))
    last = {key: order for key, order in orders}
    rows = catalog.load_table(f"bench.{upsert}").scan().to_arrow().to_pylist()
    assert len(rows) == len(last) and {row["order_id"]: row for row in rows} == last, (
        "the upsert table is not the model"
    )


def measure(root: Path, records: int, repetitions: int) -> dict[str, Any]:
    postgres = Postgres(root)
    with ExitStack() as stack:
        stack.callback(postgres.stop)
        # One session for both streams, on the JVM's defaults as the upsert stream's job runs (its records are
        # shuffled in the JVM); the append stream's job alone would run on the quick compiler (session.QUICK_JIT).
        bootstrap, coordinator, catalog, spark = local_pipeline(
            stack, root, postgres, "upsert_rate", records_in_jvm=True
        )
        # Warm-up: the JVM, the Python workers, both kinds of sink once.
        warm = stream(2_000, seed=0)
        warm_topic = produce(bootstrap, warm)
        for upsert in (False, True):
            run_job(spark, coordinator, bootstrap, warm_topic, len(warm), f"warm_{int(upsert)}", root, upsert)
        append_rates: list[float] = []
        upsert_rates: list[float] = []
        for repetition in range(repetitions):
            orders = stream(records, seed=repetition + 1)
            topic = produce(bootstrap, orders)
            names = {False: f"append_{repetition}", True: f"upsert_{repetition}"}
            # Alternate which goes first: a machine that speeds up or slows down weighs on both.
            for upsert in (False, True) if repetition % 2 == 0 else (True, False):
                seconds = run_job(spark, coordinator, bootstrap, topic, records, names[upsert], root, upsert)
                (upsert_rates if upsert else append_rates).append(records / seconds)
            check_tables(catalog, names[False], names[True], orders)
    ratios = [u / a for u, a in zip(upsert_rates, append_rates, strict=True)]
    return {
        "records": records,
        "keys": records // 2,
        "partitions": PARTITIONS,
        "batches": BATCHES,
        "append_rps": spread(append_rates),
        "upsert_rps": spread(upsert_rates),
        "ratio": spread(ratios),
        "ratios": ratios,
    }


def render(results: dict[str, Any]) -> str:
    part = results["part"]
    ratio = part["ratio"]
    verdict = "met" if ratio["median"] >= GOAL else "not met"
    return "\n".join(
        [
            "# An upsert stream's rate against the append stream of the same records",
            "",
            f"`python -m bench.upsert_rate{' --quick' if results['quick'] else ''}`, {results['date']}, "
            f"{results['machine']['cores']} cores, {results['repetitions']} repetitions (median, min-max), load "
            f"average {results['load_before']:.1f} before the run.",
            "",
            f"{part['records']:,} JSON orders on {part['partitions']} partitions, {part['keys']:,} keys: half the "
            "records update a key written before (drawn uniformly), every record of a key in one partition; read "
            f"from the start in {part['batches']} micro-batches by the real job (availableNow, `local[2]`) into the "
            "real coordinator's tables, once as an append stream and once as an upsert stream (`--mode upsert --key "
            "order_id`); each table checked against the records (every record; the last version of each key).",
            "",
            "| | records/s |",
            "| --- | ---: |",
            f"| append stream | {_rate(part['append_rps'])} |",
            f"| upsert stream | {_rate(part['upsert_rps'])} |",
            "",
            f"**Upsert / append: {ratio['median']:.2f} x ({ratio['min']:.2f}-{ratio['max']:.2f}), goal at least "
            f"{GOAL} x: {verdict}.**",
            "",
        ]
    )


def _rate(cell: dict[str, float]) -> str:
    return f"{cell['median']:,.0f} ({cell['min']:,.0f}-{cell['max']:,.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upsert_rate", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20,000 records, 2 repetitions")
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of upsert_rate.md and .json")
    args = parser.parse_args(argv)
    records, repetitions = (20_000, 2) if args.quick else (args.records, args.repetitions)
    root = temp_root()
    try:
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "quick": args.quick,
            "repetitions": repetitions,
            "load_before": os.getloadavg()[0],
            "machine": machine_facts(None),
            "part": measure(root, records, repetitions),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = render(results)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "upsert_rate.md").write_text(report)
    (args.output / "upsert_rate.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
