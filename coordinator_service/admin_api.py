"""The HTTP adapter: health, readiness, metrics and the versioned admin API (/api/v1).

Routes only translate: the rules live in coordinator_service.operations.
Every error is JSON {"error": {"code", "message"}}; a CoordinatorError
answers its http_status, a request that does not validate answers 422.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Security
from fastapi import Path as PathParameter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.exceptions import HTTPException

from coordinator_service import __version__, metrics
from coordinator_service.admin_auth import AdminAuth, bearer_scheme
from coordinator_service.admin_schemas import (
    MAX_EPOCH,
    AbortRequest,
    AbortResponse,
    EpochDetailResponse,
    EpochPage,
    EpochResponse,
    EpochStatusFilter,
    ErrorResponse,
    MaintenanceOverridesRequest,
    MaintenanceResponse,
    MaintenanceRunResponse,
    ResetRequest,
    ResetResponse,
    SinkList,
    SinkResponse,
    decode_cursor,
    encode_cursor,
)
from coordinator_service.database import DATA_ERRORS, unstorable
from coordinator_service.errors import CoordinatorError, SchemaNotCurrent
from coordinator_service.operations import Operations, Operator
from coordinator_service.runtime import Runtime
from coordinator_service.schema import require_current_schema

log = structlog.get_logger(__name__)

API_PREFIX = "/api/v1"
SinkName = Annotated[str, PathParameter(description="The sink's name, as its writer registered it.")]
Epoch = Annotated[int, PathParameter(ge=0, le=MAX_EPOCH, description="The epoch (Spark batch id).")]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]
Runs = Annotated[int, Query(ge=1, le=100, description="How many of the last maintenance runs to list.")]


def _error_responses(*statuses: HTTPStatus) -> dict[int | str, dict[str, Any]]:
    return {int(status): {"model": ErrorResponse, "description": status.phrase} for status in statuses}


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


def operations_of(request: Request) -> Operations:
    """The app's operator rules (app.state.operations; a test may override this dependency)."""
    operations: Operations = request.app.state.operations
    return operations


def reader(request: Request, credentials: Credentials) -> None:
    """A read route: the admin token when ADMIN_READ_REQUIRES_TOKEN says so."""
    auth: AdminAuth = request.app.state.auth
    auth.check_reader(credentials)


def operator(request: Request, credentials: Credentials) -> Operator:
    """A mutating route: who asks (the admin token, when one is set)."""
    auth: AdminAuth = request.app.state.auth
    return auth.operator(request, credentials)


OperationsDep = Annotated[Operations, Depends(operations_of)]
Reader = Annotated[None, Depends(reader)]
Caller = Annotated[Operator, Depends(operator)]

router = APIRouter(
    prefix=API_PREFIX,
    tags=["sinks"],
    responses=_error_responses(
        HTTPStatus.UNAUTHORIZED, HTTPStatus.UNPROCESSABLE_ENTITY, HTTPStatus.SERVICE_UNAVAILABLE
    ),
)


@router.get("/sinks", response_model=SinkList)
async def list_sinks(operations: OperationsDep, _: Reader) -> SinkList:
    """Every sink: its epochs, writer and committer health."""
    return SinkList(sinks=[SinkResponse.of(overview) for overview in await operations.sinks()])


@router.get("/sinks/{sink}", response_model=SinkResponse, responses=_error_responses(HTTPStatus.NOT_FOUND))
async def get_sink(operations: OperationsDep, sink: SinkName, _: Reader) -> SinkResponse:
    """One sink: checkpointed and committed epochs, writer term, pending and aborted epochs, committer health."""
    return SinkResponse.of(await operations.sink(sink))


@router.get("/sinks/{sink}/epochs", response_model=EpochPage, responses=_error_responses(HTTPStatus.NOT_FOUND))
async def list_epochs(
    operations: OperationsDep,
    sink: SinkName,
    _: Reader,
    status: Annotated[EpochStatusFilter | None, Query(description="Only epochs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Most epochs on one page.")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page; omit for the first.")
    ] = None,
) -> EpochPage:
    """The sink's epochs in its log, newest first, a page at a time."""
    below = None if cursor is None else decode_cursor(cursor)
    rows, next_below = await operations.epochs(sink, status.as_status() if status else None, below, limit)
    return EpochPage(
        epochs=[EpochResponse.of(row) for row in rows],
        next_cursor=None if next_below is None else encode_cursor(next_below),
    )


@router.get(
    "/sinks/{sink}/epochs/{epoch}",
    response_model=EpochDetailResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND),
)
async def get_epoch(operations: OperationsDep, sink: SinkName, epoch: Epoch, _: Reader) -> EpochDetailResponse:
    """One epoch with its data files and the writer's properties."""
    return EpochDetailResponse.of_detail(await operations.epoch(sink, epoch))


@router.post(
    "/sinks/{sink}/epochs/{epoch}/abort",
    response_model=AbortResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
)
async def abort_epoch(
    operations: OperationsDep, sink: SinkName, epoch: Epoch, body: AbortRequest, caller: Caller
) -> AbortResponse:
    """Abort a PENDING epoch, with force=true only: its records will not reach the table (Spark may already
    have checkpointed it). An epoch the table already holds is marked COMMITTED and answers 409, as a
    COMMITTED one does; an ABORTED one answers its state unchanged; a committer busy past the lock timeout
    answers 503 with nothing changed."""
    return AbortResponse.of(await operations.abort_epoch(sink, epoch, body.reason, body.force, caller))


