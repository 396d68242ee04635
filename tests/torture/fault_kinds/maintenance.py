"""Table maintenance killed inside one of its steps: expiration, compaction before or after its commit, the sweep.

The coordinator runs maintenance every 0.5-2 s with low thresholds (a few
snapshots, a few files to compact, a keyed table's delete files merged every
few epochs, a short orphan grace) and the plan's
failpoint armed; when it is the sweep's, files nothing references are planted
first, so that the sweep has work and the kill happens inside it. The check
reads what maintenance did (maintenance_runs) and that the sweep, once back,
deleted the planted files.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import TYPE_CHECKING, Any

from tests.torture.fault_kinds.coordinator import failpoint
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger
from tests.torture.session import RUN_SECONDS

if TYPE_CHECKING:
    import psycopg

    from tests.torture.checks import Findings
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def configure(run: Run, record: FaultRecord) -> None:
    params = record.plan.params
    run.coordinator_env.update(
        SINK_COORDINATOR_MAINTENANCE_INTERVAL_SECONDS=str(params["interval_seconds"]),
        SINK_COORDINATOR_SNAPSHOT_MAX_COUNT=str(params["snapshot_max_count"]),
        SINK_COORDINATOR_COMPACTION_MIN_FILES=str(params["compaction_min_files"]),
        SINK_COORDINATOR_MAINTENANCE_RATE_LIMIT_SECONDS=str(params["rate_limit_seconds"]),
        SINK_COORDINATOR_COMPACTION_DELETE_FILES_MIN=str(params["compaction_delete_files_min"]),
        SINK_COORDINATOR_COMPACTION_DELETED_ROWS_RATIO=str(params["compaction_deleted_rows_ratio"]),
        # The sweep's interval is at least a second (the setting's least; the coordinator refuses to start below it).
        SINK_COORDINATOR_ORPHAN_SWEEP_INTERVAL_SECONDS=str(max(1.0, params["interval_seconds"])),
        SINK_COORDINATOR_ORPHAN_GRACE_SECONDS=str(params["orphan_grace_seconds"]),
    )


def maintenance_kill(run: Run, record: FaultRecord) -> None:
    if record.plan.params.get("failpoint") == "maintenance.during_sweep":
        plant_orphans(run, record)
    failpoint(run, record)


def plant_orphans(run: Run, record: FaultRecord) -> None:
    """Files nothing references, older than the grace, in the table's data directory once it exists: the
    sweep's work, so that the kill inside it happens (a killed task's files would be such orphans)."""
    if not run.board.wait(lambda: run.board.precommits >= 1, RUN_SECONDS):
        return
    data = run.warehouse / "torture" / "orders" / "data"
    data.mkdir(parents=True, exist_ok=True)
    old = time.time() - 3600
    run.orphans = [data / f"orphan-{uuid.uuid4().hex}.parquet" for _ in range(4)]
    for path in run.orphans:
        path.write_bytes(b"PAR1 planted by the torture harness PAR1")
        os.utime(path, (old, old))
    record.detail["orphans_planted"] = len(run.orphans)


def check(run: Run, record: FaultRecord, connection: psycopg.Connection[Any], found: Findings) -> None:
    """What maintenance did, and no planted orphan left once the sweep ran after the kill."""
    row = connection.execute(
        "SELECT count(*), sum(snapshots_expired), sum(expired_files_deleted), sum(files_compacted), "
        "sum(delete_files_merged), sum(orphans_deleted) FROM maintenance_runs"
    ).fetchone()
    names = (
        "maintenance_runs",
        "snapshots_expired",
        "expired_files_deleted",
        "files_compacted",
        "delete_files_merged",
        "orphans",
    )
    record.detail.update(zip(names, (int(v or 0) for v in row or ()), strict=False))
    left = [path.name for path in run.orphans if path.exists()]
    if record.triggered and left:
        found.anomalies.append(f"orphan files the sweep should have deleted are still there: {left}")


MAINTENANCE_FAILPOINTS: tuple[tuple[str, int], ...] = (
    ("maintenance.after_expire", 2),
    ("maintenance.before_compaction_commit", 2),
    ("maintenance.after_compaction_commit", 2),
    ("maintenance.during_sweep", 1),  # only once orphans are older than the grace: killed tasks, compactions
)


def plan_maintenance_kill(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    point, most = rng.choice(MAINTENANCE_FAILPOINTS)
    # A keyed run's position delete files applied by rewrites (small files compacted, files with the ratio of their
    # rows deleted), or, in a third of the runs, gathering until they are merged (nothing small compacted, only a
    # wholly deleted file rewritten).
    merged = rng.random() < 1 / 3
    return {
        "failpoint": point,
        "hit": rng.randint(1, most),
        "downtime_seconds": round(rng.uniform(0, 1), 3),
        "interval_seconds": round(rng.uniform(0.5, 2.0), 3),
        "snapshot_max_count": rng.randint(2, 4),
        "compaction_min_files": 1_000 if merged else rng.randint(2, 4),
        "compaction_delete_files_min": rng.randint(2, 5),
        "compaction_deleted_rows_ratio": 1.0 if merged else rng.choice([0.05, 0.1, 0.3]),
        # Short, so that the sweep finds the files of killed tasks and compactions; a pre-commit of
        # files older than this is refused (the batch runs again).
        "orphan_grace_seconds": round(rng.uniform(5, 15), 3),
        # The runs commits ask for: after every such commit, or deferred past the sink's last run by up to 3 s.
        "rate_limit_seconds": rng.choice([0.0, round(rng.uniform(0.5, 3.0), 3)]),
    }


KINDS = (
    FaultKind(
        "maintenance_kill",
        Trigger.OWN_MOMENT,
        maintenance_kill,
        configure=configure,
        check=check,
        plan=plan_maintenance_kill,
    ),
)
