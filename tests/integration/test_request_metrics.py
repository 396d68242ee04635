"""gRPC and HTTP requests counted by status code, refusals of the gates included, from 0 for what alerts read."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc.sink_coordinator_pb2_grpc import SinkCoordinatorStub
from coordinator_service.grpc_server import build_server
from tests.fixtures.admin import AdminApp, AdminFactory

TOKEN = "w" + "0123456789abcdefghijklmnopqrstuvwxyz"
SERVICE = "sinkcoord.v1.SinkCoordinator"
GRPC_LABELS = ("service", "method", "code")
HTTP_LABELS = ("method", "route", "code")


async def counted(admin: AdminApp, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """One counter of a scrape: its value by the values of `labels`."""
    text = (await admin.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})).text
    return {
        tuple(sample.labels[label] for label in labels): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


ADMIN_TOKEN = "a" + "0123456789abcdefghijklmnopqrstuvwxyz"


async def test_grpc_calls_are_counted_by_method_and_code_refusals_included(admin_factory: AdminFactory) -> None:
    """On-call review: nothing counted the writers' calls by outcome; a rate of UNAVAILABLE or UNAUTHENTICATED
    answers could not be alerted on."""
    admin = await admin_factory(writer_token=TOKEN, admin_token=ADMIN_TOKEN, metrics_cache_seconds=0.0)
    server, _, port = build_server(admin.runtime.coordinator, "127.0.0.1:0", admin.runtime.settings)
    await server.start()
    try:
        before = await counted(admin, "sink_coordinator_grpc_requests_total", GRPC_LABELS)
        # Every method of the coordinator, and every code, from the start.
        for method in pb.DESCRIPTOR.services_by_name["SinkCoordinator"].methods:
            for code in grpc.StatusCode:
                assert (SERVICE, method.name, code.name) in before, (method.name, code.name)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = SinkCoordinatorStub(channel)
            authorized = (("authorization", f"Bearer {TOKEN}"),)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetSinkState(pb.GetSinkStateRequest(sink="orders"))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.GetSinkState(pb.GetSinkStateRequest(sink="orders"), metadata=authorized)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            await admin.register("orders")
            await stub.GetSinkState(pb.GetSinkStateRequest(sink="orders"), metadata=authorized)
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await channel.unary_unary("/sinkcoord.v1.SinkCoordinator/Nothing")(b"", metadata=authorized)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
    after = await counted(admin, "sink_coordinator_grpc_requests_total", GRPC_LABELS)
    grown = {labels: after[labels] - before.get(labels, 0) for labels in after if after[labels] != before.get(labels)}
    assert grown == {
        (SERVICE, "GetSinkState", "UNAUTHENTICATED"): 1,
        (SERVICE, "GetSinkState", "NOT_FOUND"): 1,
        (SERVICE, "GetSinkState", "OK"): 1,
        ("unknown", "unknown", "UNIMPLEMENTED"): 1,
    }


async def test_http_requests_are_counted_by_route_template_and_code_refusals_included(
    admin_factory: AdminFactory,
) -> None:
    admin = await admin_factory(admin_token=ADMIN_TOKEN, metrics_cache_seconds=0.0)
    before = await counted(admin, "sink_coordinator_http_requests_total", HTTP_LABELS)
    # What an alert reads exists from the start (the registry is the process's: other tests may have counted).
    assert ("GET", "/api/v1/sinks/{sink}", "500") in before
    assert ("POST", "/api/v1/sinks/{sink}/reset", "503") in before
    assert (await admin.get("/api/v1/sinks/missing")).status_code == 401  # the gate's refusal: no token
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert (await admin.get("/api/v1/sinks/missing", headers=headers)).status_code == 404
    assert (await admin.get("/no/such/page")).status_code == 404
    assert (await admin.get("/healthz")).status_code == 200
    after = await counted(admin, "sink_coordinator_http_requests_total", HTTP_LABELS)
    grown = {labels: after[labels] - before.get(labels, 0) for labels in after if after[labels] != before.get(labels)}
    assert grown == {
        ("GET", "/api/v1/sinks/{sink}", "401"): 1,
        ("GET", "/api/v1/sinks/{sink}", "404"): 1,
        ("GET", "other", "404"): 1,
        ("GET", "/healthz", "200"): 1,
        ("GET", "/metrics", "200"): 1,  # the scrape that read `before`
    }
