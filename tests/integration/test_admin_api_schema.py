"""Property-based runs of the admin API's OpenAPI schema (schemathesis) against the real service: no 5xx, ever;
and without a token, no route that does work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet
from tests.fixtures.postgres import query

ADMIN_TOKEN = "schema-admin-token-Zq3vX9pL2mN8rT5wY7bC"
METRICS = "schema-metrics-token-Hq7vX2pL9mN4rT1wY"
GATE_REFUSALS = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 421: "INVALID_ARGUMENT"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_no_request_makes_the_admin_api_fail(coordinator_factory: Callable[..., CoordinatorProcess]) -> None:
    process = coordinator_factory()
    with process.client() as client:
        writer = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        for epoch in range(3):
            path = write_parquet(writer.table_location, orders(epoch * 10, 10))
            client.pre_commit("orders", epoch, writer.writer_term, [path])
        client.commit_checkpoint("orders", 0, writer.writer_term, wait=True)

    schema = schemathesis.openapi.from_url(f"{process.http_url}/openapi.json")
    # Random sink names mostly reach the 404 path: also aim at the one sink that exists, and send invalid data.
    cases = st.one_of(
        schema.as_strategy(),
        schema.as_strategy(path_parameters={"sink": "orders"}),
        schema.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def call(case: Case[Any]) -> None:
        case.call_and_validate(base_url=process.http_url, checks=CHECKS)

    call()


def test_without_a_token_no_route_does_work(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str
) -> None:
    """Every route of the schema, valid and invalid requests, none with a token: the API answers 401 (that it reads no
    body first: test_http_gate.py, by the bytes it pulls); only the probes and the API's own description answer;
    nothing changes. (It asserted every answer within 2 s too: a loaded machine once took 2.8 s, and the properties
    are these, not a time.)"""
    process = coordinator_factory(SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN, SINK_COORDINATOR_METRICS_TOKEN=METRICS)
    with process.client() as client:
        writer = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        for epoch in range(2):
            path = write_parquet(writer.table_location, orders(epoch * 10, 10))
            client.pre_commit("orders", epoch, writer.writer_term, [path])
    log_before = query(database_url, "SELECT name, generation, writer_term, maintenance_overrides FROM sinks")
    epochs_before = query(database_url, "SELECT epoch, status, attempt FROM pending_sink_state ORDER BY epoch")

    schema = schemathesis.openapi.from_dict(httpx.get(f"{process.http_url}/openapi.json").json())
    cases = st.one_of(
        schema.as_strategy(),
        schema.as_strategy(path_parameters={"sink": "orders"}),
        schema.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def call(case: Case[Any]) -> None:
        case.headers = {key: value for key, value in (case.headers or {}).items() if key.lower() != "authorization"}
        response = case.call(base_url=process.http_url)
        if case.path.startswith("/api/"):
            # The HTTP gate refuses a foreign Host (421) and a cross-site browser request (403) before it asks for
            # a token: a refusal all the same, which does no work.
            assert response.status_code in GATE_REFUSALS, (case.method, case.formatted_path, response.status_code)
            assert response.json()["error"]["code"] == GATE_REFUSALS[response.status_code]

    call()
    for path, status in (("/metrics", 401), ("/healthz", 200), ("/readyz", 200), ("/openapi.json", 200)):
        assert httpx.get(f"{process.http_url}{path}").status_code == status, path
    assert query(database_url, "SELECT name, generation, writer_term, maintenance_overrides FROM sinks") == log_before
    assert query(database_url, "SELECT epoch, status, attempt FROM pending_sink_state ORDER BY epoch") == epochs_before
    assert query(database_url, "SELECT count(*) FROM maintenance_runs") == [(0,)]
