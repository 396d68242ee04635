"""Every HTTP request counted by method, route and status code (sink_coordinator_http_requests_total).

The outermost ASGI middleware: the HTTP gate's refusals (401, 403, 413, 421) are counted beside the routes'
answers. The route is its template (/api/v1/sinks/{sink}), matched here whatever the gate decides, so that a
sink's name never becomes a label value; a path no route matches is `other`. The counters an alert reads (every
route's 500 and 503) exist at 0 from the start, so that increase() sees the first one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final

from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator_service import metrics

METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER: Final = "other"
# The codes whose counters exist from the start: what a route answers when it works, and when it fails.
INITIAL_CODES: Final = ("200", "500", "503")


class RequestCounter:
    def __init__(self, app: ASGIApp, routes: Callable[[], Sequence[BaseRoute]]) -> None:
        self.app = app
        self._routes = routes
        self._initialized = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._initialized:
            self._initialized = True
            initialize(self._routes())
        status = 500  # an answer never started: the server's error

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            method = scope["method"] if scope["method"] in METHODS else OTHER
            metrics.HTTP_REQUESTS.labels(method, route_of(self._routes(), scope), str(status)).inc()


def route_of(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The template of the route the request's path names (whatever its method), or `other`."""
    for route in flat(routes):
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return _template(route)
    return OTHER


def flat(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes, those of included routers in their place (FastAPI keeps an included router as one entry; the
    routers here are included without a prefix, their routes' paths are whole)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from flat(included.routes)
        else:
            yield route


def _template(route: BaseRoute) -> str:
    path = str(getattr(route, "path", OTHER))
    return f"{path}/{{path}}" if isinstance(route, Mount) else path


def initialize(routes: Sequence[BaseRoute]) -> None:
    for route in flat(routes):
        for method in sorted((getattr(route, "methods", None) or set()) - {"HEAD"}):
            for code in INITIAL_CODES:
                metrics.HTTP_REQUESTS.labels(method, _template(route), code)
