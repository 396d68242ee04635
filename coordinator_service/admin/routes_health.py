"""The routes for probes and Prometheus: /healthz, /readyz (open) and /metrics (open, or behind the metrics token:
coordinator_service.admin.http_gate).

Anyone may ask /readyz and /metrics as often as they like: concurrent asks share one computation, and a scrape
is answered from one at most METRICS_CACHE_SECONDS old (coordinator_service.admin.shared_answer)."""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import Final

import psycopg
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from coordinator_service import metrics
from coordinator_service.admin.deps import OperationsDep, RuntimeDep
from coordinator_service.admin.routes_sinks import error_responses
from coordinator_service.admin.shared_answer import SharedAnswer
from coordinator_service.contract.errors import CoordinatorError, SchemaNotCurrent, cause
from coordinator_service.engine.commit_state import stuck_reason
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import SinkOverview
from coordinator_service.log.database import within
from coordinator_service.log.schema import require_current_schema
from coordinator_service.metrics import scrape as metrics_scrape
from coordinator_service.runtime import Runtime
from coordinator_service.tables.catalog_calls import CREDENTIALS_REFUSED
from coordinator_service.tables.warehouse import local_warehouse, writability

log = structlog.get_logger(__name__)

router = APIRouter(tags=["health"])

CREDENTIALS_STATE: Final = "credentials refused"
# The states no wait fixes: an operator must act.
NO_GRACE: Final = ("schema", CREDENTIALS_STATE)


