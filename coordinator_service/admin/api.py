"""The admin app: health, readiness, metrics and the versioned admin API (/api/v1), with its error format.

create_app puts the runtime, the operator rules and the token check in
app.state, where the routes' dependencies (admin_deps) take them; the routes
themselves are module-level routers (admin_routes_sinks, admin_routes_tables,
admin_routes_health, console_routes). Every request passes the HTTP gate
(http_gate) first. Every error is JSON {"error": {"code", "message"}}; a
CoordinatorError answers its http_status, a request that does not validate
answers 422.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException

from coordinator_service import __version__
from coordinator_service.admin import console_actions, console_routes
from coordinator_service.admin import routes_health as admin_routes_health
from coordinator_service.admin import routes_sinks as admin_routes_sinks
from coordinator_service.admin import routes_tables as admin_routes_tables
from coordinator_service.admin.auth import AdminAuth
from coordinator_service.admin.console_routes import CONSOLE_PREFIX, STATIC_DIRECTORY
from coordinator_service.admin.console_session import ConsoleSessions
from coordinator_service.admin.http_gate import HttpGate
from coordinator_service.admin.request_counter import RequestCounter
from coordinator_service.admin.shared_answer import SharedAnswer
from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.engine.operations import Operations
from coordinator_service.log.database import DATA_ERRORS, unstorable
from coordinator_service.runtime import Runtime


def create_app(runtime: Runtime) -> FastAPI:
    # /docs and /redoc load Swagger UI and ReDoc from the fastapi-offline package (/static-offline-docs), so that
    # they work where no CDN is reachable.
    app = FastAPIOffline(
        title="sink-coordinator admin API",
        version=__version__,
        description="Operate the sink-coordinator: sinks, epochs, abort, reset. See docs/operations.md.",
    )
    settings = runtime.settings
    app.state.runtime = runtime
    app.state.operations = Operations(
        runtime.database, runtime.iceberg, runtime.committer, runtime.cleaner, runtime.maintainer, settings
    )
    auth = app.state.auth = AdminAuth(
        settings.admin_token,
        settings.admin_read_requires_token,
        settings.metrics_token,
        settings.admin_token_previous,
    )
    app.state.metrics_answer = SharedAnswer[bytes](settings.metrics_cache_seconds)
    app.state.readiness_answer = SharedAnswer[dict[str, str]](0.0)
    _install_error_handlers(app)
    app.include_router(admin_routes_sinks.router)
    app.include_router(admin_routes_tables.router)
    app.include_router(admin_routes_health.router)
    sessions = app.state.console_sessions = ConsoleSessions(auth, runtime.database)
    app.include_router(console_routes.router)
    app.include_router(console_actions.router)
    app.mount(f"{CONSOLE_PREFIX}/static", StaticFiles(directory=STATIC_DIRECTORY), name="console-static")
    app.add_middleware(HttpGate, auth=auth, sessions=sessions, allowed_hosts=settings.allowed_hosts)
    # Added last, so outermost: the gate's refusals are counted too.
    app.add_middleware(RequestCounter, routes=lambda: app.routes)
    return app


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _validation_message(error: RequestValidationError) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()))
        problems.append(f"{where}: {item.get('msg', 'invalid')}")
    return "the request is invalid: " + "; ".join(problems)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CoordinatorError)
    async def coordinator_error(request: Request, error: CoordinatorError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.http_status == HTTPStatus.UNAUTHORIZED else None
        return _error(error.http_status, error.grpc_code.name, error.message, headers)

    async def data_error(request: Request, error: Exception) -> JSONResponse:
        # A value PostgreSQL refused that reached this far unchecked is still the request's fault: 422.
        return await coordinator_error(request, unstorable(error))

    for data_error_type in DATA_ERRORS:
        app.add_exception_handler(data_error_type, data_error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error(HTTPStatus.UNPROCESSABLE_ENTITY, "INVALID_ARGUMENT", _validation_message(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        status = HTTPStatus(error.status_code)
        if status == HTTPStatus.BAD_REQUEST:
            # FastAPI's answer to a body it cannot decode; every other malformed request is a 422.
            return _error(
                HTTPStatus.UNPROCESSABLE_ENTITY, "INVALID_ARGUMENT", f"the request is invalid: {error.detail}"
            )
        message = (
            str(error.detail)
            if error.detail != status.phrase
            else f"{request.method} {request.url.path}: {status.phrase}"
        )
        return _error(status, status.name, message, dict(error.headers or {}))
