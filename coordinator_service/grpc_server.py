"""The gRPC adapter: proto messages to protocol calls and their answers back (wire), errors to status codes;
every call passes the writer gate (coordinator_service.grpc_gate) first."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final, NoReturn, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator_service import grpc_requests
from coordinator_service.contract.errors import CannotServe, CoordinatorError, Unavailable
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.contract.wire import to_message
from coordinator_service.engine.protocol import Coordinator
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.grpc_gate import SERVICE_NAME, Serving, WriterGate
from coordinator_service.listening import grpc_port_option
from coordinator_service.log.database import DATA_ERRORS, Database, unstorable
from coordinator_service.settings import Settings
from coordinator_service.settings.bounds import ENV_PREFIX
from coordinator_service.tables.precommit_files import FileFacts
from coordinator_service.writer_scopes import Credentials

log = structlog.get_logger(__name__)

Response = TypeVar("Response")

# How long a connection's calls may still run after it reached its maximum age: a multi-writer pre-commit
# waiting for the epoch's other writers, a CommitCheckpoint waiting for its commit.
CONNECTION_AGE_GRACE_SECONDS: Final = 300.0


async def _answer(
    context: grpc.aio.ServicerContext[Any, Any],
    database: Database,
    call: Coroutine[Any, Any, Response],
    **log_context: object,
) -> Response:
    """Await the protocol call with log_context (sink, epoch) on every line it logs; errors become statuses.

    While the metastore does not answer (its watch, Database.check_answering) the call is UNAVAILABLE at once,
    not at the writer's deadline. A value PostgreSQL refused that reached this far unchecked is still the
    request's fault: INVALID_ARGUMENT."""
    # Who asked: the writer's address on every line the call logs.
    with structlog.contextvars.bound_contextvars(writer=context.peer(), **log_context):
        try:
            database.check_answering()
        except Unavailable as error:
            call.close()
            await _abort(context, error)
        try:
            return await _unless_silenced(database, call)
        except CoordinatorError as error:
            await _abort(context, error)
        except DATA_ERRORS as error:
            await _abort(context, unstorable(error))


async def _unless_silenced(database: Database, call: Coroutine[Any, Any, Response]) -> Response:
    """The call's answer, or Unavailable as soon as the metastore stops answering while the call waits on it; the
    call is then cancelled as a writer's deadline would cancel it (every call is idempotent: the retry learns
    what became of it)."""
    task = asyncio.ensure_future(call)
    silence = asyncio.ensure_future(database.silence())
    try:
        await asyncio.wait({task, silence}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        silence.cancel()
        answered = task.done()
        if not answered:
            task.cancel()  # the metastore went silent, or the writer's call was cancelled
    if not answered:
        database.check_answering()
        raise Unavailable("the PostgreSQL metastore stopped answering during the call: retry")
    return task.result()


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: CoordinatorError) -> NoReturn:
    if isinstance(error, Unavailable):
        log.warning("request failed: dependency unavailable", error=error.message)
    await context.abort(error.grpc_code, error.message)