@router.post(
    "/sinks/{sink}/reset",
    response_model=ResetResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND),
)
async def reset_sink(operations: OperationsDep, sink: SinkName, body: ResetRequest, caller: Caller) -> ResetResponse:
    """After a lost Spark checkpoint: mark COMMITTED the PENDING epochs the table already holds, abort the
    others, fence the writer, and let the next RegisterWriter start a new epoch numbering from its checkpoint
    (docs/operations.md). A catalog that cannot be read answers 503 with nothing changed."""
    return ResetResponse.of(await operations.reset_sink(sink, body.confirm, body.reason, caller))


@router.post("/sinks/{sink}/resume", response_model=SinkResponse, responses=_error_responses(HTTPStatus.NOT_FOUND))
async def resume_sink(operations: OperationsDep, sink: SinkName, caller: Caller) -> SinkResponse:
    """Retry the commits of a stuck sink (committer state `stuck`: a failure no retry could fix), once its
    cause is fixed; answers the sink as it is then (stuck again if the cause is still there)."""
    return SinkResponse.of(await operations.resume_sink(sink, caller))


@router.get(
    "/sinks/{sink}/maintenance",
    response_model=MaintenanceResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND),
)
async def get_maintenance(operations: OperationsDep, sink: SinkName, _: Reader, runs: Runs = 20) -> MaintenanceResponse:
    """The maintenance of the sink's table: the settings in force, the sink's overrides, the last runs."""
    return MaintenanceResponse.of(await operations.maintenance(sink, runs))


@router.put(
    "/sinks/{sink}/maintenance",
    response_model=MaintenanceResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND),
)
async def set_maintenance(
    operations: OperationsDep, sink: SinkName, body: MaintenanceOverridesRequest, caller: Caller, runs: Runs = 20
) -> MaintenanceResponse:
    """Replace the sink's overrides of the maintenance settings ({} goes back to the defaults)."""
    view = await operations.set_maintenance_overrides(sink, dict(body.overrides), caller, runs)
    return MaintenanceResponse.of(view)


@router.post(
    "/sinks/{sink}/maintenance/run",
    response_model=MaintenanceRunResponse,
    responses=_error_responses(HTTPStatus.NOT_FOUND),
)
async def run_maintenance(operations: OperationsDep, sink: SinkName, caller: Caller) -> MaintenanceRunResponse:
    """Maintain the sink's table now (expiration, compaction and the orphan sweep), under its commit lock;
    answers when the run is over, with what it did (its outcome says whether it failed, and why). 503 when
    the sink's committer holds the lock past ADMIN_LOCK_TIMEOUT_SECONDS, nothing done."""
    return MaintenanceRunResponse.model_validate(await operations.run_maintenance(sink, caller))


def create_app(runtime: Runtime) -> FastAPI:
    app = FastAPI(
        title="sink-coordinator admin API",
        version=__version__,
        description="Operate the sink-coordinator: sinks, epochs, abort, reset. See docs/operations.md.",
    )
    settings = runtime.settings
    app.state.runtime = runtime
    app.state.operations = Operations(runtime.database, runtime.tables, runtime.committer, runtime.maintainer, settings)
    app.state.auth = AdminAuth(settings.admin_token, settings.admin_read_requires_token)
    _install_error_handlers(app)
    app.include_router(router)
    app.include_router(health_router)
    return app


health_router = APIRouter(tags=["health"])


@health_router.get("/metrics", response_class=Response)
async def prometheus_metrics(operations: OperationsDep) -> Response:
    """Prometheus metrics; the per-sink gauges are read from the metastore at each scrape."""
    gauges: list[metrics.SinkGauges] | None
    try:
        gauges = [
            metrics.SinkGauges(
                sink=overview.sink.name,
                pending=overview.counts.pending,
                aborted=overview.counts.aborted,
                oldest_pending_age_seconds=overview.counts.oldest_pending_age_seconds,
                retrying=overview.health is not None and overview.health.retrying,
                stuck=overview.health is not None and overview.health.stuck is not None,
            )
            for overview in await operations.sinks()
        ]
    except CoordinatorError as error:
        log.warning("metrics scrape could not read the metastore", error=error.message)
        gauges = None
    return Response(metrics.exposition(gauges), media_type=CONTENT_TYPE_LATEST)


@health_router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@health_router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """PostgreSQL and the catalog are reachable and the metastore schema is current."""
    runtime: Runtime = request.app.state.runtime
    checks: dict[str, str] = {}
    try:
        async with runtime.database.connection() as connection:
            await connection.execute(text("SELECT 1"))
            await connection.run_sync(require_current_schema)
        checks["metastore"] = "ok"
    except (CoordinatorError, SchemaNotCurrent) as error:
        checks["metastore"] = str(error)
    try:
        await asyncio.to_thread(runtime.tables.catalog.list_namespaces)
        checks["catalog"] = "ok"
    except Exception as error:
        checks["catalog"] = f"{type(error).__name__}: {error}"
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
