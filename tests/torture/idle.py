"""Idle runs: the query stays up after it drained the topic, until the coordinator recorded Spark's last batch.

Some faults need a query that outlives the drain: a checkpoint report that
failed while the coordinator was away must land by itself (outage_then_idle),
records produced while the query starts at `latest` must all be read
(latest_under_load), a topic's second life must be read from its start
(topic_recreated). Such a run's watcher stops the query once the last batch,
the one that reads up to the topic's end, is recorded, and the faults' flags
it awaits (`Run.idle_awaits`) are raised.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any

from coordinator_service.log import precommit_metadata
from tests.torture import checks
from tests.torture.infra import wait_for_change
from tests.torture.session import RUN_SECONDS, SINK

if TYPE_CHECKING:
    import psycopg

    from tests.torture.run import Run


def at_last_batch(run: Run, connection: psycopg.Connection[Any]) -> int | None:
    """The epoch of the Spark sink's batch that reads up to the topic's end, once it is pre-committed."""
    for epoch, metadata in connection.execute(
        "SELECT p.epoch, p.metadata FROM pending_sink_state p JOIN sinks s ON s.id = p.sink_id "
        "WHERE s.name = %s AND p.epoch > %s ORDER BY p.epoch DESC LIMIT 3",
        (SINK, run.batch_without_topic),
    ):
        end = checks.end_offsets(precommit_metadata.decode(bytes(metadata)).properties)
        if end is not None and all(end.get(p, 0) >= o for p, o in run.topic_end.items()):
            return int(epoch)
    return None


def stop_when_recorded(run: Run) -> None:
    """Stop the query once the coordinator recorded Spark's last batch, which read the whole topic.

    The query stays up, idle, until then: a checkpoint report that failed while the
    coordinator was away must land by itself (nothing else would send it).
    """

    def recorded(connection: psycopg.Connection[Any]) -> bool | None:
        if not all(run.board.has(flag) for flag in run.idle_awaits):
            return None
        commits = run.checkpoint / "commits"
        spark_last = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1)
        if spark_last < 0 or at_last_batch(run, connection) != spark_last:
            return None
        row = connection.execute("SELECT checkpointed_epoch FROM sinks WHERE name = %s", (SINK,)).fetchone()
        return True if row is not None and int(row[0]) >= spark_last else None

    started = time.monotonic()
    while not run.board.has("done"):
        if (run.checkpoint / "commits").exists():
            with contextlib.suppress(TimeoutError):  # looked at again after every change, at least every 10 s
                wait_for_change(run.metastore_url, recorded, 10)
                driver = run.driver
                if driver is not None:
                    driver.stop_query()
                run.board.wait(lambda: run.board.has("done"), 30, unless=None)
                continue
        else:  # no batch checkpointed yet: await the next pre-commit
            if run.board.wait(functools.partial(run.board.precommits.__lt__, run.board.precommits), 10):
                continue
        if time.monotonic() - started > RUN_SECONDS:
            run.anomalies.append("idle query: the coordinator never recorded Spark's last batch")
            return
