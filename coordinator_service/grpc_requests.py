"""Every gRPC call counted by its status code (sink_coordinator_grpc_requests_total), refusals included.

The outermost interceptor: it wraps the handler the writer gate (coordinator_service.grpc_gate) gives back, so a
call the gate refuses (UNAUTHENTICATED, PERMISSION_DENIED, UNAVAILABLE while the coordinator starts) is counted
like one the coordinator answered. The counters of every method of the coordinator and of the health check exist
at 0 for every code from the start, so that increase() sees the first UNAVAILABLE or INTERNAL; a method nobody
declared is counted as `unknown` when no service has it (UNIMPLEMENTED: a client's method name is not a label value
to trust). The streams (health Watch, reflection) are left as they are, refusals included: a refusal of a
bidirectional stream wrapped once more raced the client's first message, which then got INTERNAL instead of
UNAUTHENTICATED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import grpc

from coordinator_service import metrics
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb

HEALTH: Final = "grpc.health.v1.Health"
COORDINATOR: Final = pb.DESCRIPTOR.services_by_name["SinkCoordinator"]
# The methods counted by name: (service, method).
KNOWN: Final = frozenset(
    {(COORDINATOR.full_name, method.name) for method in COORDINATOR.methods} | {(HEALTH, "Check"), (HEALTH, "Watch")}
)
UNKNOWN: Final = ("unknown", "unknown")
# The unary methods, whose every answer is counted.
UNARY: Final = KNOWN - {(HEALTH, "Watch")}

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]]


def initialize() -> None:
    """The unary methods' counters at 0 for every status code."""
    for service, method in sorted(UNARY):
        for code in grpc.StatusCode:
            metrics.GRPC_REQUESTS.labels(service, method, code.name)


def service_and_method(full_method: str) -> tuple[str, str]:
    """/sinkcoord.v1.SinkCoordinator/PreCommit as its labels; a method not declared here as `unknown`."""
    service, _, method = full_method.lstrip("/").partition("/")
    return (service, method) if (service, method) in KNOWN else UNKNOWN


class RequestCounter(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        labels = service_and_method(handler_call_details.method or "")
        handler = await continuation(handler_call_details)
        if handler is None:
            metrics.GRPC_REQUESTS.labels(*labels, grpc.StatusCode.UNIMPLEMENTED.name).inc()
            return None
        if labels not in UNARY:
            return handler  # a stream of answers (health Watch, reflection): not counted
        if handler.unary_unary is not None:
            unary = cast(Callable[..., Awaitable[Any]], handler.unary_unary)
            return grpc.unary_unary_rpc_method_handler(
                _counted(unary, labels),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:  # the gate's refusals, which never read the request
            streamed = cast(Callable[..., Awaitable[Any]], handler.stream_unary)
            return grpc.stream_unary_rpc_method_handler(
                _counted(streamed, labels),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _counted(behavior: Callable[..., Awaitable[Any]], labels: tuple[str, str]) -> Callable[..., Awaitable[Any]]:
    async def counted(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        code = grpc.StatusCode.UNKNOWN
        try:
            response = await behavior(request, context)
            code = context.code() or grpc.StatusCode.OK
            return response
        except grpc.aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            metrics.GRPC_REQUESTS.labels(*labels, _name(code)).inc()

    return counted


def _name(code: object) -> str:
    # context.code() is a StatusCode, or an int on some paths of grpcio's asyncio server.
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((each.name for each in grpc.StatusCode if each.value[0] == code), grpc.StatusCode.UNKNOWN.name)
