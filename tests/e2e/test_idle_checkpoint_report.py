"""A checkpoint report that failed while the coordinator was away lands once it is back, with the query idle.

The coordinator is killed right after it answered batch 0's pre-commit, so the
report of batch 0 fails after the writer's client gave up retrying. No other
batch comes (the topic is drained): the reporter must keep sending the report on
its own, and it lands once a new coordinator process serves. One wake-up comes
from elsewhere (the sink's function returned from batch 0), so a third failed
attempt shows that the reporter retries by itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.contract.views import CheckpointResult, PreCommitResult
from spark_writer.sink.iceberg_sink import write_to_iceberg
from tests.fixtures.coordinator import CoordinatorProcess
from tests.fixtures.pipeline import kafka_positions, order_stream, produce_orders, produced_positions
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
Factory = Callable[..., CoordinatorProcess]
WAIT_SECONDS = 120
RETRIES_SEEN = 3


@pytest.fixture
def successor() -> Iterator[list[CoordinatorProcess]]:
    started: list[CoordinatorProcess] = []
    yield started
    for process in started:
        process.stop()


def test_failed_report_lands_while_the_query_is_idle(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    successor: list[CoordinatorProcess],
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=2)
    produced = produce_orders(kafka_bootstrap, topic, range(200), partitions=2)
    failed_reports: list[int] = []
    reports = threading.Condition()
    report_landed = threading.Event()
    pre_commit, commit_checkpoint = CoordinatorClient.pre_commit, CoordinatorClient.commit_checkpoint

    def pre_commit_then_kill(client: CoordinatorClient, sink: str, epoch: int, *a: Any, **k: Any) -> PreCommitResult:
        answer = pre_commit(client, sink, epoch, *a, **k)
        coordinator.kill()  # answered, then gone before Spark's checkpoint is reported
        return answer

    def observed_report(client: CoordinatorClient, sink: str, epoch: int, *a: Any, **k: Any) -> CheckpointResult:
        try:
            answer = commit_checkpoint(client, sink, epoch, *a, **k)
        except CoordinatorRpcError:
            with reports:
                failed_reports.append(epoch)
                reports.notify_all()
            raise
        if epoch == 0:
            report_landed.set()
        return answer

    with (
        mock.patch.object(CoordinatorClient, "pre_commit", pre_commit_then_kill),
        mock.patch.object(CoordinatorClient, "commit_checkpoint", observed_report),
    ):
        running = write_to_iceberg(
            order_stream(spark, kafka_bootstrap, topic, max_offsets=1000),
            sink="orders-idle",
            table="shop.orders_idle",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            processing_time="1 second",
            coordinator_retry_seconds=1.0,
        )
        try:
            with reports:
                retried = reports.wait_for(lambda: len(failed_reports) >= RETRIES_SEEN, WAIT_SECONDS)
            assert retried, (
                f"the report was not retried on its own: {len(failed_reports)} attempt(s) in {WAIT_SECONDS} s"
            )
            assert not report_landed.is_set()
            second = CoordinatorProcess(
                database_url=database_url,
                data_dir=coordinator.data_dir,
                grpc_port=coordinator.grpc_port,
                http_port=coordinator.http_port,
            )
            successor.append(second)
            second.start()
            assert report_landed.wait(WAIT_SECONDS), "the failed report was not sent again while the query was idle"
            progress = running.query.lastProgress
            assert progress is not None and progress["batchId"] == 0, "a new batch ran: the query was not idle"
            with second.client() as client:  # returns once epoch 0 is in the table
                answer = client.commit_checkpoint("orders-idle", 0, running.registration.writer_term, wait=True)
            assert answer.committed_epoch == 0
        finally:
            running.query.stop()
            with contextlib.suppress(CoordinatorRpcError):
                running.finish(wait_for_commit=False)
    assert kafka_positions(catalog, "shop.orders_idle") == produced_positions(produced)
    assert_verified(database_url, catalog, "orders-idle", kafka_bootstrap)
