"""What every HTTP request passes before a route reads it: the Host, the token, the size of its body, where it
comes from; and what every answer carries. On the real app, its runtime and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coordinator_service.admin.deps import operations_of
from coordinator_service.admin.http_gate import MAX_BODY_BYTES
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import SinkOverview
from tests.fixtures.admin import AdminApp, AdminFactory, CatalogDatabase
from tests.fixtures.postgres import query

TOKEN = "gate-admin-token-Zq3vX9pL2mN8rT5wY7b"
METRICS_TOKEN = "gate-metrics-token-Hq7vX2pL9mN4rT1wY"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
ABORT = "/api/v1/sinks/orders/epochs/0/abort"
CROSS_SITE = {"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"}


async def sink_with_a_pending_epoch(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)


def status_of_epoch_0(database_url: str) -> str:
    [(status,)] = query(database_url, "SELECT status FROM pending_sink_state WHERE epoch = 0")
    assert isinstance(status, str)
    return status


class Pulled:
    """A request body of `chunks` MiB sent as a stream, counting how much of it the server took."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.taken += 1
            yield b" " * 2**20


async def test_a_request_without_the_token_is_401_before_its_body_is_read(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    await sink_with_a_pending_epoch(admin)

    malformed = await admin.post(ABORT, content=b'{"reason": ', headers=JSON)
    assert malformed.status_code == 401, malformed.text
    assert malformed.json()["error"]["code"] == "UNAUTHENTICATED"
    body = Pulled(30)
    streamed = await admin.post(ABORT, content=body, headers=JSON)
    assert streamed.status_code == 401, streamed.text
    assert body.taken <= 1, f"{body.taken} MiB of an unauthenticated body were read"
    wrong = await admin.post(ABORT, content=b"{}", headers={**JSON, "Authorization": "Bearer wrong"})
    assert wrong.status_code == 401
    assert status_of_epoch_0(database_url) == "PENDING"


async def test_a_body_over_the_limit_is_413_and_not_read_past_it(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    await sink_with_a_pending_epoch(admin)

    declared = json.dumps({"reason": "x" * MAX_BODY_BYTES, "force": True}).encode()
    too_large = await admin.post(ABORT, content=declared, headers={**AUTH, **JSON})
    assert too_large.status_code == 413, too_large.text
    assert f"over {MAX_BODY_BYTES} bytes" in too_large.json()["error"]["message"]
    body = Pulled(30)  # no Content-Length: counted as it arrives
    streamed = await admin.post(ABORT, content=body, headers={**AUTH, **JSON})
    assert streamed.status_code == 413
    assert body.taken <= 2, f"{body.taken} MiB of a body over the limit were read"
    assert status_of_epoch_0(database_url) == "PENDING"

    within = await admin.post(ABORT, json={"reason": "within the limit", "force": True}, headers=AUTH)
    assert within.status_code == 200, within.text
    assert status_of_epoch_0(database_url) == "ABORTED"


async def test_the_console_refuses_an_action_of_no_operator_before_reading_its_form(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    await sink_with_a_pending_epoch(admin)
    body = Pulled(30)
    refused = await admin.post(
        "/console/sinks/orders/abort", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert refused.status_code in (303, 401, 403), refused.text
    assert body.taken <= 1
    login = Pulled(30)
    bounded = await admin.post(
        "/console/login", content=login, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert bounded.status_code == 413
    assert login.taken <= 2
    assert status_of_epoch_0(database_url) == "PENDING"


async def test_every_route_of_the_api_documents_the_refusals_of_the_gate(admin: AdminApp) -> None:
    """The gate answers before any route (401, 403, 413 and 421 above): a client generated from the API's schema, and
    schemathesis (test_admin_api_schema.py, which once drew a body over the limit), must find them there; and /readyz
    its 503."""
    schema = (await admin.get("/openapi.json")).json()
    operations = [
        (method, path, operation)
        for path, methods in schema["paths"].items()
        if path.startswith("/api/")
        for method, operation in methods.items()
    ]

    assert operations
    for method, path, operation in operations:
        assert {"401", "403", "413", "421"} <= set(operation["responses"]), (method, path, operation["responses"])
    assert {"401", "413"} <= set(schema["paths"]["/metrics"]["get"]["responses"])  # no host check: Prometheus
    assert "503" in schema["paths"]["/readyz"]["get"]["responses"]


async def test_the_api_and_the_console_answer_only_allowed_hosts(
    admin_factory: AdminFactory, database_url: str
) -> None:
    """DNS rebinding: a page of attacker.example whose name now resolves to the tokenless local coordinator."""
    admin = await admin_factory()  # no token: what rebinding would reach
    await sink_with_a_pending_epoch(admin)
    rebound = {"Host": "rebound.attacker.example"}

    for path in ("/api/v1/sinks", "/api/v1/sinks/orders", "/console", "/console/sinks/orders"):
        response = await admin.get(path, headers=rebound)
        assert response.status_code == 421, (path, response.status_code)
        assert "SINK_COORDINATOR_ALLOWED_HOSTS" in response.text
    reset = await admin.post(
        "/api/v1/sinks/orders/reset", json={"confirm": "orders", "reason": "rebound"}, headers=rebound
    )
    assert reset.status_code == 421
    assert query(database_url, "SELECT generation FROM sinks") == [(0,)]
    for probe in ("/healthz", "/readyz", "/metrics"):  # the kubelet and Prometheus send the pod's address
        assert (await admin.get(probe, headers={"Host": "10.1.2.3:8080"})).status_code == 200, probe
    assert (await admin.get("/api/v1/sinks", headers={"Host": "COORDINATOR:8080"})).status_code == 200


async def test_answers_forbid_framing_and_sniffing(admin_factory: AdminFactory) -> None:
    admin = await admin_factory()
    for path in ("/console/login", "/console", "/api/v1/sinks", "/healthz"):
        response = await admin.get(path)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["x-frame-options"] == "DENY", path
    policy = (await admin.get("/console")).headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "form-action 'self'"):
        assert directive in policy


async def test_a_cross_site_post_is_refused_even_without_a_body(admin_factory: AdminFactory, database_url: str) -> None:
    admin = await admin_factory()  # no token: a page elsewhere could make the browser post
    await sink_with_a_pending_epoch(admin)
    for path in ("/api/v1/sinks/orders/resume", "/api/v1/sinks/orders/maintenance/run"):
        refused = await admin.post(path, headers=CROSS_SITE)
        assert refused.status_code == 403, (path, refused.text)
        assert "cross-site" in refused.json()["error"]["message"]
        foreign_origin = await admin.post(path, headers={"Origin": "https://attacker.example"})
        assert foreign_origin.status_code == 403, path
    assert query(database_url, "SELECT count(*) FROM maintenance_runs") == [(0,)]
    reset = await admin.post(
        "/api/v1/sinks/orders/reset", json={"confirm": "orders", "reason": "x"}, headers=CROSS_SITE
    )
    assert reset.status_code == 403
    assert query(database_url, "SELECT generation FROM sinks") == [(0,)]

    # curl and scripts send no Origin; the console's own pages post from the same origin.
    assert (await admin.post("/api/v1/sinks/orders/resume")).status_code == 200
    same_origin = {"Origin": "http://coordinator", "Sec-Fetch-Site": "same-origin"}
    assert (await admin.post("/api/v1/sinks/orders/resume", headers=same_origin)).status_code == 200
    # Behind a proxy that rewrites the Host, the browser's own verdict holds.
    proxied = {"Origin": "https://console.example", "Sec-Fetch-Site": "same-origin"}
    assert (await admin.post("/api/v1/sinks/orders/resume", headers=proxied)).status_code == 200


async def test_metrics_need_a_token_where_reads_do(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(admin_token=TOKEN, metrics_token=METRICS_TOKEN)
    await sink_with_a_pending_epoch(admin)

    anonymous = await admin.get("/metrics")
    assert anonymous.status_code == 401
    assert "orders" not in anonymous.text
    for token in (METRICS_TOKEN, TOKEN):
        scraped = await admin.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert scraped.status_code == 200
        assert 'sink="orders"' in scraped.text
    # The metrics token opens /metrics and nothing else.
    metrics_bearer = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    assert (await admin.get("/api/v1/sinks", headers=metrics_bearer)).status_code == 401
    assert (await admin.post(ABORT, json={"reason": "x"}, headers=metrics_bearer)).status_code == 401


class CountedReads:
    """The operations, counting how often the sinks are read."""

    def __init__(self, operations: Operations) -> None:
        self.operations = operations
        self.reads = 0

    async def sinks(self) -> list[SinkOverview]:
        self.reads += 1
        return await self.operations.sinks()


async def test_concurrent_and_repeated_scrapes_share_one_read(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(metrics_cache_seconds=60.0)
    await sink_with_a_pending_epoch(admin)
    counted = CountedReads(admin.app.state.operations)
    admin.app.dependency_overrides[operations_of] = lambda: counted

    scrapes = await asyncio.gather(*(admin.get("/metrics") for _ in range(20)))
    scrapes.append(await admin.get("/metrics"))
    assert {scrape.status_code for scrape in scrapes} == {200}
    assert counted.reads == 1
    assert all('sink_coordinator_pending_epochs{sink="orders"} 1.0' in scrape.text for scrape in scrapes)


async def test_readyz_says_what_is_wrong_without_internals(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase
) -> None:
    admin = await admin_factory(catalog=catalog_database.properties, readiness_dependency_grace_seconds=0)
    checks = {"metastore": "ok", "catalog": "ok", "warehouse": "ok"}
    assert (await admin.get("/readyz")).json() == {"ready": True, "checks": checks}
    catalog_database.go_down()

    response = await admin.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["metastore"] == "ok"
    assert checks["catalog"].startswith("unreachable")
    for internal in ("SELECT", "psycopg", "sqlalchemy", catalog_database.name, "Error", "[SQL"):
        assert internal not in response.text, internal


async def test_readyz_says_when_the_local_warehouse_is_gone(admin: AdminApp, tmp_path: Path) -> None:
    """The tables' metadata and files were in it: a pod's scratch disk that went with the pod, say."""
    checks = {"metastore": "ok", "catalog": "ok", "warehouse": "ok"}
    assert (await admin.get("/readyz")).json() == {"ready": True, "checks": checks}
    shutil.rmtree(tmp_path / "coordinator" / "warehouse")

    response = await admin.get("/readyz")
    assert response.status_code == 503
    warehouse = response.json()["checks"]["warehouse"]
    assert warehouse.startswith(f"missing: {tmp_path / 'coordinator' / 'warehouse'} is not a directory")


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_unknown_route_costs_nothing_without_the_token(admin_factory: AdminFactory, method: str) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    response = await admin.http.request(method, "/api/v1/sinks/orders/nothing-here", content=Pulled(30))
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("table", "body", "status"),
    [
        ("db.missing", {"reason": "x"}, 404),
        ("no_namespace", {"reason": "x"}, 422),
        ("db.a%2F..%2Fb", {"reason": "x"}, 404),  # a path of its own: no route
        ("db..orders", {"reason": "x"}, 422),
        ("db.nul%00", {"reason": "x"}, 422),
        ("db." + "t" * 300, {"reason": "x"}, 422),
        ("db.orders", {"reason": ""}, 422),
        ("db.orders", {"reason": "nul \x00"}, 422),
        ("db.orders", {"reason": "x" * 2001}, 422),
        ("db.orders", {}, 422),
    ],
)
async def test_adopting_a_table_refuses_what_is_wrong_and_changes_nothing(
    admin_factory: AdminFactory, table: str, body: dict[str, str], status: int
) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    await sink_with_a_pending_epoch(admin)  # db.orders: the coordinator's own
    before = admin.runtime.iceberg.catalog.load_table("db.orders").metadata_location
    response = await admin.post(f"/api/v1/tables/{table}/adopt", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    assert admin.runtime.iceberg.catalog.load_table("db.orders").metadata_location == before


async def test_the_api_docs_page_loads_nothing_from_elsewhere(admin: AdminApp) -> None:
    """Issue 26.9: /docs loaded Swagger UI from a CDN, and was blank offline. Its script and style are the
    coordinator's own, served to anyone who may see /docs (no token, as /docs and /openapi.json)."""
    for page, needs in (("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")), ("/redoc", ("redoc.standalone.js",))):
        response = await admin.get(page)
        assert response.status_code == 200
        assert not re.search(r"""(?:src|href)=["']?(?:https?:)?//""", response.text), page
        for asset in needs:
            [url] = re.findall(rf"""["']([^"']*/{re.escape(asset)})["']""", response.text)
            served = await admin.get(url)
            assert served.status_code == 200, url
            assert len(served.content) > 10_000, url


async def test_a_blip_of_a_shared_dependency_keeps_the_replica_ready_and_says_so(
    admin_factory: AdminFactory, catalog_database: CatalogDatabase
) -> None:
    """On-call review: a dependency every replica shares failing for a moment took every replica out of the Service.
    Within READINESS_DEPENDENCY_GRACE_SECONDS the replica stays ready, and /readyz says what fails."""
    admin = await admin_factory(catalog=catalog_database.properties, readiness_dependency_grace_seconds=3600)
    catalog_database.go_down()
    response = await admin.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["catalog"].startswith("ok (unreachable")
