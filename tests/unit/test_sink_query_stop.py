"""A stop of a running sink query (spark_writer.sink.sink_query.IcebergSinkQuery.stop) lets the batch the sink just
wrote be checkpointed by Spark before Spark's own stop, which would interrupt that write: the order of the calls,
with stand-ins for the query, the sink's function and the checkpoint (no Spark).

Found by the SIGTERM test of the driver (tests/e2e/test_driver_crash.py): SIGTERM after the pre-commit of batch 1,
the sink's function returned, the query was stopped before Spark wrote commits/1, and batch 1 stayed unfinished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pyspark.errors import StreamingQueryException

from spark_writer.sink import sink_query
from spark_writer.sink.sink_query import IcebergSinkQuery


@dataclass
class Checkpoint:
    """Spark's commit log: the batch it holds, written after `writes_after` waits on the query."""

    written: int
    pending: int
    writes_after: int


@dataclass
class Query:
    checkpoint: Checkpoint
    fails_when_waited: bool = False
    waits: int = 0
    checkpointed_at_stop: int | None = None

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802 (Spark's API)
        assert timeout is not None and 0 < timeout <= sink_query.CHECKPOINT_CHECK_SECONDS
        self.waits += 1
        if self.fails_when_waited:
            self.checkpoint.written = self.checkpoint.pending  # Spark checkpoints a batch before the next starts
            raise StreamingQueryException(message="sink orders is stopping; batch 2 is left for the next run")
        if self.waits >= self.checkpoint.writes_after:
            self.checkpoint.written = self.checkpoint.pending
        return False

    def stop(self) -> None:
        self.checkpointed_at_stop = self.checkpoint.written


@dataclass
class Writer:
    last_written: int
    finished: bool = True
    grace: list[float] = field(default_factory=list)

    def stop_between_batches(self, timeout_seconds: float) -> bool:
        self.grace.append(timeout_seconds)
        return self.finished


@dataclass
class Reporter:
    checkpoint: Checkpoint
    refusal: Any = None

    def is_checkpointed(self, batch_id: int) -> bool:
        return self.checkpoint.written >= batch_id

    def report_checkpointed(self, *, wait: bool = False) -> int:
        return self.checkpoint.written

    def close(self) -> None:
        """Nothing to close."""


class Client:
    def close(self) -> None:
        """Nothing to close."""


def running(query: Query, writer: Writer) -> IcebergSinkQuery:
    return IcebergSinkQuery(
        cast(Any, query),
        cast(Any, None),
        cast(Any, writer),
        cast(Any, Reporter(query.checkpoint)),
        cast(Any, Client()),
    )


def test_the_batch_the_sink_wrote_is_checkpointed_before_spark_stops_the_query() -> None:
    query = Query(Checkpoint(written=0, pending=1, writes_after=3))

    assert running(query, Writer(last_written=1)).stop(grace_seconds=5) == 1

    assert query.checkpointed_at_stop == 1
    assert query.waits == 3


def test_a_query_that_ends_as_it_refuses_the_next_batch_is_stopped_at_once() -> None:
    query = Query(Checkpoint(written=0, pending=1, writes_after=99), fails_when_waited=True)

    assert running(query, Writer(last_written=1)).stop(grace_seconds=5) == 1

    assert query.waits == 1


@pytest.mark.parametrize("finished", [True, False])
def test_past_the_grace_spark_stops_the_query_all_the_same(finished: bool) -> None:
    """A batch still running, or one Spark has not checkpointed, when the grace is over: interrupted (it runs
    again at restart)."""
    query = Query(Checkpoint(written=0, pending=1, writes_after=10**9))
    writer = Writer(last_written=1, finished=finished)

    assert running(query, writer).stop(grace_seconds=0.2) == 0

    assert query.checkpointed_at_stop == 0
    assert writer.grace == [0.2]
