"""Self-describing snapshots: each carries where its newest epoch ended in Kafka, read here as any reader would (the
table's metadata file as the Iceberg spec lays it out, and pyiceberg's table API), not through the coordinator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.markers import MARKER_EPOCH
from coordinator_service.contract.source_positions import (
    END_OFFSETS,
    SNAPSHOT_END_OFFSETS,
    SNAPSHOT_VALID_THROUGH_MS,
    VALID_THROUGH_MS,
)
from coordinator_service.contract.views import Registration
from coordinator_service.engine.writer_requests import PreCommitRequest
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import orders, write_parquet
from tests.fixtures.postgres import query


def positions(offset: int, valid_through: int | None) -> dict[str, str]:
    properties = {END_OFFSETS: json.dumps({"orders": {"0": offset, "1": offset + 1}})}
    if valid_through is not None:
        properties[VALID_THROUGH_MS] = str(valid_through)
    return properties


async def pre_commit(admin: AdminApp, registration: Registration, epoch: int, properties: dict[str, str]) -> None:
    path = write_parquet(registration.table_location, orders(epoch * 10, 10))
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest("orders", epoch, registration.writer_term, (path,), properties=properties)
    )


def summaries_in_metadata_file(catalog: Catalog) -> list[dict[str, Any]]:
    """The snapshots' summaries as the table's current metadata file holds them, oldest first."""
    location = catalog.load_table("db.orders").metadata_location
    metadata = json.loads(Path(location.removeprefix("file://")).read_text())
    snapshots = sorted(metadata["snapshots"], key=lambda snapshot: snapshot["sequence-number"])
    return [snapshot["summary"] for snapshot in snapshots]


async def test_each_snapshot_says_where_its_newest_epoch_ended(admin: AdminApp, catalog: Catalog) -> None:
    registration = await admin.register("orders")
    await pre_commit(admin, registration, 0, positions(10, 1_700_000_000_000))
    await admin.checkpoint("orders", registration, 0)
    # Two epochs checkpointed at once: one snapshot, with the newer one's values; it had a partition without
    # records, so the snapshot has no valid-through time.
    await pre_commit(admin, registration, 1, positions(20, 1_700_000_000_500))
    await pre_commit(admin, registration, 2, positions(30, None))
    await admin.checkpoint("orders", registration, 2)

    first, second = summaries_in_metadata_file(catalog)
    assert (first[MARKER_EPOCH], second[MARKER_EPOCH]) == ("0", "2")
    assert json.loads(first[SNAPSHOT_END_OFFSETS]) == {"orders": {"0": 10, "1": 11}}
    assert first[SNAPSHOT_VALID_THROUGH_MS] == "1700000000000"
    assert json.loads(second[SNAPSHOT_END_OFFSETS]) == {"orders": {"0": 30, "1": 31}}
    assert SNAPSHOT_VALID_THROUGH_MS not in second

    current = catalog.load_table("db.orders").current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary[SNAPSHOT_END_OFFSETS] == second[SNAPSHOT_END_OFFSETS]


async def test_a_writer_that_sends_no_positions_gets_snapshots_without_them(admin: AdminApp, catalog: Catalog) -> None:
    registration = await admin.register("orders")
    await pre_commit(admin, registration, 0, {})
    await admin.checkpoint("orders", registration, 0)

    [summary] = summaries_in_metadata_file(catalog)
    assert summary[MARKER_EPOCH] == "0"
    assert not {SNAPSHOT_END_OFFSETS, SNAPSHOT_VALID_THROUGH_MS} & summary.keys()


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({END_OFFSETS: '{"orders": {"0": "ten"}}'}, "offset 'ten' of orders-0 is not an offset"),
        ({VALID_THROUGH_MS: "yesterday"}, "kafka.valid-through-ms must be milliseconds since the epoch"),
    ],
)
async def test_malformed_positions_are_refused_and_nothing_is_persisted(
    admin: AdminApp, database_url: str, properties: dict[str, str], message: str
) -> None:
    registration = await admin.register("orders")
    with pytest.raises(InvalidArgument, match=message):
        await pre_commit(admin, registration, 0, properties)
    assert query(database_url, "SELECT epoch FROM pending_sink_state") == []
