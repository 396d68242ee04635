"""A data file belongs to one epoch of one sink: a pre-commit naming someone else's file is refused."""

from __future__ import annotations

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.engine.writer_requests import PreCommitRequest
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import table_order_ids
from tests.fixtures.postgres import query


async def test_a_file_already_in_the_table_is_refused(admin: AdminApp, catalog: Catalog, database_url: str) -> None:
    registration = await admin.register("orders")
    committed = await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    with pytest.raises(InvalidArgument) as refused:
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(sink="orders", epoch=1, writer_term=registration.writer_term, paths=(committed,))
        )
    assert committed in refused.value.message
    assert "epoch 0 of sink orders" in refused.value.message
    assert query(database_url, "SELECT epoch FROM pending_sink_state WHERE epoch = 1") == []
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10))


async def test_a_file_another_sinks_pending_epoch_holds_is_refused(admin: AdminApp) -> None:
    first = await admin.register("first")
    held = await admin.pre_commit("first", first, 0, 0)
    second = await admin.register("second")
    with pytest.raises(InvalidArgument) as refused:
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(sink="second", epoch=0, writer_term=second.writer_term, paths=(held,))
        )
    assert "epoch 0 of sink first" in refused.value.message
    state = await admin.runtime.coordinator.sink_state("second")
    assert state.epochs == ()
