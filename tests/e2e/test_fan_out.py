"""Fan-out end to end: one query routing its records into several tables by a column, with a real broker, the
real coordinator process and the session's Spark; every record once, in its table."""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from spark_writer.job import start_job
from spark_writer.job_settings import KafkaSettings, ParseSettings, SinkSettings
from spark_writer.routing.routes import Routes, Unrouted
from spark_writer.sink.iceberg_sink import write_to_iceberg
from tests.fixtures.coordinator import CoordinatorProcess, failpoints_env
from tests.fixtures.kafka_broker import ProducedRecord, produce_records
from tests.fixtures.pipeline import (
    COUNTRIES,
    ORDER_SCHEMA_DDL,
    QUERY_TIMEOUT_SECONDS,
    kafka_positions,
    order,
    order_stream,
    produce_orders,
    produced_positions,
    table_arrow,
)
from tests.fixtures.verification import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TopicFactory = Callable[..., str]


def countries(catalog: Catalog, table: str) -> Counter[str]:
    return Counter(table_arrow(catalog, table, ("country",)).column("country").to_pylist())


def positions_by_country(records: list[ProducedRecord]) -> dict[str, Counter[tuple[int, int]]]:
    """Where each country's orders landed in Kafka (the key is the order id)."""
    by_country: dict[str, Counter[tuple[int, int]]] = {country: Counter() for country in COUNTRIES}
    for record in records:
        by_country[order(int(record.key))["country"]][(record.partition, record.offset)] += 1
    return by_country


def data_files_under(location: Path) -> list[Path]:
    return sorted(location.rglob("*.parquet"))


def test_static_routes_put_every_record_once_in_its_table(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=3)
    produced = produce_orders(kafka_bootstrap, topic, range(3000), partitions=3)
    tables = {country: f"shop.fan_{country.lower()}" for country in COUNTRIES}
    running = write_to_iceberg(
        order_stream(spark, kafka_bootstrap, topic, max_offsets=600),
        sink="orders-fan-static",
        table="shop.fan_unrouted",
        coordinator=coordinator.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        partition_by=("day(created_at)",),
        routes=Routes.static("country", tables.items(), Unrouted.FAIL),
        available_now=True,
    )
    assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    expected = positions_by_country(produced)
    for country, table in tables.items():
        assert countries(catalog, table) == Counter({country: 1000}), table
        assert kafka_positions(catalog, table) == expected[country], table
        # Created from the data's schema like the sink's own table (the route column kept), and partitioned alike.
        assert [str(field) for field in catalog.load_table(table).spec().fields] == ["1000: created_at_day: day(5)"]
    assert len(table_arrow(catalog, "shop.fan_unrouted", ("order_id",))) == 0
    with coordinator.client() as client:
        state = client.sink_state("orders-fan-static")
    assert state.committed_epoch == state.checkpointed_epoch == 4
    assert {table.table: table.committed_epoch for table in state.tables} == {
        "shop.fan_unrouted": 4,
        **dict.fromkeys(tables.values(), 4),
    }
    assert_verified(coordinator.database_url, catalog, "orders-fan-static", kafka_bootstrap)


def produce_targeted(bootstrap: str, topic: str, ids: range, target: Callable[[int], str]) -> list[ProducedRecord]:
    """Orders carrying the table they go to, `target(order id)`, round-robin over 2 partitions."""
    return produce_records(
        bootstrap,
        topic,
        ((i % 2, str(i).encode(), json.dumps(order(i, target=target(i))).encode()) for i in ids),
    )


def test_dynamic_routes_create_a_table_that_appears_mid_stream(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=2)
    before = produce_targeted(kafka_bootstrap, topic, range(1000), lambda i: f"shop.dyn_{i % 2}")
    running = start_job(
        spark,
        KafkaSettings(kafka_bootstrap, (topic,), max_offsets_per_trigger=400),
        ParseSettings(schema_ddl=f"{ORDER_SCHEMA_DDL}, target STRING", kafka_metadata=True),
        SinkSettings(
            sink="orders-fan-dynamic",
            table="shop.dyn_default",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            routes=Routes("target", dynamic=True),
        ),
    )
    running.query.processAllAvailable()
    assert not catalog.table_exists("shop.dyn_new")

    # A table no record named before; and values that name no table, which go to the sink's own.
    after = produce_targeted(
        kafka_bootstrap, topic, range(1000, 1600), lambda i: ("shop.dyn_new", "shop.dyn_0", "not a table")[i % 3]
    )
    running.query.processAllAvailable()
    running.stop()

    routed: dict[str, Counter[tuple[int, int]]] = {}
    for record in before + after:
        i = int(record.key)
        table = f"shop.dyn_{i % 2}" if i < 1000 else ("shop.dyn_new", "shop.dyn_0", "shop.dyn_default")[i % 3]
        routed.setdefault(table, Counter())[(record.partition, record.offset)] += 1
    for table, expected in routed.items():
        assert kafka_positions(catalog, table) == expected, table
    with coordinator.client() as client:
        state = client.sink_state("orders-fan-dynamic")
    assert {table.table for table in state.tables} == set(routed)
    assert_verified(coordinator.database_url, catalog, "orders-fan-dynamic", kafka_bootstrap)


