"""Kafka records the job cannot read as produced: deleted by retention before a re-run, or not fitting the schema.

retention_before_rerun: the job's first start dies right after PreCommit(N)
(a kill point); part of batch N's records are deleted before the supervisor
starts it again. The re-run must fail with the data-loss error and keep the
aborted attempt's files; the documented remedy (failOnDataLoss=false) then
skips exactly the deleted records.

bad_records: records that do not fit the schema sit between the good ones,
under the job's policy: `fail` (the job fails naming a bad record's position,
then runs again under another policy), `null` (a row of what could be read) or
`dead-letter` (each in the dead-letter topic once). Either way each is counted
once in the committed epochs' properties. The Kafka clients behind both are in
tests/torture/kafka_faults.py.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from coordinator_service.log import precommit_metadata
from coordinator_service.log.database import libpq_url
from spark_writer.formats.record_decoding import BAD_RECORDS_PROPERTY
from tests.fixtures.kafka_broker import create_topic
from tests.torture import checks, kafka_faults
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.session import SINK

if TYPE_CHECKING:
    from tests.fixtures.kafka_broker import ProducedRecord
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def retention_first_job(run: Run, record: FaultRecord) -> int | None:
    """The job's first start, killed right after PreCommit(N); then retention, before the supervisor's re-run."""
    code = run.run_job("after-precommit", record.plan.params["epoch"])
    if code == -signal.SIGKILL:
        retention(run, record)
    return code


def retention(run: Run, record: FaultRecord) -> None:
    """The driver died after PreCommit(N): delete part of batch N's records before the job runs again."""
    epoch = int(record.plan.params["epoch"])
    with psycopg.connect(libpq_url(run.metastore_url), autocommit=True) as connection:
        rows: dict[int, bytes] = dict(
            connection.execute(
                "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
                "WHERE s.name = %s AND p.epoch IN (%s, %s)",
                (SINK, epoch - 1, epoch),
            ).fetchall()
        )
    if epoch not in rows:
        record.detail["skipped"] = "the driver died before the batch's pre-commit"
        return
    properties = precommit_metadata.decode(bytes(rows[epoch])).properties
    end = checks.end_offsets(properties) or {}
    start = checks.start_offsets(properties)
    if start is None:
        start = checks.end_offsets(precommit_metadata.decode(bytes(rows[epoch - 1])).properties) or {}
    begin(record)
    cuts = kafka_faults.delete_before(run.session.bootstrap, run.topic, start, end, record.plan.params["fraction"])
    run.lost_by_retention = {
        key for (p, o), key in run.positions.items() if p in cuts and start.get(p, 0) <= o < cuts[p]
    }
    run.retention_files = precommit_metadata.decode(bytes(rows[epoch])).paths
    record.detail.update(epoch=epoch, cuts=cuts, deleted=len(run.lost_by_retention))
    record.ended_at = time.time()


def after_retention(run: Run, record: FaultRecord, error: str) -> bool:
    """The re-run's data-loss failure, the aborted attempt's files kept for it; then failOnDataLoss=false."""
    if not record.triggered or not run.fail_on_data_loss:
        return False
    if "failOnDataLoss" not in error:
        run.anomalies.append(f"after retention the job failed without the data-loss error: {error[:300]}")
    cause = abort_cause(run, int(record.detail["epoch"]))
    if cause == "OPERATOR":  # a forced abort gives up the attempt: its files may go at once
        record.detail["aborted_by"] = cause
    else:
        kept = [path for path in run.retention_files if Path(path.removeprefix("file://")).exists()]
        record.detail["files_kept"] = f"{len(kept)}/{len(run.retention_files)}"
        if len(kept) != len(run.retention_files):
            run.anomalies.append("the files of the epoch aborted by recovery were deleted before its re-run")
    run.fail_on_data_loss = False  # the documented remedy: skip what is gone
    return True


