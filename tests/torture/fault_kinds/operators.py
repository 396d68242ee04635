"""An operator through the admin API: an abort of the newest PENDING epoch (with force or without), a reset.

The reset is docs/operations.md's procedure for a lost Spark checkpoint,
exactly: the writer stopped, the sink reset, and a new query in a new
checkpoint location from the last committed epoch's offsets. The run records
where each generation's query started, which the checks read.
"""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING, Any

from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.infra import wait_for_change
from tests.torture.session import SINK

if TYPE_CHECKING:
    import psycopg

    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def operator_abort(run: Run, record: FaultRecord) -> None:
    force = bool(record.plan.params["force"])

    def newest_pending(connection: psycopg.Connection[Any]) -> int | None:
        row = connection.execute(
            "SELECT max(p.epoch) FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
            "WHERE s.name = %s AND p.status = 'PENDING'",
            (SINK,),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    try:  # the next PENDING epoch (with no commit interval, an epoch is PENDING for a moment only)
        epoch = wait_for_change(run.metastore_url, newest_pending, 20)
    except TimeoutError:
        record.detail["skipped"] = "no PENDING epoch in 20 s"
        return
    begin(record)
    answer = run.operator.abort(SINK, epoch, force=force)
    body = answer.json()
    record.detail.update(epoch=epoch, force=force, status=answer.status_code)
    if answer.status_code == 200:
        record.detail["changed"] = body["changed"]
        if body["changed"] and not force:
            run.anomalies.append(f"operator abort of PENDING epoch {epoch} without force answered {body}")
    elif answer.status_code == 409:
        record.detail["message"] = body["error"]["message"][:200]
        if force and "COMMITTED" not in body["error"]["message"] and "committed" not in body["error"]["message"]:
            run.anomalies.append(f"forced abort of epoch {epoch} refused: {body}")
    else:
        run.anomalies.append(f"operator abort of epoch {epoch} answered {answer.status_code}: {answer.text[:300]}")
    record.ended_at = time.time()


def operator_reset(run: Run, record: FaultRecord) -> None:
    """docs/operations.md's procedure for a lost checkpoint, exactly once: stop, reset, restart from offsets."""
    begin(record)
    run.board.set("up", False)
    if run.driver is not None and run.driver.alive:
        run.driver.kill()  # 1. the writer stops (the reset would fence it anyway)
    answer = run.operator.reset(SINK)  # 2.
    sink = answer["sink"]
    generation, committed = int(sink["generation"]), int(sink["committed_epoch"])
    # 3. before a writer registers: where the last committed epoch ended (or, with none committed in this
    # generation, where its query started)
    if committed >= 0:
        entry = json.loads(run.operator.epoch(SINK, committed)["properties"]["spark.end_offsets"])[0]
        start = {int(partition): int(offset) for partition, offset in entry[run.topic].items()}
        run.starting_offsets = json.dumps(entry)  # the entry as it is (batch 0's holds "$start" too)
    else:
        start = run.starts.get(generation - 1, {})
        run.starting_offsets = json.dumps({run.topic: {str(p): o for p, o in start.items()}}) if start else "earliest"
    run.starts[generation] = start
    run.checkpoint = run.work / f"checkpoint-{generation}"  # 4. a new, empty checkpoint location
    record.detail.update(committed_epoch=committed, aborted=answer["aborted_epochs"], generation=generation)
    record.ended_at = time.time()
    run.board.set("up")


def plan_abort(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"force": rng.random() < 0.7}


KINDS = (
    FaultKind("operator_abort", Trigger.AT_BATCH, operator_abort, plan=plan_abort),
    FaultKind("operator_reset", Trigger.AT_BATCH, operator_reset),
)
