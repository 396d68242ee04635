"""What the HTTP server answers before the coordinator reached its metastore, and the switch to the admin app.

The process listens before it contacts PostgreSQL (coordinator_service.startup retries it): meanwhile /healthz
says the process lives, /readyz says what it waits for (503), /metrics gives this process's counters with
sink_coordinator_metastore_up 0 (behind the metrics token, as always), and every other path answers 503
UNAVAILABLE in the admin API's error format. Once the runtime is open, AppSwitch hands every request to the admin
app (coordinator_service.admin.api).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus

from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator_service.admin.auth import AdminAuth, bearer_scheme
from coordinator_service.admin.request_counter import RequestCounter
from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.metrics import scrape as metrics_scrape
from coordinator_service.settings import Settings


class AppSwitch:
    """The ASGI app the HTTP server serves: `app`, which the process replaces once (starting, then admin)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def create_starting_app(settings: Settings, waiting: Callable[[], str]) -> ASGIApp:
    """The app of a process whose metastore is not reached yet; `waiting` says why (the last attempt's error)."""
    auth = AdminAuth(
        settings.admin_token, settings.admin_read_requires_token, settings.metrics_token, settings.admin_token_previous
    )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        return JSONResponse(
            {"ready": False, "checks": {"metastore": f"not reachable yet: {waiting()}"}},
            status_code=HTTPStatus.SERVICE_UNAVAILABLE,
        )

    async def prometheus_metrics(request: Request) -> Response:
        try:
            auth.check_metrics_reader(await bearer_scheme(request))
        except CoordinatorError as error:
            return _error(error.http_status, error.grpc_code.name, error.message)
        body = await asyncio.to_thread(metrics_scrape.exposition, metrics_scrape.Scrape(None, log_reporter=False))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def unavailable(scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the coordinator is starting: its metastore is not reachable yet ({waiting()}); retry"
        await _error(HTTPStatus.SERVICE_UNAVAILABLE, "UNAVAILABLE", message)(scope, receive, send)

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", prometheus_metrics)]
    app = Starlette(routes=routes)
    app.router.default = unavailable  # every other path, whatever its method
    return RequestCounter(app, lambda: routes)


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == HTTPStatus.UNAUTHORIZED else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)
