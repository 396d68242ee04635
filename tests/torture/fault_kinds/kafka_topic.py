"""The Kafka topic's life: the broker restarted mid-read, a producer under load at `latest`, the topic recreated.

broker_restart: the broker stopped and started again on its port with its
data. latest_under_load: the query starts at `latest` while a producer writes;
it stays up until all it should read is in the table. topic_recreated: the
topic deleted under the running query (the data-loss error, then with
failOnDataLoss=false a batch without it), created again with 1-4 partitions
and a second life of records, which the query must read from its start.

A broker may lose records it acknowledged over a restart; `settle_topic` reads
the topic back and holds the table to what the broker keeps.
"""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING, Any

import psycopg

from coordinator_service.log import precommit_metadata
from tests.fixtures.kafka_broker import create_topic
from tests.torture import checks, kafka_faults
from tests.torture.fault_kinds.kind import FaultKind, RunShape, Trigger, begin
from tests.torture.infra import wait_for_change
from tests.torture.session import RUN_SECONDS, SINK

if TYPE_CHECKING:
    from tests.torture.faults import FaultRecord
    from tests.torture.run import Run


def broker_restart(run: Run, record: FaultRecord) -> None:
    begin(record)
    run.board.set("up", False)
    if not run.session.restart_broker(record.plan.params["downtime_seconds"]):
        record.triggered = False
        record.detail["skipped"] = "an external broker (KAFKA_BOOTSTRAP_SERVERS) cannot be restarted"
    record.ended_at = time.time()
    run.board.set("up")
    settle_topic(run)


def settle_topic(run: Run) -> None:
    """After a broker restart, expect what the broker holds: a broker may lose records it acknowledged.

    noida-db did once, over a restart while a producer wrote: it gave 99 later records offsets it had
    already acknowledged for others, so the topic ended below what the producer was told and the job
    (rightly) never read those records. That is the broker's fault, not the pipeline's: it is noted,
    and the table is checked against the records the broker really holds. Called when the restart and
    the load producer are both over, by whichever of their threads ends last.
    """
    restart = run.records_of.get("broker_restart")
    if restart is None or not restart.triggered or restart.ended_at is None:
        return
    if run.load is not None and not run.load.done.is_set():
        return
    with run.lock:
        starts = kafka_faults.log_starts(run.session.bootstrap, run.topic)
        held = run.held_labels()
        lost = kafka_faults.lost_by_broker(run.acknowledged, held, starts)
        restart.detail["broker_lost"] = len(lost)
        if not lost:
            return
        run.notes.append(f"the broker lost {len(lost)} records it had acknowledged, over its restart")
        good = {r.key for r in run.acknowledged}
        run.positions = {
            position: int(key) for position, key in held.items() if key in good and position not in run.bad_positions
        }
        run.update_topic_end()


def configure_latest(run: Run, record: FaultRecord) -> None:
    run.starting_offsets = "latest"
    run.from_first_start = True  # the checks expect the records from the first query's resolved start
    run.idle = True
    run.idle_awaits.add("produced")


def plan_load(run: Run, record: FaultRecord) -> None:
    params = record.plan.params
    run.load = kafka_faults.LoadProducer(
        run.produce,
        list(range(run.first_key + 6000, run.first_key + 6000 + params["records"])),
        params["per_second"],
    )


def start_load(run: Run, record: FaultRecord) -> None:
    """The producer starts while the job resolves its start, after the plan's delay."""
    assert run.load is not None
    run.board.wait(lambda: bool(run.board.terms), RUN_SECONDS)
    run.board.wait(lambda: False, record.plan.params["delay_seconds"])
    begin(record)
    run.load.start().join()
    with run.lock:
        run.acknowledged = [*run.acknowledged, *run.load.produced]
        run.positions.update(kafka_faults.positions(run.load.produced))
        run.update_topic_end()
    settle_topic(run)
    record.ended_at = time.time()
    run.board.set("produced")


def load_failed(run: Run, record: FaultRecord) -> None:
    if run.load is not None and run.load.error is not None:
        run.anomalies.append(f"the load producer failed: {run.load.error}")


def configure_recreated(run: Run, record: FaultRecord) -> None:
    run.idle = True
    run.idle_awaits.add("recreated")


