"""What every gRPC call passes before it runs: the writer's credential, its request decoded, its scope.

One interceptor, in this order:

1. the credential (metadata `authorization: Bearer <token>`): a call without a writer token is refused with
   UNAUTHENTICATED before a byte of its request is read; only the health service's Check is open (a probe);
   Watch and reflection need a writer token like every other call; while the coordinator starts (its metastore
   not reached yet: Serving), every other call is UNAVAILABLE, which the writer retries;
2. the request, decoded here: a request that does not decode is INVALID_ARGUMENT (grpc would say UNKNOWN);
3. the scope (coordinator_service.writer_scopes): the sink and every table the request names must be the
   credential's, else PERMISSION_DENIED; a method without a rule in TARGETS is refused, so a new call cannot
   slip through unscoped;
4. a call that may add a sink or a table (RegisterWriter, EnsureTables) runs under the scope's admission
   (coordinator_service.engine.writer_admission): quotas, and the origin of tables no sink writes yet.

A refusal changes nothing. The server (grpc_server.build_server) bounds concurrent calls and streams and
closes connections at a maximum age.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import grpc
import structlog
from google.protobuf.message import DecodeError, Message

from coordinator_service import metrics
from coordinator_service.contract.errors import CoordinatorError, PermissionDenied, cause
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.engine.protocol import Coordinator
from coordinator_service.engine.writer_admission import Admission
from coordinator_service.log.database import DATA_ERRORS, unstorable
from coordinator_service.writer_scopes import Credentials, Scope

log = structlog.get_logger(__name__)

SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["SinkCoordinator"].full_name
HEALTH_CHECK: Final = "/grpc.health.v1.Health/Check"

Targets = Callable[[Any], tuple[str, Sequence[str]]]
# What each call names: its sink and the tables it may touch (a PreCommit's files name theirs; empty: the
# sink's own table, which its RegisterWriter named).
TARGETS: Final[dict[str, Targets]] = {
    f"/{SERVICE_NAME}/RegisterWriter": lambda request: (request.sink, (request.table,)),
    f"/{SERVICE_NAME}/PreCommit": lambda request: (
        request.sink,
        sorted({data_file.table for data_file in request.data_files if data_file.table}),
    ),
    f"/{SERVICE_NAME}/CommitCheckpoint": lambda request: (request.sink, ()),
    f"/{SERVICE_NAME}/GetSinkState": lambda request: (request.sink, ()),
    f"/{SERVICE_NAME}/EnsureTables": lambda request: (request.sink, [spec.table for spec in request.tables]),
}
# The calls that may add a sink or a table to the caller's scope.
CREATING: Final = frozenset({f"/{SERVICE_NAME}/RegisterWriter", f"/{SERVICE_NAME}/EnsureTables"})

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]]


@dataclass
class Serving:
    """What the gRPC services call: the coordinator and the writers' admission once the runtime is open; until
    then `waiting` says why not (the metastore not reached yet), and every call but the health check is
    UNAVAILABLE with it."""

    coordinator: Coordinator | None = None
    admission: Admission | None = None
    waiting: str = "the coordinator is starting"

    def starting(self, why: str) -> None:
        """The runtime is not open yet: why."""
        self.waiting = f"the coordinator is starting: its metastore is not reachable yet ({why})"

    def open(self, coordinator: Coordinator, admin_lock_timeout_seconds: float) -> None:
        self.admission = Admission(coordinator.database, coordinator.iceberg, admin_lock_timeout_seconds)
        self.coordinator = coordinator


class WriterGate(grpc.aio.ServerInterceptor):
    def __init__(self, credentials: Credentials, serving: Serving) -> None:
        self._credentials = credentials
        self._serving = serving

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method or ""
        scope: Scope | None = None
        if method != HEALTH_CHECK:
            scope = self._credentials.scope_of(_bearer(handler_call_details.invocation_metadata))
            if scope is None:
                return _refused_unauthenticated(handler_call_details)
            if self._serving.admission is None:
                return _refused(grpc.StatusCode.UNAVAILABLE, f"{self._serving.waiting}: retry")
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler  # an unknown method (UNIMPLEMENTED), or a stream (health Watch, reflection)
        return self._guarded(method, handler, scope)

    def _guarded(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any], scope: Scope | None
    ) -> grpc.RpcMethodHandler[Any, Any]:
        decode = handler.request_deserializer
        assert decode is not None
        # On the asyncio server, every unary handler (ours, health) is a coroutine function.
        behavior = cast(Callable[..., Awaitable[Any]], handler.unary_unary)
        targets = TARGETS.get(method)

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                request = decode(raw)
            except DecodeError as error:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message: {cause(error)}"
                )
            if scope is None:  # the open health Check
                return await behavior(request, context)
            try:
                if targets is None:
                    raise PermissionDenied(f"{method} has no writer scope rule: no writer may call it")
                sink, tables = targets(request)
                scope.authorize(sink, tables)
                if method not in CREATING:
                    return await behavior(request, context)
                assert self._serving.admission is not None  # the gate refused the call before
                async with self._serving.admission.admitting(scope, sink, tables):
                    return await behavior(request, context)
            except CoordinatorError as error:
                await context.abort(error.grpc_code, error.message)
            except DATA_ERRORS as error:
                refused = unstorable(error)
                await context.abort(refused.grpc_code, refused.message)

        return grpc.unary_unary_rpc_method_handler(guarded, response_serializer=handler.response_serializer)


def _bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry; None without one."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            return token if scheme.lower() == "bearer" else ""
    return None


def _refused_unauthenticated(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
    """The refusal of a call without a valid writer token: counted, and logged with the caller's address (never the
    token sent), for an operator to see probing or a client with an old token."""
    if _bearer(details.invocation_metadata) is None:
        why = "no writer token: send metadata 'authorization: Bearer <writer token>'"
    else:
        why = "the writer token is wrong"
    metrics.AUTHENTICATION_FAILURES.labels("grpc").inc()

    def logged(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        log.warning("authentication failed", api="grpc", method=details.method, why=why, writer=context.peer())

    return _refused(grpc.StatusCode.UNAUTHENTICATED, why, logged)


def _refused(
    code: grpc.StatusCode,
    message: str,
    logged: Callable[[grpc.aio.ServicerContext[Any, Any]], None] | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that refuses without reading the request (a stream of requests it never iterates); `logged` says
    so with the call's context (its peer) first."""

    async def refuse(requests: AsyncIterator[Message], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if logged is not None:
            logged(context)
        await context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse)
