"""The service's logs: JSON lines, and the sink (and epoch) on every line of the commit path."""

from __future__ import annotations

from collections.abc import Callable

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
