"""Invariant 6 through a coordinator crash: kill -9 of the coordinator in the middle of a running query.

A failpoint kills the coordinator at an exact step; a new coordinator process
on the same database and ports takes over while the query runs; the writer's
client retries UNAVAILABLE and the query finishes with every record once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from spark_writer.sink.iceberg_sink import write_to_iceberg
from tests.fixtures.coordinator import CoordinatorProcess, failpoints_env
from tests.fixtures.pipeline import (
    QUERY_TIMEOUT_SECONDS,
    kafka_positions,
    order_stream,
    produce_orders,
    produced_positions,
)
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]
Factory = Callable[..., CoordinatorProcess]


@pytest.fixture
def successor(database_url: str) -> Iterator[list[CoordinatorProcess]]:
    """Coordinators started by the test itself (on the ports of a killed one); stopped at the end."""
    started: list[CoordinatorProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest.mark.parametrize(
    "failpoint",
    [
        "precommit.after_persist",  # the pre-commit is durable, the writer not yet answered
        "commit.after_append",  # the epochs are in the table, not yet marked COMMITTED
    ],
)
def test_coordinator_killed_mid_query(
    failpoint: str,
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator_factory: Factory,
    successor: list[CoordinatorProcess],
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=3)
    produced = produce_orders(kafka_bootstrap, topic, range(1500), partitions=3)
    first = coordinator_factory(**failpoints_env(f"{failpoint}=kill"))
    orders = order_stream(spark, kafka_bootstrap, topic, max_offsets=300)
    running = write_to_iceberg(
        orders,
        sink="orders",
        table="shop.orders",
        coordinator=first.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        available_now=True,
    )
    # Awaited in a thread: the query can only end once the successor below answers.
    outcome: list[object] = []

    def await_query() -> None:
        try:
            outcome.append(running.await_termination(QUERY_TIMEOUT_SECONDS))
        except Exception as error:
            outcome.append(error)

    waiter = threading.Thread(target=await_query)
    waiter.start()

    assert first.wait_killed(timeout=QUERY_TIMEOUT_SECONDS) == -signal.SIGKILL
    second = CoordinatorProcess(
        database_url=database_url,
        data_dir=first.data_dir,
        grpc_port=first.grpc_port,
        http_port=first.http_port,
    )
    successor.append(second)
    second.start()
    waiter.join(QUERY_TIMEOUT_SECONDS)

    assert outcome == [True], "the query did not finish after the coordinator came back"
    assert kafka_positions(catalog, "shop.orders") == produced_positions(produced)
    assert_verified(database_url, catalog, "orders", kafka_bootstrap)
    with second.client() as client:
        state = client.sink_state("orders")
    assert state.committed_epoch == state.checkpointed_epoch == 4
