"""The service's logs: JSON lines, and the sink (and epoch) on every line of the commit path."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from coordinator_service.contract.client import CoordinatorRpcError
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet

COMMIT_PATH_EVENTS = {"pre-commit persisted", "checkpoint recorded", "epochs committed", "aborted epoch cleaned"}


def test_every_commit_path_line_names_its_sink_and_epoch(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_RECOVERY_FILES_KEEP_SECONDS="0")
    with process.client() as client:
        writer = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        for epoch in range(2):
            client.pre_commit(
                "orders", epoch, writer.writer_term, [write_parquet(writer.table_location, orders(epoch, 1))]
            )
        client.commit_checkpoint("orders", 1, writer.writer_term, wait=True)
        client.pre_commit("orders", 2, writer.writer_term, [write_parquet(writer.table_location, orders(2, 1))])
        restarted = client.register_writer("orders", "db.orders", 1)  # aborts epoch 2: the cleaner runs
    process.wait_for_log("aborted epoch cleaned", sink="orders", epoch=2)
    process.stop()

    records = process.drain_logs()
    assert all({"event", "level", "timestamp"} <= record.keys() for record in records), records
    served = next(i for i, record in enumerate(records) if record["event"] == "sink-coordinator serving")
    stopping = next(i for i, record in enumerate(records) if record["event"] == "sink-coordinator stopping")
    commit_path = records[served + 1 : stopping]
    assert {record["event"] for record in commit_path} >= COMMIT_PATH_EVENTS
    for record in commit_path:
        assert record.get("sink") == "orders", record
        if record["event"] in COMMIT_PATH_EVENTS:
            assert "epoch" in record or "epochs" in record, record
    assert restarted.aborted_epochs == (2,)
    # A writer's calls name it (its address) on every line they log.
    precommits = [record for record in commit_path if record["event"] == "pre-commit persisted"]
    assert precommits and all("127.0.0.1" in str(record.get("writer")) for record in precommits), precommits


def test_at_info_a_batch_logs_no_line_and_every_writer_call_names_its_writer(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """On-call review: a line per pre-commit and per commit at INFO is 2,000 lines/s at 1,000 sinks; and a refused
    writer (a wrong token) was logged without its address, so probing could not be traced to a client."""
    token = "t" + "0123456789abcdefghijklmnopqrstuvwxyz"
    process = coordinator_factory(SINK_COORDINATOR_LOG_LEVEL="info", SINK_COORDINATOR_WRITER_TOKEN=token)
    with process.client(token=token) as client:
        writer = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        for epoch in range(3):
            client.pre_commit(
                "orders", epoch, writer.writer_term, [write_parquet(writer.table_location, orders(epoch, 1))]
            )
            client.commit_checkpoint("orders", epoch, writer.writer_term, wait=True)
    with process.client(token="w" + token[1:], retry_seconds=0) as wrong, contextlib.suppress(CoordinatorRpcError):
        wrong.sink_state("orders")
    refused = process.wait_for_log("authentication failed")
    process.stop()

    records = process.drain_logs()
    assert not [record for record in records if record["event"] in COMMIT_PATH_EVENTS], records
    assert not [record for record in records if record["level"] == "debug"], records
    registered = next(record for record in records if record["event"] == "writer registered")
    assert "127.0.0.1" in registered["writer"], registered
    assert "127.0.0.1" in refused["writer"] and refused["why"] == "the writer token is wrong", refused
    assert token not in str(records) and token[1:] not in str(records)


def test_a_pre_commit_names_which_writer_of_the_epoch_sent_it(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """An epoch of several writers: each one's pre-commit line says which (writer_id) beside its address."""
    process = coordinator_factory()
    with process.client() as client:
        writer = client.register_writer(
            "orders", "db.orders", -1, writer_count=2, arrow_schema=ORDERS.serialize().to_pybytes()
        )
        files = [write_parquet(writer.table_location, orders(i * 10, 1)) for i in range(2)]
        threads = [
            threading.Thread(
                target=client.pre_commit, args=("orders", 0, writer.writer_term, [files[i]]), kwargs={"writer_id": i}
            )
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    for writer_id in range(2):
        line = process.wait_for_log("pre-commit persisted", writer_id=writer_id)
        assert "127.0.0.1" in line["writer"], line