def abort_cause(run: Run, epoch: int) -> str | None:
    with psycopg.connect(libpq_url(run.metastore_url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT p.abort_cause::text FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
            "WHERE s.name = %s AND p.epoch = %s",
            (SINK, epoch),
        ).fetchone()
    return None if row is None else row[0]


def configure_bad(run: Run, record: FaultRecord) -> None:
    run.on_bad_record = record.plan.params["policy"]


def produce_with_bad(run: Run, record: FaultRecord) -> list[ProducedRecord]:
    """The run's orders in two halves with the bad records between them, and the dead-letter topic."""
    params = record.plan.params
    made = kafka_faults.bad_records(random.Random(params["seed"]), params["count"], run.first_key + 5000)
    records, run.bad_positions = kafka_faults.produce_with_bad(
        run.produce, run.session.bootstrap, run.topic, run.produced_keys, run.partitions, made
    )
    create_topic(run.session.bootstrap, 1, name=run.dead_letter_topic)
    record.triggered = True
    return records


def after_bad(run: Run, record: FaultRecord, error: str) -> bool:
    """Under `fail`, the job's failure names a bad record's position; then the plan's other policy."""
    if run.on_bad_record != "fail" or "does not fit the JSON schema" not in error:
        return False
    record.detail["failed_with"] = error[:200]
    positions = {f"partition {p} offset {o}" for p, o in run.bad_positions}
    if not any(position in error for position in positions):
        run.anomalies.append(f"the bad-record failure names no bad record's position: {error[:300]}")
    run.on_bad_record = record.plan.params["then"]  # the documented remedy: another policy
    return True


def unread_bad_records(run: Run, record: FaultRecord, connection: psycopg.Connection[Any]) -> None:
    """With startingOffsets=latest, bad records produced before the resolved start are never read."""
    if "latest_under_load" not in run.records_of or not run.bad_positions:
        return
    row = connection.execute(
        "SELECT metadata FROM torture_epoch_audit WHERE epoch = 0 AND generation = 0 AND op <> 'DELETE' "
        "AND sink_id = (SELECT id FROM sinks WHERE name = %s) ORDER BY id LIMIT 1",
        (SINK,),
    ).fetchone()
    start = checks.start_offsets(precommit_metadata.decode(bytes(row[0])).properties) if row else None
    if start is None:
        return
    run.bad_positions = {(p, o): bad for (p, o), bad in run.bad_positions.items() if o >= start.get(p, 0)}
    if not run.bad_positions:
        record.triggered = False
        record.detail["skipped"] = "startingOffsets=latest resolved after the bad records"


def check_bad_records(
    run: Run, record: FaultRecord, connection: psycopg.Connection[Any], found: checks.Findings
) -> None:
    """Every bad record counted once in the committed epochs' properties, and where its policy sends it."""
    if not run.bad_positions:
        return
    anomalies = found.anomalies
    if run.on_bad_record == "fail":
        anomalies.append("records that do not fit the schema under `fail`, and the job never failed on them")
    counted = 0
    for metadata, status in connection.execute(
        "SELECT DISTINCT ON (generation, epoch) metadata, status FROM torture_epoch_audit "
        "WHERE op <> 'DELETE' AND sink_id = (SELECT id FROM sinks WHERE name = %s) "
        "ORDER BY generation, epoch, id DESC",
        (SINK,),
    ):
        if status == "COMMITTED":
            counted += int(precommit_metadata.decode(bytes(metadata)).properties.get(BAD_RECORDS_PROPERTY, "0"))
    record.detail.update(final_policy=run.on_bad_record, bad=len(run.bad_positions), counted=counted)
    if counted != len(run.bad_positions):
        anomalies.append(f"{counted} bad records counted in the committed epochs, {len(run.bad_positions)} produced")
    if run.on_bad_record == "dead-letter":
        letters = kafka_faults.dead_letters(run.session.bootstrap, run.dead_letter_topic)
        record.detail["dead_letters"] = sum(letters.values())
        if set(letters) != set(run.bad_positions):
            held, bad = sorted(letters), sorted(run.bad_positions)
            anomalies.append(f"the dead-letter topic holds {held}, the bad records were at {bad}")


def plan_retention(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"epoch": rng.randint(0, max(0, shape.batches - 2)), "fraction": round(rng.uniform(0.1, 1.0), 3)}


def plan_bad_records(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    # A keyed stream refuses `null`: a record that does not fit would leave a row without its key.
    policies = ("fail", "dead-letter") if shape.keyed else ("fail", "null", "dead-letter")
    policy = rng.choice(policies)
    return {
        "policy": policy,
        "then": rng.choice(policies[1:]) if policy == "fail" else policy,
        "count": rng.randint(3, 10),
        "seed": rng.randrange(2**31),
    }


KINDS = (
    FaultKind(
        "retention_before_rerun",
        Trigger.SUPERVISOR,
        first_job=retention_first_job,
        after_failure=after_retention,
        plan=plan_retention,
    ),
    FaultKind(
        "bad_records",
        Trigger.SUPERVISOR,
        configure=configure_bad,
        prepare=produce_with_bad,
        after_failure=after_bad,
        before_check=unread_bad_records,
        check=check_bad_records,
        plan=plan_bad_records,
    ),
)