def test_unrouted_records_fail_the_batch_or_go_to_the_sinks_own_table(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator: CoordinatorProcess,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """The same query fails on the countries without a route, then, restarted with a route added and the records
    no route takes going to the sink's own table, writes the same batch: every record once, the failed attempt's
    files gone."""
    topic = kafka_topic(partitions=1)
    produced = produce_orders(kafka_bootstrap, topic, range(30), partitions=1)

    def run(unrouted: Unrouted, *routes: tuple[str, str]) -> None:
        running = write_to_iceberg(
            order_stream(spark, kafka_bootstrap, topic, max_offsets=100),
            sink="orders-fan-unrouted",
            table="shop.unrouted_rest",
            coordinator=coordinator.target,
            checkpoint_location=str(tmp_path / "checkpoint"),
            routes=Routes.static("country", routes, unrouted),
            available_now=True,
        )
        assert running.await_termination(QUERY_TIMEOUT_SECONDS)

    with pytest.raises(StreamingQueryException) as failure:
        run(Unrouted.FAIL, ("DE", "shop.unrouted_de"))
    message = " ".join(str(failure.value).split())
    # Orders 1, 4, ... are FR and 2, 5, ... US (offset = order id here); the most frequent value first.
    for expected in (
        "batch 0: 20 record(s) whose route column 'country' has no route",
        f"'FR': 10 record(s), the first from topic {topic} partition 0 offset 1",
        f"'US': 10 record(s), the first from topic {topic} partition 0 offset 2",
        "--unrouted default, shop.unrouted_rest",
    ):
        assert expected in message, message
    warehouse = tmp_path / "coordinator" / "warehouse"
    assert data_files_under(warehouse) == []  # the DE files the batch wrote were deleted
    with coordinator.client() as client:
        assert client.sink_state("orders-fan-unrouted").committed_epoch == -1

    run(Unrouted.DEFAULT, ("DE", "shop.unrouted_de"), ("FR", "shop.unrouted_fr"))

    tables = {"DE": "shop.unrouted_de", "FR": "shop.unrouted_fr", "US": "shop.unrouted_rest"}
    for country, table in tables.items():
        assert countries(catalog, table) == Counter({country: 10}), table
    assert sum((kafka_positions(catalog, table) for table in tables.values()), Counter()) == produced_positions(
        produced
    )
    assert_verified(coordinator.database_url, catalog, "orders-fan-unrouted", kafka_bootstrap)


@pytest.fixture
def successor() -> Iterator[list[CoordinatorProcess]]:
    """Coordinators the test starts itself (on the ports of a killed one); stopped at the end."""
    started: list[CoordinatorProcess] = []
    yield started
    for process in started:
        process.stop()


def test_a_coordinator_killed_between_the_tables_of_an_epoch(
    spark: SparkSession,
    kafka_bootstrap: str,
    kafka_topic: TopicFactory,
    coordinator_factory: Callable[..., CoordinatorProcess],
    successor: list[CoordinatorProcess],
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """kill -9 once one table of an epoch holds its files and the others not yet: the next coordinator appends the
    others' and not that one's again, and the query goes on; every record once, in its table."""
    topic = kafka_topic(partitions=3)
    produced = produce_orders(kafka_bootstrap, topic, range(1500), partitions=3)
    first = coordinator_factory(**failpoints_env("commit.between_tables=kill"))
    tables = {country: f"shop.crash_{country.lower()}" for country in COUNTRIES}
    running = write_to_iceberg(
        order_stream(spark, kafka_bootstrap, topic, max_offsets=300),
        sink="orders-fan-crash",
        table=tables["DE"],
        coordinator=first.target,
        checkpoint_location=str(tmp_path / "checkpoint"),
        routes=Routes.static("country", [(country, tables[country]) for country in ("FR", "US")], Unrouted.DEFAULT),
        available_now=True,
    )
    outcome: list[object] = []  # the query can only end once the successor answers: awaited in a thread

    def await_query() -> None:
        try:
            outcome.append(running.await_termination(QUERY_TIMEOUT_SECONDS))
        except Exception as error:
            outcome.append(error)

    waiter = threading.Thread(target=await_query)
    waiter.start()
    assert first.wait_killed(timeout=QUERY_TIMEOUT_SECONDS) == -signal.SIGKILL
    second = CoordinatorProcess(
        database_url=database_url, data_dir=first.data_dir, grpc_port=first.grpc_port, http_port=first.http_port
    )
    successor.append(second)
    second.start()
    waiter.join(QUERY_TIMEOUT_SECONDS)

    assert outcome == [True], "the query did not finish after the coordinator came back"
    expected = positions_by_country(produced)
    for country, table in tables.items():
        assert kafka_positions(catalog, table) == expected[country], table
    with second.client() as client:
        state = client.sink_state("orders-fan-crash")
    assert state.committed_epoch == state.checkpointed_epoch == 4
    assert {table.committed_epoch for table in state.tables} == {4}
    assert_verified(database_url, catalog, "orders-fan-crash", kafka_bootstrap)
