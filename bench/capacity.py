"""Part 16, capacity: how many busy sinks one coordinator keeps committing within a bounded latency.

`python -m bench.capacity` (writes bench/results/capacity.md and capacity.json). N sinks, a table each, each with a
writer at a 1 s trigger: a one-file epoch pre-committed and its checkpoint reported every second (fairness's
`stream_epochs`, as a Spark writer does), the coordinator at its defaults (commit interval, concurrency,
maintenance). N rises step by step; a step passes when the p99 from CommitCheckpoint to the commit of the snapshot
holding the epoch is at most the interval + 3 s and the writers keep their schedule (the p99 of how late an epoch
starts stays under one trigger: else pre-commits queue). The capacity of a shape is its largest passing N. Shapes,
each on a database of its own: one serving process; one per core (SINK_COORDINATOR_PROCESSES); two replicas of one
process each on one database, the writers split between them.

Each step also measures the CPU seconds the coordinator's processes and PostgreSQL's spent per sink per second of
streaming (psutil, over the streaming window), from which the report models what N replicas on one database would
carry. The writers run in this process, on the same cores: their CPU is reported beside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from pyiceberg.catalog import load_catalog

from bench.fairness import EpochStream, checkpoint_to_commit, sink_table, stream_sinks
from bench.infra import (
    Coordinator,
    CpuClock,
    Postgres,
    latency_stats,
    machine_facts,
    postmaster,
    register_orders_sink,
    temp_root,
)
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results"
BATCH_SECONDS = 1.0
# The bound: an epoch is in the table within the commit interval plus this.
SLACK_SECONDS = 3.0
# The coordinator's default, which every shape runs with.
COMMIT_INTERVAL_SECONDS: float = Settings.model_fields["commit_interval_seconds"].default
REGISTRATIONS_AT_ONCE = 4


# The coordinator's defaults (the bench's Coordinator otherwise commits at once and runs no maintenance).
DEFAULTS = {
    "SINK_COORDINATOR_COMMIT_INTERVAL_SECONDS": str(COMMIT_INTERVAL_SECONDS),
    "SINK_COORDINATOR_MAINTENANCE_ENABLED": str(Settings.model_fields["maintenance_enabled"].default).lower(),
}


def shapes(cores: int) -> dict[str, tuple[dict[str, str], ...]]:
    """Each shape's coordinators, as the environment each one runs with."""
    return {
        "1 process": ({**DEFAULTS, "SINK_COORDINATOR_PROCESSES": "1"},),
        f"{cores} processes (every core)": ({**DEFAULTS, "SINK_COORDINATOR_PROCESSES": str(cores)},),
        "2 replicas, 1 process each": ({**DEFAULTS, "SINK_COORDINATOR_PROCESSES": "1"},) * 2,
    }


@dataclass
class CpuWindow:
    """CPU seconds (coordinator, PostgreSQL, the writers) at the start and end of the streaming window."""

    before: tuple[float, float, float]
    after: tuple[float, float, float]
    seconds: float

    def ms_per_sink_second(self, sinks: int) -> tuple[float, ...]:
        return tuple(
            1000 * (after - before) / (sinks * self.seconds)
            for before, after in zip(self.before, self.after, strict=True)
        )


async def _streams(
    targets: Sequence[str], sinks: int, seconds: float, read_cpu: Callable[[], tuple[float, float, float]]
) -> tuple[list[EpochStream], CpuWindow]:
    """Every sink registered (on the coordinator its index picks), then all streaming together, with the CPU
    spent over the streaming window."""
    names = [f"cap-{index}" for index in range(sinks)]
    # A connection per writer, as writers are processes of their own (and a connection carries at most
    # GRPC_MAX_STREAMS_PER_CONNECTION calls at once).
    # (grpc shares one connection among a process's channels to a target unless each has its own subchannel pool).
    local = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(targets[index % len(targets)], options=local) for index in range(sinks)]
    stubs = [pb_grpc.SinkCoordinatorStub(channel) for channel in channels]
    try:
        slots = asyncio.Semaphore(REGISTRATIONS_AT_ONCE)

        async def register(index: int, sink: str) -> Any:
            async with slots:
                while True:
                    try:
                        return await register_orders_sink(stubs[index], sink, sink_table(sink))
                    except grpc.aio.AioRpcError as error:
                        # Creations of one writer scope take turns: a writer retries UNAVAILABLE, and so does this.
                        if error.code() != grpc.StatusCode.UNAVAILABLE:
                            raise

        registrations = await asyncio.gather(*(register(index, sink) for index, sink in enumerate(names)))
        before = read_cpu()
        started = time.monotonic()
        streams = asyncio.ensure_future(
            stream_sinks(stubs, names, registrations, seconds=seconds, batch_seconds=BATCH_SECONDS)
        )
        # The window is the streaming itself: the drain after it (the last epochs' commits) is not a second of load.
        await asyncio.sleep(seconds + BATCH_SECONDS)
        window = CpuWindow(before, read_cpu(), time.monotonic() - started)
        return await streams, window
    finally:
        for channel in channels:
            await channel.close()


