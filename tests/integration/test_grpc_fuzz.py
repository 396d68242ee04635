"""A fuzz run of the gRPC port without a writer token: any method, any bytes, any metadata. Nothing but the health
Check answers, nothing is created, and a flood of large anonymous calls costs the process a bounded amount."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog

from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.grpc_gate import HEALTH_CHECK, SERVICE_NAME
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess
from tests.fixtures.postgres import query

# Anonymous calls per round of the flood, half RegisterWriter with a body of 4 MiB, half health Watch.
FLOOD_CALLS = 400
FLOOD_ROUNDS = 3
ADMIN_TOKEN = "fuzz-admin-token-Zq3vX9pL2mN8rT5wY7bC"
WRITER_TOKEN = "fuzz-writer-token-Hq7vX2pL9mN4rT1wY6b"
METHODS = [
    *(f"/{SERVICE_NAME}/{method.name}" for method in pb.DESCRIPTOR.services_by_name["SinkCoordinator"].methods),
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
]
VALID_REQUESTS = [
    pb.RegisterWriterRequest(sink="orders", table="db.orders", arrow_schema=ORDERS.serialize().to_pybytes()),
    pb.EnsureTablesRequest(sink="orders", writer_term=1, tables=[pb.TableSpec(table="db.other")]),
    pb.PreCommitRequest(sink="orders", epoch=0, writer_term=1, data_files=[pb.DataFile(path="file:///etc/passwd")]),
    pb.CommitCheckpointRequest(sink="orders", epoch=0, writer_term=1, wait=True),
    pb.GetSinkStateRequest(sink="orders"),
]
AUTHORIZATION = st.one_of(
    st.none(),
    st.sampled_from(["", "Bearer", "Bearer ", f"Bearer {ADMIN_TOKEN}", f"Basic {WRITER_TOKEN}", WRITER_TOKEN]),
    st.sampled_from([f"Bearer {WRITER_TOKEN[:-1]}", f"bearer {WRITER_TOKEN}x", f"Bearer {WRITER_TOKEN} "]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=100),
)


def rss_mib(process: CoordinatorProcess) -> float:
    assert process.process is not None
    status = Path(f"/proc/{process.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def nothing_created(database_url: str, catalog: Catalog) -> None:
    assert query(database_url, "SELECT count(*) FROM sinks") == [(0,)]
    assert catalog.list_namespaces() == []


def test_without_a_token_no_call_does_work(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str, catalog: Catalog
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN, SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN)
    channel = grpc.insecure_channel(process.target)
    answers: dict[str, set[grpc.StatusCode]] = {}

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        method=st.one_of(
            st.sampled_from([*METHODS, HEALTH_CHECK]),
            st.text(alphabet="/abcdefghijklmnopqrstuvwxyz.", min_size=1, max_size=40).map(lambda m: "/" + m),
        ),
        payload=st.one_of(
            st.binary(max_size=4096), st.sampled_from(VALID_REQUESTS).map(lambda r: r.SerializeToString())
        ),
        authorization=AUTHORIZATION,
    )
    def call(method: str, payload: bytes, authorization: str | None) -> None:
        metadata = () if authorization is None else (("authorization", authorization),)
        rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            rpc(payload, metadata=metadata, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
        answers.setdefault(method if method in (*METHODS, HEALTH_CHECK) else "unknown", set()).add(code)
        if method == HEALTH_CHECK:
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), code
        else:
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)

    call()
    channel.close()
    assert answers["unknown"] == {grpc.StatusCode.UNAUTHENTICATED}  # not even UNIMPLEMENTED: nothing is learnt
    nothing_created(database_url, catalog)


async def test_a_flood_of_large_anonymous_calls_costs_a_bounded_amount(
    coordinator_factory: Callable[..., CoordinatorProcess], database_url: str, catalog: Catalog
) -> None:
    process = coordinator_factory(SINK_COORDINATOR_WRITER_TOKEN=WRITER_TOKEN, SINK_COORDINATOR_ADMIN_TOKEN=ADMIN_TOKEN)
    with process.client(token=WRITER_TOKEN) as writer:
        writer.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
    before = rss_mib(process)
    payload = b"\x0a" + b"\xff" * (4 * 2**20 - 64)  # just under gRPC's 4 MiB message limit
    codes: list[tuple[grpc.StatusCode, str]] = []
    async with grpc.aio.insecure_channel(process.target) as channel:
        register = channel.unary_unary(f"/{SERVICE_NAME}/RegisterWriter")
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")

        async def anonymous(index: int) -> None:
            try:
                if index % 2:
                    await register(payload, timeout=30)
                else:
                    async for _ in watch(b"", timeout=30):
                        pass
                codes.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as error:
                codes.append((error.code(), error.details() or ""))

        started = time.monotonic()
        for _ in range(FLOOD_ROUNDS):
            await asyncio.gather(*(anonymous(index) for index in range(FLOOD_CALLS)))
        seconds = time.monotonic() - started
    grown = rss_mib(process) - before
    # Refused for want of a token, of a free call slot, or of a free stream on the connection (REFUSED_STREAM,
    # which the client may retry: the stream was never processed).
    refusals = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    unexpected = [(code, details) for code, details in codes if code not in refusals and "error code 7" not in details]
    assert not unexpected, unexpected[:3]
    # The server never reads an anonymous body, and takes at most a stream's initial window of it off the wire;
    # the old server held every anonymous stream and read every body: 224 -> 893 MiB in one round.
    assert grown < 64, f"{FLOOD_ROUNDS} x {FLOOD_CALLS} anonymous calls grew the process by {grown:.0f} MiB"
    # The writer and the operator are still answered at once.
    with process.client(token=WRITER_TOKEN) as writer:
        assert writer.sink_state("orders").writer_term == 1
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"{process.http_url}/readyz", timeout=10)
    assert ready.status_code == 200
    print(
        f"{FLOOD_ROUNDS} x {FLOOD_CALLS} anonymous calls: {seconds:.2f} s, RSS {before:.0f} -> {before + grown:.0f} MiB"
    )
    assert query(database_url, "SELECT count(*) FROM sinks") == [(1,)]
