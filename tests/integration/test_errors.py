"""Every error of the contract: its status code, a message naming the problem, and no row changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.contract.views import PreCommitOutcome, Registration
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet
from tests.fixtures.refusals import refused

SCHEMA = ORDERS.serialize().to_pybytes()


@pytest.fixture
def client(coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with coordinator.client(retry_seconds=0) as client:
        yield client


@pytest.fixture
def writer(client: CoordinatorClient) -> Registration:
    return client.register_writer("orders-sink", "shop.orders", -1, arrow_schema=SCHEMA)


def test_register_bad_arguments(client: CoordinatorClient, database_url: str) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    refused(
        database_url, lambda: client.register_writer("", "shop.orders", -1, arrow_schema=SCHEMA), invalid, "sink name"
    )
    refused(
        database_url, lambda: client.register_writer("s", "orders", -1, arrow_schema=SCHEMA), invalid, "namespace.table"
    )
    refused(database_url, lambda: client.register_writer("s", "shop.orders", -2, arrow_schema=SCHEMA), invalid, "-2")
    refused(
        database_url,
        lambda: client.register_writer("s", "shop.orders", -1, writer_count=-1, arrow_schema=SCHEMA),
        invalid,
        "writer_count",
    )
    refused(
        database_url,
        lambda: client.register_writer("s", "shop.orders", -1, arrow_schema=b"junk"),
        invalid,
        "arrow_schema",
    )
    refused(database_url, lambda: client.register_writer("s", "shop.missing", -1), invalid, "does not exist", "schema")
    refused(
        database_url,
        lambda: client.register_writer("s", "shop.orders", -1, arrow_schema=SCHEMA, partition_by=["week(ts)"]),
        invalid,
        "partition field",
    )


def test_register_same_sink_other_table(client: CoordinatorClient, writer: Registration, database_url: str) -> None:
    refused(
        database_url,
        lambda: client.register_writer("orders-sink", "shop.other", -1, arrow_schema=SCHEMA),
        grpc.StatusCode.FAILED_PRECONDITION,
        "writes table shop.orders",
    )


def test_precommit_bad_requests(
    client: CoordinatorClient, writer: Registration, database_url: str, tmp_path: Path, catalog: Catalog
) -> None:
    term = writer.writer_term
    good = write_parquet(writer.table_location, orders(0, 3))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    refused(database_url, lambda: client.pre_commit("", 0, term, [good]), invalid, "sink name")
    refused(database_url, lambda: client.pre_commit("orders-sink", -1, term, [good]), invalid, "epoch -1")
    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(Path(good.removeprefix("file://")).read_bytes())
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [outside.as_uri()]),
        invalid,
        "outside the table's data directory",
    )
    # Never a file of the table's own metadata (or another table's): the coordinator deletes an aborted epoch's.
    table = catalog.load_table("shop.orders")
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [table.metadata_location]),
        invalid,
        "outside the table's data directory",
    )
    # Nor a file reached through a symbolic link: its real path is elsewhere.
    linked = Path(writer.table_location.removeprefix("file://")) / "data" / "linked.parquet"
    linked.symlink_to(outside)
    refused(
        database_url, lambda: client.pre_commit("orders-sink", 0, term, [linked.as_uri()]), invalid, "symbolic link"
    )
    escaping = good.rsplit("/", 2)[0] + "/../../x.parquet"
    refused(database_url, lambda: client.pre_commit("orders-sink", 0, term, [escaping]), invalid, "'..'")
    refused(database_url, lambda: client.pre_commit("orders-sink", 0, term, ["data/x.parquet"]), invalid, "relative")
    missing = writer.table_location + "/data/missing.parquet"
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [missing]),
        invalid,
        "does not exist",
        "missing.parquet",
    )
    not_parquet = Path(writer.table_location.removeprefix("file://")) / "data" / "notes.parquet"
    not_parquet.write_text("not parquet at all")
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [not_parquet.as_uri()]),
        invalid,
        "not a readable Parquet",
    )
    wrong_type = write_parquet(
        writer.table_location,
        [{"order_id": "one", "customer": "c", "amount": 1.0}],
        schema=pa.schema([("order_id", pa.string()), ("customer", pa.string()), ("amount", pa.float64())]),
    )
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [wrong_type]),
        invalid,
        "does not fit the schema",
    )
    extra_column = write_parquet(
        writer.table_location,
        [{"order_id": 1, "customer": "c", "amount": 1.0, "coupon": "X"}],
        schema=ORDERS.append(pa.field("coupon", pa.string())),
    )
    refused(database_url, lambda: client.pre_commit("orders-sink", 0, term, [extra_column]), invalid, "coupon")
    refused(database_url, lambda: client.pre_commit("orders-sink", 0, term, [good, good]), invalid, "more than once")
    refused(
        database_url, lambda: client.pre_commit("orders-sink", 0, term, [good], writer_id=1), invalid, "writer_id 1"
    )


def test_unknown_sink(client: CoordinatorClient, database_url: str) -> None:
    not_found = grpc.StatusCode.NOT_FOUND
    refused(database_url, lambda: client.pre_commit("nobody", 0, 1, []), not_found, "nobody", "RegisterWriter")
    refused(database_url, lambda: client.commit_checkpoint("nobody", 0, 1), not_found, "nobody")
    refused(database_url, lambda: client.sink_state("nobody"), not_found, "nobody")


def test_fenced_term(client: CoordinatorClient, writer: Registration, database_url: str) -> None:
    newer = client.register_writer("orders-sink", "shop.orders", -1, arrow_schema=SCHEMA)
    assert newer.writer_term == writer.writer_term + 1
    path = write_parquet(writer.table_location, orders(0, 3))
    failed = grpc.StatusCode.FAILED_PRECONDITION
    refused(database_url, lambda: client.pre_commit("orders-sink", 0, writer.writer_term, [path]), failed, "fenced")
    refused(database_url, lambda: client.commit_checkpoint("orders-sink", 0, writer.writer_term), failed, "fenced")
    refused(
        database_url, lambda: client.pre_commit("orders-sink", 0, newer.writer_term + 5, [path]), failed, "never issued"
    )


def test_checkpoint_of_aborted_and_missing_epochs(
    client: CoordinatorClient, writer: Registration, database_url: str, coordinator: CoordinatorProcess
) -> None:
    term = writer.writer_term
    for epoch in range(3):
        client.pre_commit("orders-sink", epoch, term, [write_parquet(writer.table_location, orders(epoch * 10, 10))])
    # The writer restarts from a checkpoint holding epoch 0: epochs 1 and 2 are aborted by recovery.
    restarted = client.register_writer("orders-sink", "shop.orders", 0, arrow_schema=SCHEMA)
    assert restarted.aborted_epochs == (1, 2)
    # Let the background work of the recovery finish before comparing the metastore (the files of epochs 1
    # and 2 are kept for Spark's re-run: the cleaner leaves their rows alone).
    coordinator.wait_for_log("epochs committed", sink="orders-sink", epochs=[0])
    failed = grpc.StatusCode.FAILED_PRECONDITION
    error = refused(
        database_url,
        lambda: client.commit_checkpoint("orders-sink", 2, restarted.writer_term),
        failed,
        "aborted",
        "recovery",
    )
    assert "epoch 1" in error.message
    # The restarted writer re-runs epochs 1 and 2: new attempts of the aborted epochs.
    for epoch in (1, 2):
        again = client.pre_commit(
            "orders-sink", epoch, restarted.writer_term, [write_parquet(writer.table_location, orders(epoch * 10, 10))]
        )
        assert again.outcome is PreCommitOutcome.PERSISTED and again.attempt == 2
    # An epoch that was never pre-committed cannot be checkpointed: that would lose its records.
    refused(
        database_url,
        lambda: client.commit_checkpoint("orders-sink", 5, restarted.writer_term),
        failed,
        "never pre-committed (3, 4, 5)",
    )


def test_checkpoint_behind_the_coordinator(client: CoordinatorClient, writer: Registration, database_url: str) -> None:
    term = writer.writer_term
    for epoch in range(2):
        client.pre_commit("orders-sink", epoch, term, [write_parquet(writer.table_location, orders(epoch * 10, 10))])
    client.commit_checkpoint("orders-sink", 1, term, wait=True)
    refused(
        database_url,
        lambda: client.register_writer("orders-sink", "shop.orders", 0, arrow_schema=SCHEMA),
        grpc.StatusCode.FAILED_PRECONDITION,
        "lost or rolled back",
        "/api/v1/sinks/orders-sink/reset",
    )


def test_changed_files_within_a_term(client: CoordinatorClient, writer: Registration, database_url: str) -> None:
    term = writer.writer_term
    client.pre_commit("orders-sink", 0, term, [write_parquet(writer.table_location, orders(0, 3))])
    other = write_parquet(writer.table_location, orders(100, 3))
    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [other]),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already pre-committed with other data files",
    )


def test_metastore_down_is_unavailable(
    coordinator_factory: Callable[..., CoordinatorProcess], postgres_url: str, tmp_path: Path
) -> None:
    """With PostgreSQL gone, calls answer UNAVAILABLE (retryable) and the service keeps running."""
    from sqlalchemy.engine import make_url

    from coordinator_service.log.embedded import start_embedded_postgres, stop_embedded_postgres
    from coordinator_service.runtime import migrate

    pgdata = Path(__import__("tempfile").mkdtemp(prefix="sink-coordinator-pg-down-")) / "data"
    url = start_embedded_postgres(pgdata)
    migrate(make_url(url))
    process = CoordinatorProcess(database_url=url, data_dir=tmp_path / "c").start()
    try:
        with process.client(retry_seconds=0) as client:
            stop_embedded_postgres(pgdata)
            with pytest.raises(CoordinatorRpcError) as raised:
                client.sink_state("anything")
            assert raised.value.code == grpc.StatusCode.UNAVAILABLE
            # Said by the call that found it unreachable, or by the metastore's watch when its ping failed first.
            assert "PostgreSQL metastore" in raised.value.message, raised.value.message
            assert process.process is not None and process.process.poll() is None
    finally:
        process.stop()