def step(
    root: Path, postgres: Postgres, environments: Sequence[dict[str, str]], sinks: int, seconds: float
) -> dict[str, Any]:
    """One step of the ladder: `sinks` sinks streaming for `seconds` on a fresh database."""
    name = f"capacity_{len(environments)}_{environments[0]['SINK_COORDINATOR_PROCESSES']}_{sinks}"
    database_url = postgres.new_database(name)
    with ExitStack() as stack:
        coordinators = []
        for index, environment in enumerate(environments):
            coordinator = Coordinator(database_url, root / f"{name}-{index}", env=environment).start()
            stack.callback(coordinator.stop)
            coordinators.append(coordinator)
        processes = [psutil.Process(each.process.pid) for each in coordinators if each.process is not None]
        clock = CpuClock(processes, postmaster(postgres))
        runs, window = asyncio.run(_streams([each.target for each in coordinators], sinks, seconds, clock.read))
    catalog = load_catalog("default", type="sql", uri=database_url, warehouse=coordinators[0].warehouse.as_uri())
    latencies = [
        value
        for index, run in enumerate(runs)
        for value in checkpoint_to_commit(catalog, f"cap-{index}", run.checkpoints)
    ]
    lags = [lag for run in runs for lag in run.lags]
    coordinator_cpu, database_cpu, writers_cpu = window.ms_per_sink_second(sinks)
    commit = latency_stats(latencies)
    lag = latency_stats(lags)
    return {
        "sinks": sinks,
        "seconds": seconds,
        "epochs": len(latencies),
        "checkpoint_to_commit": commit,
        "writer_lag": lag,
        "refused_calls": sum(run.refused for run in runs),
        "coordinator_cpu_ms_per_sink_second": coordinator_cpu,
        "database_cpu_ms_per_sink_second": database_cpu,
        "writers_cpu_ms_per_sink_second": writers_cpu,
        "passed": passes(commit, lag),
    }


def passes(commit: dict[str, float], lag: dict[str, float]) -> bool:
    """The step's verdict: epochs in the table within the interval + SLACK_SECONDS, writers on schedule."""
    return bool(
        commit["n"] > 0
        and commit["p99_ms"] <= 1000 * (COMMIT_INTERVAL_SECONDS + SLACK_SECONDS)
        and lag["p99_ms"] < 1000 * BATCH_SECONDS
    )


def ladder(
    postgres: Postgres,
    root: Path,
    shape: str,
    environments: Sequence[dict[str, str]],
    counts: Sequence[int],
    seconds: float,
    every_step: bool = False,
) -> dict[str, Any]:
    """Steps of rising N until one fails (or every step: the CPU cost at each N); the shape's capacity is the last
    N that passed."""
    steps = []
    for sinks in counts:
        print(f"  {shape}: {sinks} sinks ...", flush=True)
        steps.append(step(root, postgres, environments, sinks, seconds))
        if not steps[-1]["passed"] and not every_step:
            break
    return {"shape": shape, "steps": steps, "capacity": capacity(steps)}


def capacity(steps: Sequence[dict[str, Any]]) -> int:
    """The largest N of the steps that passed before the first that failed (a later pass is noise, not capacity)."""
    passed = 0
    for each in steps:
        if not each["passed"]:
            break
        passed = each["sinks"]
    return passed


def model(result: dict[str, Any], cores: int) -> dict[str, float]:
    """What the measured CPU costs say N replicas on one database carry: each replica's cores over the coordinator's
    cost per sink, and the database's cores over its own (the smaller bounds)."""
    last = result["steps"][-1]
    coordinator, database = last["coordinator_cpu_ms_per_sink_second"], last["database_cpu_ms_per_sink_second"]
    return {
        "sinks_per_core_coordinator": 1000 / coordinator,
        "sinks_per_core_database": 1000 / database,
        "cores": cores,
    }


