"""A running ``write_to_iceberg`` query (spark_writer.sink.iceberg_sink): Spark's StreamingQuery, a stop between two
batches, and the last checkpoint report when it ends."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import structlog
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.contract.views import Registration
from spark_writer.sink.checkpoint_reporter import CheckpointReporter

if TYPE_CHECKING:
    from spark_writer.sink.iceberg_sink import MicroBatchWriter

log = structlog.get_logger(__name__)

DEFAULT_STOP_GRACE_SECONDS: Final = 60.0
# While a stop waits for Spark to checkpoint the last batch: how long each wait on the query lasts before the
# commit log is looked at again (the query's end ends the wait at once).
CHECKPOINT_CHECK_SECONDS: Final = 0.05


class SinkRefusedError(RuntimeError):
    """The coordinator refused this writer for good (fenced by a newer writer, epoch aborted, ...)."""


class IcebergSinkQuery:
    """A running ``write_to_iceberg`` query: the StreamingQuery plus the final checkpoint report."""

    def __init__(
        self,
        query: StreamingQuery,
        registration: Registration,
        writer: MicroBatchWriter,
        reporter: CheckpointReporter,
        client: CoordinatorClient,
    ) -> None:
        self._writer = writer
        self.query = query
        self.registration = registration
        self._reporter = reporter
        self._client = client
        self._finished = False

    def await_termination(self, timeout_seconds: int | None = None) -> bool:
        """Wait for the query to end, then finish(); False if it is still running after the timeout.

        Raises StreamingQueryException when the query failed (after reporting the
        batches it did checkpoint), and SinkRefusedError when the coordinator
        refused the writer.
        """
        try:
            ended = self.query.awaitTermination(timeout_seconds)
        except StreamingQueryException:
            self._finish_after_failure()
            raise
        if ended is False:
            return False
        self.finish()
        return True

    def stop(self, grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS) -> int:
        """Stop the query between two batches, then finish(); return the last checkpointed (and committed) batch.

        A running batch gets `grace_seconds` to finish, its Spark checkpoint included: Spark
        writes commits/N after the sink's function returns, and its own stop would interrupt
        that write. Past the grace Spark's stop interrupts the batch, which is safe (it runs
        again at restart) but leaves the files it wrote so far behind, outside the table.
        """
        deadline = time.monotonic() + grace_seconds
        if not self._writer.stop_between_batches(grace_seconds):
            log.warning("the running batch did not finish in time; interrupting it", grace_seconds=grace_seconds)
        elif not self._await_checkpoint(self._writer.last_written, deadline):
            log.warning(
                "spark did not checkpoint the last batch in time; interrupting it",
                batch=self._writer.last_written,
                grace_seconds=grace_seconds,
            )
        self.query.stop()
        return self.finish()

    def _await_checkpoint(self, batch_id: int, deadline: float) -> bool:
        """Wait until Spark's commit log holds `batch_id`, or the query ended; False if the deadline came first."""
        while not self._reporter.is_checkpointed(batch_id):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                # Seconds as a float: PySpark waits int(timeout * 1000) ms, whatever its annotation says.
                if self.query.awaitTermination(min(remaining, CHECKPOINT_CHECK_SECONDS)):  # type: ignore[arg-type]
                    return True
            except StreamingQueryException:
                # The next batch refused to start (the sink is stopping): Spark had checkpointed this one first.
                return True
        return True

    def finish(self, *, wait_for_commit: bool = True) -> int:
        """After the query ended: report Spark's last checkpointed batch to the coordinator and return it.

        With `wait_for_commit` this returns once every checkpointed batch is in the table.
        """
        try:
            if self._reporter.refusal is not None:
                raise SinkRefusedError(f"the coordinator refused the writer: {self._reporter.refusal}")
            return self._reporter.report_checkpointed(wait=wait_for_commit)
        finally:
            self._release()

    def _finish_after_failure(self) -> None:
        try:
            self.finish()
        except Exception as error:  # the query's own failure is the error to raise
            log.warning("final checkpoint report failed", error=str(error))

    def _release(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._reporter.close()
        self._client.close()
