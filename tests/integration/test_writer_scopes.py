"""Writer scopes on the real service: a team's token reaches its own sinks and namespaces only, a table the
coordinator did not create is taken only after an operator adopted it, and each scope has quotas."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import httpx
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError, PreCommitFile, TableSpec
from coordinator_service.tables.table_origin import ADOPTED, CREATED, ORIGIN
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, write_parquet
from tests.fixtures.postgres import query

ADMIN_TOKEN = "scopes-admin-token-Zq3vX9pL2mN8rT5wY7b"
TEAM_A = "team-a-writer-token-Hq7vX2pL9mN4rT1wYc"
TEAM_B = "team-b-writer-token-Kp2vX7qL9mN4rT5wYd"
SCHEMA = ORDERS.serialize().to_pybytes()
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def scopes_env(team_a: dict[str, object] | None = None) -> dict[str, str]:
    """Two teams: a-* sinks writing namespace team_a, b-* sinks writing team_b (as JSON, and as variables)."""
    return {
        "SINK_COORDINATOR_ADMIN_TOKEN": ADMIN_TOKEN,
        "SINK_COORDINATOR_WRITER_SCOPES": json.dumps(
            {"team-a": {"token": TEAM_A, "sinks": ["a-*"], "namespaces": ["team_a"], **(team_a or {})}}
        ),
        "SINK_COORDINATOR_WRITER_SCOPES__team-b__TOKEN": TEAM_B,
        "SINK_COORDINATOR_WRITER_SCOPES__team-b__SINKS": '["b-*"]',
        "SINK_COORDINATOR_WRITER_SCOPES__team-b__NAMESPACES": '["team_b"]',
    }


def refused(call: Callable[[], object], code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(CoordinatorRpcError) as raised:
        call()
    assert raised.value.code == code, raised.value
    for fragment in fragments:
        assert fragment in raised.value.message, raised.value.message
    return raised.value.message


def client_of(process: CoordinatorProcess, token: str) -> CoordinatorClient:
    return CoordinatorClient(process.target, token=token, retry_seconds=0.0)


def test_a_scoped_writer_reaches_only_its_own_sinks_and_namespaces(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog, database_url: str
) -> None:
    process = coordinator_factory(**scopes_env())
    with client_of(process, TEAM_A) as team_a, client_of(process, TEAM_B) as team_b:
        registration = team_a.register_writer("a-orders", "team_a.orders", -1, arrow_schema=SCHEMA)
        path = write_parquet(registration.table_location, [{"order_id": 1, "customer": "c", "amount": 1.0}])
        team_a.pre_commit("a-orders", 0, registration.writer_term, [path])

        denied = grpc.StatusCode.PERMISSION_DENIED
        # Another team's sink: not its registration (which would fence the writer and abort its epochs), nor
        # its state, its pre-commits or its checkpoints.
        refused(lambda: team_b.register_writer("a-orders", "team_a.orders", -1), denied, "team-b", "'a-orders'")
        refused(lambda: team_b.sink_state("a-orders"), denied, "does not cover sink")
        refused(lambda: team_b.pre_commit("a-orders", 1, registration.writer_term, []), denied)
        refused(lambda: team_b.commit_checkpoint("a-orders", 0, registration.writer_term), denied)
        # Another team's namespace, under a sink of its own: not created, not ensured.
        refused(
            lambda: team_b.register_writer("b-stolen", "team_a.stolen", -1, arrow_schema=SCHEMA),
            denied,
            "does not cover table 'team_a.stolen'",
        )
        refused(
            lambda: team_a.ensure_tables("a-orders", registration.writer_term, [TableSpec("team_b.theirs", SCHEMA)]),
            denied,
            "'team_b.theirs'",
        )
        # A pre-commit's file naming another namespace's table.
        refused(
            lambda: team_a.pre_commit(
                "a-orders", 1, registration.writer_term, [PreCommitFile(path=path, table="team_b.theirs")]
            ),
            denied,
        )

        state = team_a.sink_state("a-orders")
        assert state.writer_term == registration.writer_term
        assert [epoch.status.value for epoch in state.epochs] == ["PENDING"]
    assert query(database_url, "SELECT name FROM sinks") == [("a-orders",)]
    assert not catalog.table_exists("team_a.stolen") and not catalog.table_exists("team_b.theirs")


def test_a_table_the_coordinator_did_not_create_is_taken_only_after_an_operator_adopted_it(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog, database_url: str
) -> None:
    process = coordinator_factory(**scopes_env())
    catalog.create_namespace("team_a")
    foreign = catalog.create_table("team_a.legacy", schema=ORDERS)
    before = foreign.metadata_location
    with client_of(process, TEAM_A) as team_a:
        message = refused(
            lambda: team_a.register_writer("a-legacy", "team_a.legacy", -1, arrow_schema=SCHEMA),
            grpc.StatusCode.FAILED_PRECONDITION,
            "was not created by the coordinator",
            "POST /api/v1/tables/team_a.legacy/adopt",
        )
        assert "Nothing was changed" in message
        assert query(database_url, "SELECT name FROM sinks") == []
        assert catalog.load_table("team_a.legacy").metadata_location == before

        # A table the coordinator created may be another sink's too.
        own = team_a.register_writer("a-first", "team_a.first", -1, arrow_schema=SCHEMA)
        assert catalog.load_table("team_a.first").properties[ORIGIN] == CREATED
        assert team_a.register_writer("a-second", "team_a.first", -1).writer_term == 1
        refused(
            lambda: team_a.ensure_tables("a-first", own.writer_term, [TableSpec("team_a.legacy", SCHEMA)]),
            grpc.StatusCode.FAILED_PRECONDITION,
            "adopt",
        )

        url = f"{process.http_url}/api/v1/tables/team_a.legacy/adopt"
        assert httpx.post(url, json={"reason": "moving the legacy job"}).status_code == 401
        missing = httpx.post(
            f"{process.http_url}/api/v1/tables/team_a.nothing/adopt", json={"reason": "x"}, headers=ADMIN
        )
        assert missing.status_code == 404
        adopted = httpx.post(url, json={"reason": "moving the legacy job"}, headers=ADMIN)
        assert adopted.status_code == 200, adopted.text
        assert adopted.json() == {"table": "team_a.legacy", "changed": True}
        assert httpx.post(url, json={"reason": "again"}, headers=ADMIN).json()["changed"] is False
        assert catalog.load_table("team_a.legacy").properties[ORIGIN] == ADOPTED

        assert team_a.register_writer("a-legacy", "team_a.legacy", -1, arrow_schema=SCHEMA).writer_term == 1
    logged = [record for record in process.drain_logs() if record.get("event") == "table adopted for writers"]
    assert [(record["table"], record["who"], record["reason"]) for record in logged] == [
        ("team_a.legacy", "admin", "moving the legacy job")
    ]


def test_each_scope_has_quotas_of_sinks_and_tables(
    coordinator_factory: Callable[..., CoordinatorProcess], catalog: Catalog, database_url: str
) -> None:
    process = coordinator_factory(**scopes_env({"max_sinks": 2, "max_tables": 3}))
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    with client_of(process, TEAM_A) as team_a, client_of(process, TEAM_B) as team_b:
        first = team_a.register_writer("a-1", "team_a.t1", -1, arrow_schema=SCHEMA)
        team_a.register_writer("a-2", "team_a.t2", -1, arrow_schema=SCHEMA)
        refused(
            lambda: team_a.register_writer("a-3", "team_a.t3", -1, arrow_schema=SCHEMA),
            exhausted,
            "team-a has 2 sinks",
            "SINK_COORDINATOR_WRITER_SCOPES__team-a__MAX_SINKS",
        )
        assert not catalog.table_exists("team_a.t3")
        again = team_a.register_writer("a-1", "team_a.t1", -1)  # a restart adds nothing
        assert again.writer_term == first.writer_term + 1

        team_a.ensure_tables("a-1", again.writer_term, [TableSpec("team_a.t3", SCHEMA)])
        refused(
            lambda: team_a.ensure_tables("a-1", again.writer_term, [TableSpec("team_a.t4", SCHEMA)]),
            exhausted,
            "writes 3 tables",
            "MAX_TABLES",
        )
        assert not catalog.table_exists("team_a.t4")
        # More tables than one call may name: refused before any is looked up or counted.
        refused(
            lambda: team_a.ensure_tables(
                "a-1", again.writer_term, [TableSpec(f"team_a.many_{index}", SCHEMA) for index in range(1001)]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "1001 tables",
        )
        # Tables ensured before count once and are ensured again.
        team_a.ensure_tables("a-1", again.writer_term, [TableSpec("team_a.t3", SCHEMA)])
        # Another scope's quota is its own.
        team_b.register_writer("b-1", "team_b.t1", -1, arrow_schema=SCHEMA)
    assert query(database_url, "SELECT name FROM sinks ORDER BY name") == [("a-1",), ("a-2",), ("b-1",)]
