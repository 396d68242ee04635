"""Telling the coordinator which micro-batches Spark has checkpointed (CommitCheckpoint).

Spark runs a batch's sink (the pre-commit), then writes ``commits/N``, then
reports the batch's progress to StreamingQueryListeners, asynchronously. The
listener here only wakes a reporter thread; the reporter reads the highest
committed batch from the checkpoint (the truth, whichever event woke it) and
sends CommitCheckpoint for it. A gRPC call with retries must not run on Spark's
listener bus thread, and a refusal must be able to stop the query, which a
listener callback cannot do safely.

Every report is idempotent on the coordinator, so the same epoch may be reported
from several places: the reporter thread, the start of the next batch (batch
N+1 only starts once ``commits/N`` exists), and the final report after the query
stopped.

A report that fails for a transient reason (the coordinator unreachable longer
than the client's own retries) is sent again by the reporter thread, with
backoff, until it lands, the reporter closes or the coordinator refuses: an idle
query posts no progress event, and its last epoch must not wait for the next
batch (possibly hours) to reach the table.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Final

import grpc
import structlog
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from spark_writer.sink.checkpoint import NO_BATCH, SparkCheckpoint

log = structlog.get_logger(__name__)

# Worth retrying; every other refusal (fenced term, aborted epoch, unknown sink, bad token) means this
# writer must stop.
TRANSIENT_CODES: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# A report that failed transiently is sent again after this wait, doubled (with jitter) up to the maximum,
# until it lands: an idle query sends no other report that could carry it.
REPORT_RETRY_INITIAL_SECONDS: Final = 1.0
REPORT_RETRY_MAX_SECONDS: Final = 30.0


class CheckpointReporter:
    """Reports one query's checkpointed batches to the coordinator, in order, from a daemon thread."""

    def __init__(
        self,
        client: CoordinatorClient,
        sink: str,
        writer_term: int,
        checkpoint: SparkCheckpoint,
        reported_epoch: int,
    ) -> None:
        self._client = client
        self._sink = sink
        self._writer_term = writer_term
        self._checkpoint = checkpoint
        self._reported_epoch = reported_epoch
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._on_refused: Callable[[], None] = lambda: None
        self.refusal: CoordinatorRpcError | None = None
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-reporter-{sink}", daemon=True)
        self._thread.start()

    def on_refused(self, callback: Callable[[], None]) -> None:
        """Called once, from the reporter thread, when the coordinator refuses a checkpoint for good."""
        self._on_refused = callback

    def report(self, epoch: int, *, wait: bool = False) -> None:
        """CommitCheckpoint(epoch) unless it was reported already; with `wait`, until it is in the table.

        Raises the coordinator's refusal, also every time after the first one.
        """
        with self._lock:
            if self.refusal is not None:
                raise self.refusal
            if epoch <= NO_BATCH or (epoch <= self._reported_epoch and not wait):
                return
            try:
                answer = self._client.commit_checkpoint(self._sink, epoch, self._writer_term, wait=wait)
            except CoordinatorRpcError as error:
                if error.code not in TRANSIENT_CODES:
                    self.refusal = error
                raise
            self._reported_epoch = max(self._reported_epoch, epoch)
            log.info(
                "checkpoint reported",
                sink=self._sink,
                epoch=epoch,
                committed_epoch=answer.committed_epoch,
                waited=wait,
            )

    def last_checkpointed(self) -> int:
        """The highest batch in the checkpoint's commit log (NO_BATCH: none)."""
        return self._checkpoint.last_committed_batch()

    def report_checkpointed(self, *, wait: bool = False) -> int:
        """Report the highest batch in the checkpoint's commit log; return it."""
        epoch = self._checkpoint.last_committed_batch()
        self.report(epoch, wait=wait)
        return epoch

    def request(self) -> None:
        """Wake the reporter thread (cheap; safe from a listener callback)."""
        self._wake.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._client.timeout_seconds)

    def _run(self) -> None:
        failures = 0
        while True:
            # After a transient failure, wake up on our own: no progress event comes while the query is idle.
            self._wake.wait(timeout=None if failures == 0 else retry_delay(failures))
            self._wake.clear()
            if self._closing:
                return
            try:
                self.report_checkpointed()
                failures = 0
            except CoordinatorRpcError as error:
                if error.code in TRANSIENT_CODES:
                    failures += 1
                    log.warning(
                        "checkpoint report failed; retrying", sink=self._sink, failures=failures, error=str(error)
                    )
                    continue
                log.error("the coordinator refused a checkpoint; stopping the query", sink=self._sink, error=str(error))
                self._on_refused()
                return
            except Exception as error:  # the reporter thread must survive anything a report throws
                log.exception("checkpoint report failed", sink=self._sink, error=str(error))


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failures in a row: doubling up to the maximum, jittered."""
    base: float = min(REPORT_RETRY_MAX_SECONDS, REPORT_RETRY_INITIAL_SECONDS * 2.0 ** min(failures - 1, 16))
    return base * random.uniform(0.5, 1.0)


class CheckpointListener(StreamingQueryListener):
    """Wakes a query's CheckpointReporter on each of its progress events and on its termination."""

    def __init__(self, reporter: CheckpointReporter) -> None:
        self._reporter = reporter
        self.query_id: str | None = None

    def _ours(self, query_id: object) -> bool:
        return self.query_id is not None and str(query_id) == self.query_id

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 (Spark's API)
        """Nothing: the writer registered before the query started."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802 (Spark's API)
        if self._ours(event.progress.id):
            self._reporter.request()

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802 (Spark's API)
        """Nothing: an idle trigger checkpoints no batch."""

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802 (Spark's API)
        if self._ours(event.id):
            self._reporter.request()