def topic_recreated(run: Run, record: FaultRecord) -> None:
    """Delete the topic under the running query, await the data-loss failure and a batch without it, then
    create it again and produce its second life, which the query must read from its start."""
    try:
        with run.lock:
            if run.board.has("done"):
                return
            begin(record)
            read = spark_committed_end(run)  # what the job read for sure before the deletion
            kafka_faults.delete_topic(run.session.bootstrap, run.topic)
        run.lost_with_topic = {key for (p, o), key in run.positions.items() if o >= read.get(p, 0)}
        record.detail.update(unread_when_deleted=len(run.lost_with_topic))
        try:
            epoch = wait_for_change(run.metastore_url, lambda c: batch_without_topic(run, c), RUN_SECONDS)
        except TimeoutError:
            run.anomalies.append("no batch ran without the deleted topic (failOnDataLoss=false)")
            return
        with run.lock:
            run.batch_without_topic = epoch
            partitions = int(record.plan.params["partitions"])
            create_topic(run.session.bootstrap, partitions, name=run.topic)
            first_key = run.first_key + 8000
            keys = range(first_key, first_key + int(record.plan.params["records"]))
            run.second_life = kafka_faults.positions(run.produce(keys, partitions))
            run.update_topic_end()
            record.detail.update(batch_without_topic=epoch, second_life=len(run.second_life))
            record.ended_at = time.time()
    finally:
        run.board.set("recreated")


def spark_committed_end(run: Run) -> dict[int, int]:
    """End offsets of the last batch Spark committed (what its sink was handed before now)."""
    commits = run.checkpoint / "commits"
    batches = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.exists() else []
    if not batches:
        return {}
    last_line = (run.checkpoint / "offsets" / str(max(batches))).read_text().strip().splitlines()[-1]
    return checks.partitions_of(json.loads(last_line))


def batch_without_topic(run: Run, connection: psycopg.Connection[Any]) -> int | None:
    """A batch planned without the deleted topic, once the coordinator recorded its checkpoint."""
    row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
    checkpointed = -1 if row is None else int(row[0])
    for epoch, metadata in connection.execute(
        "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
        "WHERE s.name = %s AND p.epoch <= %s ORDER BY p.epoch DESC LIMIT 1",
        (SINK, checkpointed),
    ):
        end = checks.end_offsets(precommit_metadata.decode(bytes(metadata)).properties)
        if end == {}:
            return int(epoch)
    return None


def after_recreated(run: Run, record: FaultRecord, error: str) -> bool:
    """The query's data-loss failure once its topic was deleted; then failOnDataLoss=false."""
    if not record.triggered or not run.fail_on_data_loss:
        return False
    if "failOnDataLoss" not in error:
        run.anomalies.append(f"after its topic was deleted the job failed without the data-loss error: {error[:300]}")
    record.detail["failed_with"] = error[:200]
    run.fail_on_data_loss = False  # the documented remedy: go on without what is gone
    return True


def plan_broker_restart(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"downtime_seconds": round(rng.uniform(0.5, 5.0), 3)}


def plan_latest(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {
        "records": rng.randint(200, 800),
        "per_second": rng.choice((50, 200, 1000)),
        "delay_seconds": round(rng.uniform(0, 3), 3),
    }


def plan_recreated(rng: random.Random, shape: RunShape) -> dict[str, Any]:
    return {"records": rng.randint(50, 300), "partitions": rng.randint(1, 4)}


KINDS = (
    FaultKind("broker_restart", Trigger.AT_BATCH, broker_restart, plan=plan_broker_restart),
    FaultKind(
        "latest_under_load",
        Trigger.OWN_MOMENT,
        start_load,
        configure=configure_latest,
        prepare=plan_load,
        after_drive=load_failed,
        plan=plan_latest,
    ),
    FaultKind(
        "topic_recreated",
        Trigger.AT_BATCH,
        topic_recreated,
        locked=False,  # awaits the job's failure and re-run
        configure=configure_recreated,
        after_failure=after_recreated,
        plan=plan_recreated,
        # Faults whose checks assume one life of the topic, or the failOnDataLoss remedy of their own.
        excludes=frozenset(
            {
                "operator_abort",
                "operator_reset",
                "retention_before_rerun",
                "bad_records",
                "latest_under_load",
                "broker_restart",
                "outage_then_idle",
            }
        ),
    ),
)
