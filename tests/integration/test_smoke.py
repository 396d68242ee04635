from pyiceberg.catalog import Catalog

from coordinator_service.contract.views import PreCommitOutcome
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet


def test_one_epoch_end_to_end(coordinator: CoordinatorProcess, catalog: Catalog) -> None:
    with coordinator.client() as client:
        registration = client.register_writer("s1", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        path = write_parquet(registration.table_location, orders(0, 10))
        answer = client.pre_commit("s1", 0, registration.writer_term, [path])
        assert answer.outcome is PreCommitOutcome.PERSISTED
        result = client.commit_checkpoint("s1", 0, registration.writer_term, wait=True)
        assert result.committed_epoch == 0
    assert table_order_ids(catalog.load_table("db.orders")) == list(range(10))