def render(results: dict[str, Any]) -> str:
    interval = results["commit_interval_seconds"]
    lines = [
        "# Capacity (part 16)",
        "",
        f"`{results['command']}`, {results['date']}, {results['machine']['cores']} cores, "
        f"load {results['load_before']:.1f} before the run. "
        f"Each sink: a writer at a {BATCH_SECONDS:.0f} s trigger (a one-file epoch pre-committed and its checkpoint "
        f"reported every second) for {results['seconds']:.0f} s; default commit interval ({interval:.0f} s) and "
        f"concurrency. A step passes when the p99 from CommitCheckpoint to commit is at most "
        f"{interval + SLACK_SECONDS:.0f} s and the writers' p99 lag behind their schedule under "
        f"{BATCH_SECONDS:.0f} s. The writers run in the bench's own process on the same cores.",
        "",
        "| shape | sinks | epochs | checkpoint to commit p50 / p99 s | writer lag p99 s | calls refused "
        "| CPU ms per sink-second: coordinator / PostgreSQL / writers | passed |",
        "| --- | ---: | ---: | --- | --- | ---: | --- | --- |",
    ]
    for shape in results["shapes"]:
        for each in shape["steps"]:
            commit, lag = each["checkpoint_to_commit"], each["writer_lag"]
            lines.append(
                f"| {shape['shape']} | {each['sinks']} | {each['epochs']:,} | {commit['p50_ms'] / 1000:.1f} / "
                f"{commit['p99_ms'] / 1000:.1f} | {lag['p99_ms'] / 1000:.2f} | {each['refused_calls']:,} | "
                f"{each['coordinator_cpu_ms_per_sink_second']:.1f} / {each['database_cpu_ms_per_sink_second']:.1f} / "
                f"{each['writers_cpu_ms_per_sink_second']:.1f} | {'yes' if each['passed'] else 'no'} |"
            )
    lines += ["", "| shape | capacity (sinks) | goal: at least 500 |", "| --- | ---: | --- |"]
    for shape in results["shapes"]:
        lines.append(f"| {shape['shape']} | {shape['capacity']} | {'met' if shape['capacity'] >= 500 else 'not met'} |")
    best = max(results["shapes"], key=lambda shape: shape["capacity"])
    measured = model(best, results["machine"]["cores"])
    lines += [
        "",
        f"Model (from the last step of '{best['shape']}'): one core of coordinator carries "
        f"{measured['sinks_per_core_coordinator']:,.0f} sinks, one core of PostgreSQL "
        f"{measured['sinks_per_core_database']:,.0f}; k replicas of c cores on one database carry about "
        f"min(k x c x {measured['sinks_per_core_coordinator']:,.0f}, database cores x "
        f"{measured['sinks_per_core_database']:,.0f}) sinks.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument("--sinks", default="50,100,200,300,400,500,700", help="the ladder of sink counts")
    parser.add_argument("--seconds", type=float, default=40.0, help="streaming time of each step")
    parser.add_argument("--quick", action="store_true", help="sinks 10,20 for 12 s: checks the bench runs")
    parser.add_argument(
        "--shape",
        action="append",
        choices=list(shapes(cores)),
        help="run only this shape (again for more, in the report's order); default: every shape",
    )
    parser.add_argument("--every-step", action="store_true", help="run every step of the ladder, also after one fails")
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory of capacity.md and .json")
    args = parser.parse_args(argv)
    counts = [10, 20] if args.quick else [int(each) for each in args.sinks.split(",")]
    seconds = 12.0 if args.quick else args.seconds
    root = temp_root()
    postgres = Postgres(root)
    results: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.capacity", *(sys.argv[1:] if argv is None else argv)]),
        "date": time.strftime("%Y-%m-%d"),
        "load_before": os.getloadavg()[0],
        "machine": machine_facts(postgres),
        "seconds": seconds,
        "commit_interval_seconds": COMMIT_INTERVAL_SECONDS,
    }
    try:
        results["shapes"] = [
            ladder(postgres, root, shape, environments, counts, seconds, args.every_step)
            for shape, environments in shapes(cores).items()
            if args.shape is None or shape in args.shape
        ]
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    report = render(results)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "capacity.md").write_text(report)
    (args.output / "capacity.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
