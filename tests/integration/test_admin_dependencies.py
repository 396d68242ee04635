"""The admin routes take their dependencies from app.state through admin_deps: a test swaps them with
app.dependency_overrides, the real runtime behind."""

from __future__ import annotations

from pydantic import SecretStr

from coordinator_service.admin.auth import AdminAuth
from coordinator_service.admin.deps import auth_of, operator
from coordinator_service.engine.operator.answers import Operator
from tests.fixtures.admin import AdminApp

TOKEN = "overridden-token"
ABORT = "/api/v1/sinks/orders/epochs/0/abort"


async def test_an_overridden_token_check_guards_the_routes(admin: AdminApp) -> None:
    """The runtime has no admin token (every route open) until the test puts one in the token check."""
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    assert (await admin.get("/api/v1/sinks")).status_code == 200

    admin.app.dependency_overrides[auth_of] = lambda: AdminAuth(SecretStr(TOKEN), read_requires_token=True)
    for response in (
        await admin.get("/api/v1/sinks"),
        await admin.post(ABORT, json={"reason": "override", "force": True}),
    ):
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    assert (await admin.get("/metrics")).status_code == 200  # never behind the token
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    assert (await admin.get("/api/v1/sinks", headers=authorized)).status_code == 200
    aborted = await admin.post(ABORT, json={"reason": "override", "force": True}, headers=authorized)
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["epoch"]["reason"] == "operator abort by admin from 10.0.0.7:40123: override"

    admin.app.dependency_overrides.clear()
    assert (await admin.get("/api/v1/sinks")).status_code == 200


async def test_an_overridden_operator_is_who_the_epoch_records(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    admin.app.dependency_overrides[operator] = lambda: Operator(identity="on-call", address="console")

    response = await admin.post(ABORT, json={"reason": "bad batch", "force": True})
    assert response.status_code == 200, response.text
    assert response.json()["epoch"]["reason"] == "operator abort by on-call from console: bad batch"
