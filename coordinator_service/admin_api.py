"""The HTTP adapter: health and readiness (the admin API's routes grow here)."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import text

from coordinator_service import __version__
from coordinator_service.errors import CoordinatorError, SchemaNotCurrent
from coordinator_service.runtime import Runtime
from coordinator_service.schema import require_current_schema


def create_app(runtime: Runtime) -> FastAPI:
    app = FastAPI(title="sink-coordinator admin API", version=__version__)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
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

    return app
