"""The gRPC adapter: proto messages to protocol calls and their answers back (wire), errors to status codes,
and writer auth."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator_service.database import DATA_ERRORS, unstorable
from coordinator_service.errors import CoordinatorError, Unavailable, cause
from coordinator_service.precommit_files import FileFacts
from coordinator_service.protocol import Coordinator, PreCommitRequest, TableRequest
from coordinator_service.rpc import sink_coordinator_pb2 as pb
from coordinator_service.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.wire import to_message

log = structlog.get_logger(__name__)

Response = TypeVar("Response")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SinkCoordinator"].full_name


async def _answer(
    context: grpc.aio.ServicerContext[Any, Any], call: Awaitable[Response], **log_context: object
) -> Response:
    """Await the protocol call with log_context (sink, epoch) on every line it logs; errors become statuses.

    A value PostgreSQL refused that reached this far unchecked is still the request's fault: INVALID_ARGUMENT."""
    with structlog.contextvars.bound_contextvars(**log_context):
        try:
            return await call
        except CoordinatorError as error:
            await _abort(context, error)
        except DATA_ERRORS as error:
            await _abort(context, unstorable(error))


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: CoordinatorError) -> NoReturn:
    if isinstance(error, Unavailable):
        log.warning("request failed: dependency unavailable", error=error.message)
    await context.abort(error.grpc_code, error.message)


class SinkCoordinatorServicer(pb_grpc.SinkCoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    async def RegisterWriter(  # noqa: N802 (gRPC method names)
        self, request: pb.RegisterWriterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegisterWriterResponse:
        registration = await _answer(
            context,
            self.coordinator.register_writer(
                sink=request.sink,
                table=request.table,
                checkpointed_epoch=request.checkpointed_epoch,
                writer_count=request.writer_count or 1,
                arrow_schema=request.arrow_schema,
                partition_by=tuple(request.partition_by),
            ),
            sink=request.sink,
        )
        return to_message(registration, pb.RegisterWriterResponse)

    async def PreCommit(  # noqa: N802
        self, request: pb.PreCommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreCommitResponse:
        result = await _answer(
            context,
            self.coordinator.pre_commit(
                PreCommitRequest(
                    sink=request.sink,
                    epoch=request.epoch,
                    writer_term=request.writer_term,
                    writer_id=request.writer_id,
                    paths=tuple(data_file.path for data_file in request.data_files),
                    properties=dict(request.properties),
                    evolve_schema=request.evolve_schema,
                    file_facts={
                        data_file.path: FileFacts(data_file.parquet_footer, data_file.file_size_in_bytes)
                        for data_file in request.data_files
                        if data_file.parquet_footer or data_file.file_size_in_bytes
                    },
                    files_directory=request.files_directory,
                    file_tables={
                        data_file.path: data_file.table for data_file in request.data_files if data_file.table
                    },
                )
            ),
            sink=request.sink,
            epoch=request.epoch,
        )
        return to_message(result, pb.PreCommitResponse)

    async def CommitCheckpoint(  # noqa: N802
        self, request: pb.CommitCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CommitCheckpointResponse:
        result = await _answer(
            context,
            self.coordinator.commit_checkpoint(
                sink=request.sink, epoch=request.epoch, writer_term=request.writer_term, wait=request.wait
            ),
            sink=request.sink,
            epoch=request.epoch,
        )
        return to_message(result, pb.CommitCheckpointResponse)

    async def GetSinkState(  # noqa: N802
        self, request: pb.GetSinkStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetSinkStateResponse:
        state = await _answer(context, self.coordinator.sink_state(request.sink), sink=request.sink)
        return to_message(state, pb.GetSinkStateResponse)

    async def EnsureTables(  # noqa: N802
        self, request: pb.EnsureTablesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EnsureTablesResponse:
        ensured = await _answer(
            context,
            self.coordinator.ensure_tables(
                sink=request.sink,
                writer_term=request.writer_term,
                tables=[
                    TableRequest(
                        table=spec.table, arrow_schema=spec.arrow_schema, partition_by=tuple(spec.partition_by)
                    )
                    for spec in request.tables
                ],
            ),
            sink=request.sink,
        )
        return to_message(ensured, pb.EnsureTablesResponse)


class WriterTokenInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <WRITER_TOKEN>` on every call except health and reflection."""

    _OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method or ""
        if method.startswith(self._OPEN_PREFIXES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        sent = metadata.get("authorization")
        if sent is None:
            return _deny("no writer token: send metadata 'authorization: Bearer <SINK_COORDINATOR_WRITER_TOKEN>'")
        sent_bytes = sent.encode() if isinstance(sent, str) else sent
        if not hmac.compare_digest(sent_bytes, self._expected):
            return _deny("the writer token is wrong")
        return await continuation(handler_call_details)


class RequestDecodingInterceptor(grpc.aio.ServerInterceptor):
    """Answers a request that does not decode (corrupt bytes, a string that is not UTF-8) with INVALID_ARGUMENT.

    grpc would answer UNKNOWN ("Unexpected DecodeError"); here the unary handlers take the raw bytes and decode
    them themselves. Wrapped handlers are kept per method: they do not change while the server runs.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method or ""
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        # On the asyncio server, every unary handler (ours, health) is a coroutine function.
        behavior = cast(Callable[..., Awaitable[Any]], handler.unary_unary)

        async def decoding(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                request = decode(raw)
            except DecodeError as error:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message: {cause(error)}"
                )
            return await behavior(request, context)

        wrapped = self._wrapped[method] = grpc.unary_unary_rpc_method_handler(
            decoding, response_serializer=handler.response_serializer
        )
        return wrapped


def _deny(message: str) -> grpc.RpcMethodHandler[Any, Any]:
    async def abort(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


def build_server(
    coordinator: Coordinator,
    bind_address: str,
    writer_token: str | None,
    tls_credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The gRPC server with the coordinator, health and reflection services; returns the bound port.

    With tls_credentials it serves TLS only (there is no plaintext port beside it).
    """
    # The token is checked first: a caller without it learns nothing, not even whether its request decodes.
    interceptors: list[grpc.aio.ServerInterceptor] = [WriterTokenInterceptor(writer_token)] if writer_token else []
    server = grpc.aio.server(interceptors=[*interceptors, RequestDecodingInterceptor()])
    pb_grpc.add_SinkCoordinatorServicer_to_server(SinkCoordinatorServicer(coordinator), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    port = (
        server.add_secure_port(bind_address, tls_credentials)
        if tls_credentials is not None
        else server.add_insecure_port(bind_address)
    )
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {bind_address}: the address is in use or not local")
    return server, health_servicer, port
