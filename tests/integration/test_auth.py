"""Admin bearer token (REST), writer token (gRPC) and TLS, on the real app and the real service process."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from pydantic import ValidationError

from coordinator_service.contract.client import CoordinatorClient, CoordinatorRpcError
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from coordinator_service.settings import Settings
from tests.fixtures.admin import AdminApp
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess

AdminFactory = Callable[..., Awaitable[AdminApp]]
ADMIN_TOKEN = "admin-token-5f1c-Zq3vX9pL2mN8rT5wY7bC"
WRITER_TOKEN = "writer-token-9a2e-Hq7vX2pL9mN4rT1wY"
ABORT = "/api/v1/sinks/orders/epochs/0/abort"
READ_ROUTES = ("/api/v1/sinks", "/api/v1/sinks/orders", "/api/v1/sinks/orders/epochs", "/api/v1/sinks/orders/epochs/0")
OPEN_ROUTES = ("/healthz", "/readyz", "/docs", "/openapi.json")
WRONG_CREDENTIALS: tuple[tuple[dict[str, str], str], ...] = (
    ({}, "needs the admin token"),
    ({"Authorization": "Bearer not-the-token"}, "the admin token is wrong"),
    ({"Authorization": f"Basic {ADMIN_TOKEN}"}, "needs the admin token"),
    ({"Authorization": f"Bearer {ADMIN_TOKEN}x"}, "the admin token is wrong"),
)
RIGHT = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def assert_unauthenticated(response: httpx.Response, message: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "UNAUTHENTICATED"
    assert message in error["message"]


async def sink_with_a_pending_epoch(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)


async def test_mutating_routes_need_the_admin_token(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(admin_token=ADMIN_TOKEN, admin_read_requires_token=False)
    await sink_with_a_pending_epoch(admin)
    for headers, message in WRONG_CREDENTIALS:
        assert_unauthenticated(await admin.post(ABORT, json={"reason": "x"}, headers=headers), message)
        reset = {"confirm": "orders", "reason": "x"}
        assert_unauthenticated(await admin.post("/api/v1/sinks/orders/reset", json=reset, headers=headers), message)
    for path in (*READ_ROUTES, "/metrics"):  # reads opened with ADMIN_READ_REQUIRES_TOKEN=false
        assert (await admin.get(path)).status_code == 200, path
    sink = (await admin.get("/api/v1/sinks/orders")).json()
    assert (sink["writer_term"], sink["generation"], sink["pending_epochs"]) == (1, 0, 1)

    response = await admin.post(ABORT, json={"reason": "with the token", "force": True}, headers=RIGHT)
    assert response.status_code == 200
    assert response.json()["epoch"]["reason"].startswith("operator abort by admin from ")


async def test_read_routes_need_the_token_unless_opened(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(admin_token=ADMIN_TOKEN)  # reads need the token by default
    await sink_with_a_pending_epoch(admin)
    for path in READ_ROUTES:
        for headers, message in WRONG_CREDENTIALS:
            assert_unauthenticated(await admin.get(path, headers=headers), message)
        assert (await admin.get(path, headers=RIGHT)).status_code == 200, path
    for path in OPEN_ROUTES:
        assert (await admin.get(path)).status_code == 200, path


def test_settings_refuse_half_configurations(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="ADMIN_READ_REQUIRES_TOKEN is true but no"):
        Settings(admin_read_requires_token=True)
    with pytest.raises(ValidationError, match="TLS_CERT_FILE and SINK_COORDINATOR_TLS_KEY_FILE, or neither"):
        Settings(tls_cert_file=tmp_path / "cert.pem")
    token_file = tmp_path / "token"
    token_file.write_text(f"{ADMIN_TOKEN}\n")
    settings = Settings(admin_token_file=token_file, admin_read_requires_token=True)
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == ADMIN_TOKEN
    assert ADMIN_TOKEN not in repr(settings)


def test_grpc_needs_the_writer_token_and_no_secret_is_logged(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN, SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN)
    schema = ORDERS.serialize().to_pybytes()
    for token, message in ((None, "no writer token"), ("wrong", "the writer token is wrong")):
        with process.client(token=token) as client, pytest.raises(CoordinatorRpcError) as refused:
            client.register_writer("orders", "db.orders", -1, arrow_schema=schema)
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert message in refused.value.message
    with process.client(token=WRITER_TOKEN) as client:
        assert client.register_writer("orders", "db.orders", -1, arrow_schema=schema).writer_term == 1
        assert client.sink_state("orders").writer_term == 1
    # The admin token is not a writer token, and the writer token is not an admin token.
    with process.client(token=ADMIN_TOKEN) as client, pytest.raises(CoordinatorRpcError) as refused:
        client.sink_state("orders")
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    reset = {"confirm": "orders", "reason": "x"}
    writer_bearer = {"Authorization": f"Bearer {WRITER_TOKEN}"}
    response = httpx.post(f"{process.http_url}/api/v1/sinks/orders/reset", json=reset, headers=writer_bearer)
    assert response.status_code == 401
    assert httpx.get(f"{process.http_url}/api/v1/sinks/orders", headers=RIGHT).json()["writer_term"] == 1

    process.stop()
    logged = json.dumps(process.drain_logs())
    assert "sink-coordinator serving" in logged
    assert WRITER_TOKEN not in logged
    assert ADMIN_TOKEN not in logged


def test_the_recorded_operator_address_is_the_peers_unless_a_proxy_is_trusted(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """X-Forwarded-For from 127.0.0.1 (kubectl port-forward arrives from there) names no operator."""
    process = coordinator_factory(SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN)
    with process.client() as client:
        registration = client.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        for epoch in (0, 1):
            client.pre_commit("orders", epoch, registration.writer_term, [])
    spoofed = {**RIGHT, "X-Forwarded-For": "203.0.113.9"}
    response = httpx.post(
        f"{process.http_url}/api/v1/sinks/orders/epochs/0/abort", json={"reason": "x", "force": True}, headers=spoofed
    )
    assert response.status_code == 200, response.text
    reason = response.json()["epoch"]["reason"]
    assert "203.0.113.9" not in reason and "from 127.0.0.1:" in reason
    process.stop()

    trusting = coordinator_factory(
        SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN, SINK_COORDINATOR_TRUSTED_PROXIES="127.0.0.1"
    )
    response = httpx.post(
        f"{trusting.http_url}/api/v1/sinks/orders/epochs/1/abort", json={"reason": "x", "force": True}, headers=spoofed
    )
    assert response.status_code == 200, response.text
    assert "from 203.0.113.9" in response.json()["epoch"]["reason"]


@dataclass
class TlsCoordinatorProcess(CoordinatorProcess):
    def wait_serving(self) -> None:
        # The fixture's own wait speaks plaintext gRPC; a TLS server says it serves in its log.
        self.wait_for_log("sink-coordinator serving", timeout=60.0)


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    certificate, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(certificate),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key


def test_tls_for_grpc_and_http(database_url: str, tmp_path: Path) -> None:
    certificate, key = self_signed_certificate(tmp_path)
    migrate(normalize_url(database_url))
    process = TlsCoordinatorProcess(database_url=database_url, data_dir=tmp_path / "coordinator")
    process.start(
        SINK_COORDINATOR_TLS_CERT_FILE=str(certificate),
        SINK_COORDINATOR_TLS_KEY_FILE=str(key),
        SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN,
    )
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate.read_bytes())
        with CoordinatorClient(process.target, token=WRITER_TOKEN, credentials=credentials) as client:
            registration = client.register_writer(
                "orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes()
            )
            assert registration.writer_term == 1
        with CoordinatorClient(process.target, token=WRITER_TOKEN, retry_seconds=0.0) as plaintext:
            with pytest.raises(CoordinatorRpcError) as refused:
                plaintext.sink_state("orders")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE

        https_url = process.http_url.replace("http://", "https://")
        trusted = ssl.create_default_context(cafile=str(certificate))
        response = httpx.get(f"{https_url}/api/v1/sinks/orders", verify=trusted)
        assert response.status_code == 200
        assert response.json()["writer_term"] == 1
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{https_url}/healthz")  # the system's trust store does not know the certificate
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{process.http_url}/healthz")
    finally:
        process.stop()
