"""The open routes for probes and Prometheus: /healthz, /readyz, /metrics (never behind the admin token)."""

from __future__ import annotations

import asyncio

import structlog
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from coordinator_service import metrics
from coordinator_service.admin_deps import OperationsDep, RuntimeDep
from coordinator_service.errors import CoordinatorError, SchemaNotCurrent
from coordinator_service.schema import require_current_schema

log = structlog.get_logger(__name__)

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response)
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
                tables=[
                    metrics.TableGauges(
                        table=table.table,
                        committed_epoch=table.committed_epoch,
                        retrying=overview.health is not None and table.table in overview.health.failing_tables,
                    )
                    for table in overview.tables
                ],
            )
            for overview in await operations.sinks()
        ]
    except CoordinatorError as error:
        log.warning("metrics scrape could not read the metastore", error=error.message)
        gauges = None
    # Rendering every label of every metric takes tens of milliseconds with many sinks: not on the loop that
    # answers the writers.
    body = await asyncio.to_thread(metrics.exposition, gauges)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """PostgreSQL and the catalog are reachable and the metastore schema is current."""
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