class SinkCoordinatorServicer(pb_grpc.SinkCoordinatorServicer):
    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    @property
    def coordinator(self) -> Coordinator:
        # The gate refuses every call (UNAVAILABLE) until the runtime is open.
        assert self.serving.coordinator is not None
        return self.serving.coordinator

    async def RegisterWriter(  # noqa: N802 (gRPC method names)
        self, request: pb.RegisterWriterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegisterWriterResponse:
        registration = await _answer(
            context,
            self.coordinator.database,
            self.coordinator.register_writer(
                sink=request.sink,
                table=request.table,
                checkpointed_epoch=request.checkpointed_epoch,
                writer_count=request.writer_count or 1,
                arrow_schema=request.arrow_schema,
                partition_by=tuple(request.partition_by),
                key_columns=tuple(request.key_columns),
            ),
            sink=request.sink,
        )
        self.coordinator.writer_calls.note(request.sink)
        return to_message(registration, pb.RegisterWriterResponse)

    async def PreCommit(  # noqa: N802
        self, request: pb.PreCommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreCommitResponse:
        result = await _answer(
            context,
            self.coordinator.database,
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
                        for data_file in (*request.data_files, *request.key_files)
                        if data_file.parquet_footer or data_file.file_size_in_bytes
                    },
                    files_directory=request.files_directory,
                    file_tables={
                        data_file.path: data_file.table
                        for data_file in (*request.data_files, *request.key_files)
                        if data_file.table
                    },
                    key_paths=tuple(key_file.path for key_file in request.key_files),
                )
            ),
            sink=request.sink,
            epoch=request.epoch,
        )
        self.coordinator.writer_calls.note(request.sink)
        return to_message(result, pb.PreCommitResponse)

    async def CommitCheckpoint(  # noqa: N802
        self, request: pb.CommitCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CommitCheckpointResponse:
        result = await _answer(
            context,
            self.coordinator.database,
            self.coordinator.commit_checkpoint(
                sink=request.sink, epoch=request.epoch, writer_term=request.writer_term, wait=request.wait
            ),
            sink=request.sink,
            epoch=request.epoch,
        )
        self.coordinator.writer_calls.note(request.sink)
        return to_message(result, pb.CommitCheckpointResponse)

    async def GetSinkState(  # noqa: N802
        self, request: pb.GetSinkStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetSinkStateResponse:
        state = await _answer(
            context, self.coordinator.database, self.coordinator.sink_state(request.sink), sink=request.sink
        )
        return to_message(state, pb.GetSinkStateResponse)

    async def EnsureTables(  # noqa: N802
        self, request: pb.EnsureTablesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EnsureTablesResponse:
        ensured = await _answer(
            context,
            self.coordinator.database,
            self.coordinator.ensure_tables(
                sink=request.sink,
                writer_term=request.writer_term,
                tables=[
                    TableRequest(
                        table=spec.table,
                        arrow_schema=spec.arrow_schema,
                        partition_by=tuple(spec.partition_by),
                        key_columns=tuple(spec.key_columns),
                    )
                    for spec in request.tables
                ],
            ),
            sink=request.sink,
        )
        self.coordinator.writer_calls.note(request.sink)
        return to_message(ensured, pb.EnsureTablesResponse)


def build_server(
    coordinator: Coordinator | Serving,
    bind_address: str,
    settings: Settings,
    tls_credentials: grpc.ServerCredentials | None = None,
    *,
    shared_port: bool = False,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The gRPC server with the coordinator, health and reflection services behind the writer gate; returns the
    bound port, bound exclusively, or `shared_port` with the supervisor's other serving processes
    (coordinator_service.listening). Given a Serving still without its coordinator
    (the process starting), it answers every call but the health check UNAVAILABLE until Serving.open.

    With tls_credentials it serves TLS only (there is no plaintext port beside it). Calls beyond
    GRPC_MAX_CONCURRENT_RPCS are refused with RESOURCE_EXHAUSTED, a connection carries at most
    GRPC_MAX_STREAMS_PER_CONNECTION calls at once, and lives GRPC_MAX_CONNECTION_AGE_SECONDS, after which its
    calls get CONNECTION_AGE_GRACE_SECONDS to finish. HTTP/2 windows do not grow past their initial 64 KiB (no
    BDP probing), so the server holds at most that of a body nobody reads.
    """
    if isinstance(coordinator, Coordinator):
        serving = Serving()
        serving.open(coordinator, settings.admin_lock_timeout_seconds)
    else:
        serving = coordinator
    gate = WriterGate(
        Credentials(settings.writer_token, settings.writer_scopes, settings.writer_token_previous), serving
    )
    grpc_requests.initialize()
    server = grpc.aio.server(
        # The counter first: it sees what the gate refuses too.
        interceptors=[grpc_requests.RequestCounter(), gate],
        maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
        options=[
            ("grpc.max_concurrent_streams", settings.grpc_max_streams_per_connection),
            ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", int(CONNECTION_AGE_GRACE_SECONDS * 1000)),
            # A stream's window stays at its initial 64 KiB instead of growing with the link's bandwidth-delay
            # product: a body the gate refuses unread costs at most that much, whatever its size.
            ("grpc.http2.bdp_probe", 0),
            grpc_port_option(shared_port),
        ],
    )
    pb_grpc.add_SinkCoordinatorServicer_to_server(SinkCoordinatorServicer(serving), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    try:
        port = (
            server.add_secure_port(bind_address, tls_credentials)
            if tls_credentials is not None
            else server.add_insecure_port(bind_address)
        )
    except RuntimeError as error:  # grpcio's "Failed to bind": taken since coordinator_service.listening checked it
        raise CannotServe(
            f"the gRPC port {bind_address} cannot be listened on ({error}): stop what listens there, or choose "
            f"another port with --grpc-port or {ENV_PREFIX}GRPC_PORT"
        ) from None
    return server, health_servicer, port
