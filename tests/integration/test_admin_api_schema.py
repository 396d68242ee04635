"""Property-based run of the admin API's OpenAPI schema (schemathesis) against the real service: no 5xx, ever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