@router.get(
    "/metrics",
    response_class=Response,
    # The gate's refusals that reach it: no metrics token or a wrong one, a body over the limit (http_gate.py).
    responses=error_responses(HTTPStatus.UNAUTHORIZED, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
)
async def prometheus_metrics(request: Request, operations: OperationsDep) -> Response:
    """Prometheus metrics; the per-sink gauges are read from the metastore (at most METRICS_CACHE_SECONDS ago)."""
    shared: SharedAnswer[bytes] = request.app.state.metrics_answer
    body = await shared.get(lambda: _scrape(operations, request.app.state.runtime))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def _scrape(operations: Operations, runtime: Runtime) -> bytes:
    """The exposition of one scrape. The metastore's part is bounded by METRICS_READ_TIMEOUT_SECONDS: past it (or
    while the metastore does not answer at all) the scrape says metastore_up 0 at once instead of timing out."""
    database = runtime.database
    try:
        database.check_answering()  # a scrape never waits on a metastore that does not answer
        reporter, overviews = await within(
            runtime.settings.metrics_read_timeout_seconds,
            asyncio.gather(runtime.lease.take(), operations.sinks()),
        )
    except (CoordinatorError, TimeoutError, psycopg.Error, OSError) as error:
        message = error.message if isinstance(error, CoordinatorError) else cause(error) or "no answer in time"
        log.warning("metrics scrape could not read the metastore", error=message)
        scrape = metrics_scrape.Scrape(None, log_reporter=False, pool=database.pool_gauges())
    else:
        metrics.SINK_SERIES.track(overview.sink.name for overview in overviews)
        scrape = metrics_scrape.Scrape(
            [_gauges(overview) for overview in overviews], log_reporter=reporter, pool=database.pool_gauges()
        )
    # Rendering every label of every metric takes tens of milliseconds with many sinks: not on the loop that
    # answers the writers.
    return await asyncio.to_thread(metrics_scrape.exposition, scrape)


def _gauges(overview: SinkOverview) -> metrics_scrape.SinkGauges:
    health = overview.health
    return metrics_scrape.SinkGauges(
        sink=overview.sink.name,
        pending=overview.counts.pending,
        aborted=overview.counts.aborted,
        oldest_pending_age_seconds=overview.counts.oldest_pending_age_seconds,
        retrying=health is not None and health.retrying,
        stuck=stuck_reason(health, overview.sink) is not None,
        suspended=overview.sink.suspended_reason is not None,
        tables=[
            metrics_scrape.TableGauges(
                table=table.identifier,
                committed_epoch=table.committed_epoch,
                retrying=health is not None and table.identifier in health.failing_tables,
            )
            for table in overview.tables
        ],
        stalled=overview.stalled is not None,
        writer_last_call_age_seconds=overview.counts.writer_last_call_age_seconds,
        checkpointed_epoch=overview.sink.checkpointed_epoch,
        committed_epoch=overview.sink.committed_epoch,
        last_commit_at=overview.counts.last_commit_at,
        last_precommit_at=overview.counts.last_precommit_at,
        verified_epoch=overview.counts.verified_epoch,
        verification_failed=overview.counts.verification_failed,
    )


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready: each check says what is wrong"}})
async def readyz(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """PostgreSQL and the catalog are reachable, the metastore schema is current, and a warehouse on this machine
    is there and writable. Each check says what is wrong in words an operator acts on; the error itself (its SQL,
    parameters, driver text) goes to the log."""
    shared: SharedAnswer[dict[str, str]] = request.app.state.readiness_answer
    checks = await shared.get(lambda: _readiness(runtime))
    ready = all(value.startswith("ok") for value in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


async def _readiness(runtime: Runtime) -> dict[str, str]:
    """Each dependency's state. A dependency every replica shares (the metastore, the catalog) makes this replica
    unready only once it has failed for READINESS_DEPENDENCY_GRACE_SECONDS: a blip must not take every replica out
    of the Service at once (writers would get refused connections instead of quick UNAVAILABLE answers)."""
    silent = runtime.database.silent_seconds
    if silent > 0:
        metastore = f"not answering for {silent:.0f} s: see the coordinator's log"
    else:
        metastore = await _metastore(runtime)
    return {
        "metastore": _within_grace(runtime, "metastore", metastore),
        "catalog": _within_grace(runtime, "catalog", await _catalog(runtime)),
        **_warehouse_check(runtime),
    }


def _within_grace(runtime: Runtime, dependency: str, state: str) -> str:
    """`state` as readiness reports it: a failure younger than the grace still counts as ok, and says so. A schema
    this release cannot run on, or credentials the catalog refuses, are never within a grace: no wait fixes them."""
    failing = runtime.dependencies_failing_since
    if state == "ok":
        failing.pop(dependency, None)
        return state
    since = failing.setdefault(dependency, time.monotonic())
    grace = runtime.settings.readiness_dependency_grace_seconds
    if state.startswith(NO_GRACE) or time.monotonic() - since > grace:
        return state
    return f"ok ({state}; unready after {grace:g} s of it)"


async def _catalog(runtime: Runtime) -> str:
    try:
        await within(
            runtime.settings.metastore_stall_seconds * 2, asyncio.to_thread(runtime.iceberg.catalog.list_namespaces)
        )
    except TimeoutError:
        return "not answering: see the coordinator's log"
    except CREDENTIALS_REFUSED as error:
        log.warning("readiness: the catalog refused the credentials", error=cause(error))
        return f"{CREDENTIALS_STATE}: check the catalog's credential or token (CATALOG__*)"
    except Exception as error:
        log.warning("readiness: the catalog failed", error=cause(error), error_type=type(error).__name__)
        return "unreachable: see the coordinator's log"
    return "ok"


async def _metastore(runtime: Runtime) -> str:
    """The metastore's readiness: it answers, within the stall time, on a schema this release runs on."""

    async def check() -> None:
        async with runtime.database.connection() as connection:
            await connection.run_sync(require_current_schema)

    try:
        await within(runtime.settings.metastore_stall_seconds * 2, check())
    except SchemaNotCurrent:
        return "schema not current: run `sink-coordinator migrate` with this release"
    except TimeoutError:
        return "not answering: see the coordinator's log"
    except Exception as error:
        log.warning("readiness: the metastore failed", error=cause(error))
        return "unreachable: see the coordinator's log"
    return "ok"


def _warehouse_check(runtime: Runtime) -> dict[str, str]:
    """A warehouse on this machine's file system is there and writable (coordinator_service.tables.warehouse); one
    elsewhere is the catalog's and its storage's business (no check)."""
    directory = local_warehouse(runtime.settings)
    return {} if directory is None else {"warehouse": writability(directory)}
