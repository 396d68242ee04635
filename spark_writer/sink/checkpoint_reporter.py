"""Telling the coordinator which micro-batches Spark has checkpointed (CommitCheckpoint).

Spark runs a batch's sink (the pre-commit), then writes ``commits/N``. The sink's
function tells the reporter when it returned from batch N (``written``); the
reporter's thread then looks for ``commits/N`` in the checkpoint (the truth),
soon and then less often, and sends CommitCheckpoint(N) once it is there. A gRPC
call with retries must not run on the thread that runs Spark's batches, and a
refusal must be able to stop the query.

Not a StreamingQueryListener: PySpark builds every progress event of every query
in Python from the JVM's objects, call by call over py4j, and one listener cost
the driver about 0.2 s of JVM CPU and 0.1 s of Python CPU per batch
(bench/results/latest.md, optimisation 27), for a wake-up.

Every report is idempotent on the coordinator, so the same epoch may be reported
from several places: the reporter thread, the start of the next batch (batch
N+1 only starts once ``commits/N`` exists), and the final report after the query
stopped.

A report that fails for a transient reason (the coordinator unreachable longer
than the client's own retries) is sent again by the reporter thread, with
backoff, until it lands, the reporter closes or the coordinator refuses: an idle
query runs no other batch, and its last epoch must not wait for the next one
(possibly hours) to reach the table.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Final

import grpc
import structlog

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
# Spark writes commits/N just after the sink's function returned from batch N: the reporter looks for it after this
# wait, doubled up to the maximum, until it is there (or the next batch's start reported N first).
COMMIT_LOOK_INITIAL_SECONDS: Final = 0.02
COMMIT_LOOK_MAX_SECONDS: Final = 1.0


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
        self._written = reported_epoch  # the last batch the sink's function returned from
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

    def is_checkpointed(self, batch_id: int) -> bool:
        """Whether Spark's commit log holds batch `batch_id` (NO_BATCH: always)."""
        return batch_id <= NO_BATCH or self._checkpoint.is_committed(batch_id)

    def report_checkpointed(self, *, wait: bool = False) -> int:
        """Report the highest batch in the checkpoint's commit log; return it."""
        epoch = self._checkpoint.last_committed_batch()
        self.report(epoch, wait=wait)
        return epoch

    def written(self, batch_id: int) -> None:
        """The sink's function returned from batch `batch_id`: Spark writes its commits/N next (cheap; from the
        thread that runs the batches)."""
        self._written = max(self._written, batch_id)
        self._wake.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._client.timeout_seconds)

    def _run(self) -> None:
        failures = 0
        looks = 0
        timeout: float | None = None
        while True:
            # Woken by a batch written; on its own to look for the commit log again, or to retry a failed report
            # (an idle query writes no other batch).
            self._wake.wait(timeout=timeout)
            self._wake.clear()
            if self._closing:
                return
            epoch = self._written
            if epoch <= self._reported_epoch and failures == 0:
                looks, timeout = 0, None
                continue
            try:
                if not self._checkpoint.is_committed(epoch):
                    looks += 1
                    timeout = commit_look_delay(looks)
                    continue
                self.report(epoch)
                failures, looks, timeout = 0, 0, None
            except CoordinatorRpcError as error:
                if error.code in TRANSIENT_CODES:
                    failures += 1
                    timeout = retry_delay(failures)
                    log.warning(
                        "checkpoint report failed; retrying", sink=self._sink, failures=failures, error=str(error)
                    )
                    continue
                log.error("the coordinator refused a checkpoint; stopping the query", sink=self._sink, error=str(error))
                self._on_refused()
                return
            except Exception as error:  # the reporter thread must survive anything a report throws
                log.exception("checkpoint report failed", sink=self._sink, error=str(error))
                failures, looks, timeout = 0, 0, None


def commit_look_delay(looks: int) -> float:
    """Seconds before looking for a batch's commit log again after `looks` looks: doubling up to the maximum."""
    return doubled(COMMIT_LOOK_INITIAL_SECONDS, COMMIT_LOOK_MAX_SECONDS, looks)


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failures in a row: doubling up to the maximum, jittered."""
    return doubled(REPORT_RETRY_INITIAL_SECONDS, REPORT_RETRY_MAX_SECONDS, failures) * random.uniform(0.5, 1.0)


def doubled(initial: float, maximum: float, times: int) -> float:
    """`initial` doubled for each of `times` - 1 times, at most `maximum`."""
    return float(min(maximum, initial * 2.0 ** min(times - 1, 16)))
