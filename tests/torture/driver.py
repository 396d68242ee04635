"""The torture runs' Spark driver: a warm driver process that runs the `sink-writer` job once per request.

    python -m tests.torture.driver TIMEOUT RETRY

It starts one local Spark (the JVM start is the slow part), then reads one JSON
request per line on stdin: the job's settings (`mutations`: an upsert stream's
mode and key) and an optional kill point (tests/e2e/driver_process.py's). For
each it runs the job (availableNow: until the topic is drained and the last
batch is committed) and prints
``{"event": "torture query finished", "id": ..., "code": 0|1}``. A fault kills
it with its process group (JVM and Python workers); the harness starts another.
A request with ``"idle": true`` runs the query on a processing-time trigger
instead: it stays up, idle once the topic is drained, until the line
``{"stop": <id>}`` arrives (the harness sends it once the coordinator recorded
the last batch), then stops it between batches.

TIMEOUT is the deadline of one coordinator call (a stalled coordinator fails
the batch after it), RETRY how long UNAVAILABLE is retried (a coordinator
restart must fit in it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sys
import threading
from typing import Any
from unittest import mock

import structlog

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.logs import LogFormat, LogLevel, configure_logging
from spark_writer import job
from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.mutations.modes import MutationMode, Mutations
from spark_writer.worker_logging import set_worker_log_level
from tests.e2e.driver_process import arm

log = structlog.get_logger(__name__)

READY_EVENT = "torture driver ready"
FINISHED_EVENT = "torture query finished"


def shorten_deadlines(timeout_seconds: float, retry_seconds: float) -> None:
    original = CoordinatorClient.__init__

    def init(self: CoordinatorClient, target: str, **options: Any) -> None:
        options.setdefault("timeout_seconds", timeout_seconds)
        options.setdefault("retry_seconds", retry_seconds)
        original(self, target, **options)

    CoordinatorClient.__init__ = init  # type: ignore[method-assign]


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), file=sys.stderr, flush=True)


def run_query(spark: Any, request: dict[str, Any], lines: queue.Queue[str | None], retry_seconds: float) -> int:
    idle = bool(request.get("idle", False))
    kafka = job.KafkaSettings(
        bootstrap_servers=request["bootstrap_servers"],
        topics=(request["topic"],),
        starting_offsets=request.get("starting_offsets", "earliest"),
        max_offsets_per_trigger=request["max_offsets_per_trigger"],
        fail_on_data_loss=bool(request.get("fail_on_data_loss", True)),
    )
    keyed = request.get("mutations")
    parse = job.ParseSettings(
        schema_ddl=request["schema"],
        evolve_schema=False,
        on_bad_record=BadRecordPolicy(request.get("on_bad_record", "fail")),
        dead_letter_topic=request.get("dead_letter_topic"),
        mutations=Mutations() if keyed is None else Mutations(MutationMode(keyed["mode"]), tuple(keyed["key"])),
    )
    sink = job.SinkSettings(
        sink=request["sink"],
        table=request["table"],
        coordinator=request["coordinator"],
        checkpoint_location=request["checkpoint_location"],
        partition_by=tuple(request["partition_by"]),
        available_now=not idle,
        processing_time="500 milliseconds" if idle else None,
        coordinator_retry_seconds=retry_seconds,
    )
    arm(request.get("kill_point", "none"), int(request.get("epoch", 0)))
    try:
        query = job.start_job(spark, kafka, parse, sink)
        if not idle:
            query.await_termination()
            return 0
        return run_until_stopped(query, request["id"], lines)
    except Exception as error:
        log.error("sink writer failed", error=f"{type(error).__name__}: {str(error)[:20000]}")
        return 1
    finally:
        mock.patch.stopall()  # a kill point that was not reached must not kill a later query


def run_until_stopped(query: Any, request_id: int, lines: queue.Queue[str | None]) -> int:
    """Keep the query running (idle once drained) until the harness says stop, or the query ends by itself."""
    ended = threading.Event()

    def await_end() -> None:
        with contextlib.suppress(Exception):  # the failure is raised again by await_termination below
            query.query.awaitTermination()
        ended.set()
        lines.put("")  # wakes the loop below

    threading.Thread(target=await_end, daemon=True).start()
    while not ended.is_set():
        line = lines.get()
        if line is None:  # stdin closed: the harness is gone
            break
        if line and json.loads(line).get("stop") == request_id:
            query.stop()
            return 0
    query.await_termination()  # raises the query's failure (after reporting what it checkpointed)
    return 0


def read_lines(lines: queue.Queue[str | None]) -> None:
    for line in sys.stdin:
        lines.put(line.strip())
    lines.put(None)


def main(argv: list[str]) -> None:
    timeout, retry = argv
    configure_logging(LogLevel.INFO, LogFormat.JSON)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    set_worker_log_level("INFO")
    shorten_deadlines(float(timeout), float(retry))
    spark = job.spark_session("local[2]", app_name="sink-coordinator-torture")
    emit({"event": READY_EVENT})
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=read_lines, args=(lines,), daemon=True).start()
    while (line := lines.get()) is not None:
        if not line:
            continue
        request = json.loads(line)
        if "stop" in request:
            continue  # a stop for a query that already ended
        code = run_query(spark, request, lines, float(retry))
        emit({"event": FINISHED_EVENT, "id": request["id"], "code": code})


if __name__ == "__main__":
    main(sys.argv[1:])
