"""The gRPC port without a writer token: only the health Check answers; calls and streams are bounded, and
connections do not live forever. Against the real service process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from tests.fixtures.admin import eventually
from tests.fixtures.coordinator import CoordinatorProcess

WRITER_TOKEN = "grpc-gate-writer-Zq3vX9pL2mN8rT5wY7b"
WITH_TOKEN = (("authorization", f"Bearer {WRITER_TOKEN}"),)
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


async def reflection_services(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    listing = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    call = stub.ServerReflectionInfo(listing, metadata=metadata)
    async for answer in call:
        return [service.name for service in answer.list_services_response.service]
    return []


async def test_without_a_token_only_the_health_check_answers(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN)
    async with grpc.aio.insecure_channel(process.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        checked = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert checked.status == health_pb2.HealthCheckResponse.SERVING

        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await watch.read()
        assert refused.value.code() == UNAUTHENTICATED
        # Refused at the call's start, before any message: a request sent meanwhile could fail on the client's side
        # first (grpc's "Internal error from Core" once the server ended the call), so none is sent.
        unopened = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=10)
        assert await unopened.code() == UNAUTHENTICATED
        stub = pb_grpc.SinkCoordinatorStub(channel)
        for call, request in (
            (stub.RegisterWriter, pb.RegisterWriterRequest(sink="orders", table="db.orders")),
            (stub.PreCommit, pb.PreCommitRequest(sink="orders")),
            (stub.CommitCheckpoint, pb.CommitCheckpointRequest(sink="orders")),
            (stub.GetSinkState, pb.GetSinkStateRequest(sink="orders")),
            (stub.EnsureTables, pb.EnsureTablesRequest(sink="orders")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(request, timeout=10)
            assert refused.value.code() == UNAUTHENTICATED, call

        # The writer token opens the streams.
        watched = health.Watch(health_pb2.HealthCheckRequest(service=""), metadata=WITH_TOKEN, timeout=10)
        assert (await watched.read()).status == health_pb2.HealthCheckResponse.SERVING
        watched.cancel()
        assert "sinkcoord.v1.SinkCoordinator" in await reflection_services(channel, WITH_TOKEN)


async def test_concurrent_calls_are_bounded(coordinator_factory: Callable[..., CoordinatorProcess]) -> None:
    process = coordinator_factory(
        SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN, SINK_COORDINATOR_GRPC_MAX_CONCURRENT_RPCS="4"
    )
    async with grpc.aio.insecure_channel(process.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        held = [health.Watch(health_pb2.HealthCheckRequest(service=""), metadata=WITH_TOKEN) for _ in range(4)]
        for watch in held:
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for watch in held:
            watch.cancel()

        async def answered() -> bool:
            try:
                await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False
            return True

        # A slot frees once the server has seen a cancelled stream end: nothing tells the client when.
        await eventually(answered, "a call answered after the held streams ended")


async def test_a_connection_is_closed_after_its_maximum_age(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_GRPC_MAX_CONNECTION_AGE_SECONDS="1")
    async with grpc.aio.insecure_channel(process.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        async with asyncio.timeout(30):  # the server's GOAWAY takes the channel out of READY
            await channel.wait_for_state_change(grpc.ChannelConnectivity.READY)
        assert channel.get_state() != grpc.ChannelConnectivity.READY
