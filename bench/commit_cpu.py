"""A one-file commit's CPU: the committer's Iceberg part of a commit pass, on a table of a given age (issue 32).

`python -m bench.commit_cpu` (prints; writes nothing). On the SQL catalog in a real PostgreSQL, opened as the
coordinator opens it (runtime.open_catalog), a table takes --snapshots one-file commits untimed (a table's age:
maintenance keeps up to 500 snapshots by default), then --commits more are timed by this process's CPU clock
(pyiceberg writes and merges manifests in threads of its own; the database's CPU does not count): the table as the
committer holds it (the metadata cache), the walk of the sink's markers, the append with the maintenance properties
(manifests merged at the default count). Each file is read and described before its commit, untimed (the
pre-commit's part). --profile prints cProfile's top functions of the timed commits (of this thread).

--compact-every K: a compaction as the maintenance step runs it after every K commits (the default policy's plan,
its files written untimed), and the CPU of its `replace` commit timed apart (the capacity bench's shape: a commit of
ten one-file epochs is followed by a compaction).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import time
import uuid
from collections.abc import Sequence

from sqlalchemy.engine import make_url

from bench.infra import ORDERS, Postgres, temp_root, write_orders_file
from coordinator_service.contract.markers import SinkIdentity
from coordinator_service.engine.maintenance_steps.compaction import policy_plan
from coordinator_service.runtime import open_catalog
from coordinator_service.settings import Settings
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.tables import compaction_plans as cp
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.iceberg import IcebergGateway

TABLE = "bench.commit_cpu"
MERGE_MIN_COUNT: int = Settings.model_fields["manifest_merge_min_count"].default


def commit_cpu_ms(
    database_url: str,
    warehouse: str,
    snapshots: int,
    commits: int,
    profile: cProfile.Profile | None,
    compact_every: int | None = None,
    compactions: list[float] | None = None,
) -> list[float]:
    """The CPU milliseconds of each timed commit (and of each timed compaction's commit, into `compactions`)."""
    settings = Settings(catalog={"type": "sql", "uri": database_url, "warehouse": warehouse})
    catalog = open_catalog(settings, make_url(database_url))
    tables = IcebergGateway(catalog, cache_seconds=3600.0)
    location = tables.ensure_table(TABLE, ORDERS, ())
    sink = SinkIdentity(name="commit-cpu", incarnation=str(uuid.uuid4()), generation=0)
    properties = tm.table_properties_for(MERGE_MIN_COUNT)
    timed: list[float] = []
    for epoch in range(snapshots + commits):
        uri = write_orders_file(location, 1, first=epoch)
        entries = tables.read_data_files(TABLE, [uri], 0, False).entries
        measured = epoch >= snapshots
        if measured and profile is not None:
            profile.enable()
        started = time.process_time()
        table, _ = tables.cached(TABLE)
        tables.sink_markers(TABLE, sink, epoch, table)
        tables.append(TABLE, sink, epoch, uuid.uuid4().hex, entries, table, properties)
        spent = time.process_time() - started
        if measured and profile is not None:
            profile.disable()
        if measured:
            timed.append(1000 * spent)
        if compact_every is not None and (epoch + 1) % compact_every == 0:
            compaction = _compaction_cpu_seconds(tables)
            if measured and compaction is not None and compactions is not None:
                compactions.append(1000 * compaction)
    return timed


def _compaction_cpu_seconds(tables: IcebergGateway) -> float | None:
    """A compaction of the table at the default policy, its files written untimed; the CPU seconds of its commit (None
    when the plan merges nothing)."""
    table, _ = tables.cached(TABLE)
    policy = MaintenancePolicy()
    plan = policy_plan(table, cp.compaction_input(table), policy, set())
    if not plan:
        return None
    rewrite = cp.write_compacted(table, plan, policy.compaction_target_file_bytes)
    started = time.process_time()
    committed = cp.commit_compaction(table, rewrite)
    spent = time.process_time() - started
    tables.remember(TABLE, committed)
    return spent


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_cpu", description=__doc__)
    parser.add_argument("--snapshots", type=positive, default=450, help="untimed commits first (the table's age)")
    parser.add_argument("--commits", type=positive, default=50, help="timed commits")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions of the timed commits")
    parser.add_argument(
        "--compact-every", type=positive, default=None, help="a compaction after every K commits, its commit timed"
    )
    args = parser.parse_args(argv)
    root = temp_root()
    postgres = Postgres(root)
    profile = cProfile.Profile() if args.profile else None
    compactions: list[float] = []
    try:
        timed = commit_cpu_ms(
            postgres.new_database("commit_cpu"),
            (root / "warehouse").as_uri(),
            args.snapshots,
            args.commits,
            profile,
            args.compact_every,
            compactions,
        )
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    timed.sort()
    print(
        f"{args.commits} one-file commits on a table of {args.snapshots} to {args.snapshots + args.commits} "
        f"snapshots: CPU ms per commit mean {sum(timed) / len(timed):.2f}, p50 {timed[len(timed) // 2]:.2f}, "
        f"max {timed[-1]:.2f}"
    )
    if compactions:
        compactions.sort()
        print(
            f"{len(compactions)} compactions (after every {args.compact_every} commits): CPU ms per compaction commit "
            f"mean {sum(compactions) / len(compactions):.2f}, p50 {compactions[len(compactions) // 2]:.2f}, "
            f"max {compactions[-1]:.2f}"
        )
    if profile is not None:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(15)
        stats.sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
