"""The versioned admin API (/api/v1): sinks, epochs, abort, reset, reconcile, delete, resume, maintenance, verify.

Routes only translate: the rules live in coordinator_service.engine.operations, and
every dependency comes from coordinator_service.admin.deps. Read routes take
Reader, mutating routes Caller (the operator, checked against the admin token).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query
from fastapi import Path as PathParameter

from coordinator_service.admin.action_schemas import (
    AbortRequest,
    AbortResponse,
    DeleteSinkRequest,
    DeleteSinkResponse,
    ReconcileRequest,
    ReconcileResponse,
    ReconcileSuspendedRequest,
    ReconcileSuspendedResponse,
    RemoveTableRequest,
    RemoveTableResponse,
    ResetRequest,
    ResetResponse,
)
from coordinator_service.admin.deps import Caller, OperationsDep, Reader
from coordinator_service.admin.maintenance_schemas import (
    MaintenanceOverridesRequest,
    MaintenanceResponse,
    MaintenanceRunResponse,
)
from coordinator_service.admin.schemas import (
    MAX_EPOCH,
    EpochDetailResponse,
    EpochPage,
    EpochResponse,
    EpochStatusFilter,
    ErrorResponse,
    SinkList,
    SinkResponse,
    decode_cursor,
    encode_cursor,
)
from coordinator_service.admin.verification_schemas import (
    VerificationResponse,
    VerificationStateResponse,
    VerifyRequest,
)

API_PREFIX = "/api/v1"
SinkName = Annotated[str, PathParameter(description="The sink's name, as its writer registered it.")]
Epoch = Annotated[int, PathParameter(ge=0, le=MAX_EPOCH, description="The epoch (Spark batch id).")]
Runs = Annotated[int, Query(ge=1, le=100, description="How many of the last maintenance runs to list.")]


def error_responses(*statuses: HTTPStatus) -> dict[int | str, dict[str, Any]]:
    return {int(status): {"model": ErrorResponse, "description": status.phrase} for status in statuses}


# What every route of the API may answer besides its own: the HTTP gate's refusals (no token or an unknown one, a
# cross-site action or a token short of the route's, a body over its limit, a host not allowed: http_gate.py), a
# request that does not fit the schema, and a metastore out of reach.
API_ERRORS: Final = error_responses(
    HTTPStatus.UNAUTHORIZED,
    HTTPStatus.FORBIDDEN,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    HTTPStatus.MISDIRECTED_REQUEST,
    HTTPStatus.UNPROCESSABLE_ENTITY,
    HTTPStatus.SERVICE_UNAVAILABLE,
)

router = APIRouter(prefix=API_PREFIX, tags=["sinks"], responses=API_ERRORS)


@router.get("/sinks", response_model=SinkList)
async def list_sinks(operations: OperationsDep, _: Reader) -> SinkList:
    """Every sink: its epochs, writer and committer health."""
    return SinkList(sinks=[SinkResponse.of(overview) for overview in await operations.sinks()])


@router.get("/sinks/{sink}", response_model=SinkResponse, responses=error_responses(HTTPStatus.NOT_FOUND))
async def get_sink(operations: OperationsDep, sink: SinkName, _: Reader) -> SinkResponse:
    """One sink: checkpointed and committed epochs, writer term, pending and aborted epochs, committer health."""
    return SinkResponse.of(await operations.sink(sink))


@router.get("/sinks/{sink}/epochs", response_model=EpochPage, responses=error_responses(HTTPStatus.NOT_FOUND))
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
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def get_epoch(operations: OperationsDep, sink: SinkName, epoch: Epoch, _: Reader) -> EpochDetailResponse:
    """One epoch with its data files and the writer's properties."""
    return EpochDetailResponse.of_detail(await operations.epoch(sink, epoch))


@router.post(
    "/sinks/{sink}/epochs/{epoch}/abort",
    response_model=AbortResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
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
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def reset_sink(operations: OperationsDep, sink: SinkName, body: ResetRequest, caller: Caller) -> ResetResponse:
    """After a lost Spark checkpoint: mark COMMITTED the PENDING epochs the table already holds, abort the
    others, fence the writer, and let the next RegisterWriter start a new epoch numbering from its checkpoint
    (docs/operations.md). A catalog that cannot be read answers 503 with nothing changed."""
    return ResetResponse.of(await operations.reset_sink(sink, body.confirm, body.reason, caller))


@router.post(
    "/sinks/reconcile",
    response_model=ReconcileSuspendedResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
)
async def reconcile_suspended_sinks(
    operations: OperationsDep, body: ReconcileSuspendedRequest, caller: Caller
) -> ReconcileSuspendedResponse:
    """Reconcile several suspended sinks at once (after a restore of the metastore: every sink it put behind its
    tables, with all_suspended), each as POST /sinks/{sink}/reconcile does. A named sink that is unknown (404) or not
    suspended (409) refuses the request, nothing changed; a sink whose own reconcile is refused is listed in
    `refused` with why, and the others go on (docs/operations.md, 'A restored metastore')."""
    names = None if body.all_suspended else body.sinks
    return ReconcileSuspendedResponse.of(await operations.reconcile_suspended(names, body.reason, caller))


@router.post(
    "/sinks/{sink}/reconcile",
    response_model=ReconcileResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
)
async def reconcile_sink(
    operations: OperationsDep, sink: SinkName, body: ReconcileRequest, caller: Caller
) -> ReconcileResponse:
    """A suspended sink whose log is behind its tables (a metastore restored from an earlier backup) or whose table
    is another one under its name: set the log to what the tables hold, fence the writer, and let the next one start
    a new numbering from the restart point (docs/operations.md, 'A restored metastore')."""
    return ReconcileResponse.of(await operations.reconcile(sink, body.confirm, body.reason, caller))


@router.post(
    "/sinks/{sink}/tables/{table}/remove",
    response_model=RemoveTableResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
)
async def remove_table(
    operations: OperationsDep,
    sink: SinkName,
    table: Annotated[str, PathParameter(max_length=600, description="One of the sink's tables, not its own.")],
    body: RemoveTableRequest,
    caller: Caller,
) -> RemoveTableResponse:
    """A fan-out table gone for good (dropped from the catalog) wedges its sink: the committer retries it forever,
    and an abort or a reset cannot settle its epochs. This removes it from the sink: the files that epochs not yet
    COMMITTED have there are given up (their records, counted in the answer, reach no table), the writer is fenced
    (restart it with routes that no longer name the table), and the other tables go on (docs/operations.md)."""
    return RemoveTableResponse.of(await operations.remove_table(sink, table, body.confirm, body.reason, caller))


@router.post(
    "/sinks/{sink}/delete",
    response_model=DeleteSinkResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT),
)
async def delete_sink(
    operations: OperationsDep, sink: SinkName, body: DeleteSinkRequest, caller: Caller
) -> DeleteSinkResponse:
    """Delete a sink (a typo, a trial run): its rows in the log and the files of its epochs not committed; with
    drop_tables also its tables, whose files are deleted only when proven garbage. `confirm` repeats its name.
    Refused (409, nothing changed) while its writer is live (a call within STALLED_AFTER_SECONDS) and, with
    drop_tables, when another sink writes one of its tables. What its tables hold stays unless they are dropped
    (docs/operations.md)."""
    deleted = await operations.delete_sink(sink, body.confirm, body.reason, body.drop_tables, caller)
    return DeleteSinkResponse.of(deleted)


@router.post("/sinks/{sink}/resume", response_model=SinkResponse, responses=error_responses(HTTPStatus.NOT_FOUND))
async def resume_sink(operations: OperationsDep, sink: SinkName, caller: Caller) -> SinkResponse:
    """Retry the commits of a stuck sink (committer state `stuck`: a failure no retry could fix), once its
    cause is fixed; answers the sink as it is then (stuck again if the cause is still there)."""
    return SinkResponse.of(await operations.resume_sink(sink, caller))


@router.get(
    "/sinks/{sink}/maintenance",
    response_model=MaintenanceResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def get_maintenance(operations: OperationsDep, sink: SinkName, _: Reader, runs: Runs = 20) -> MaintenanceResponse:
    """The maintenance of the sink's table: the settings in force, the sink's overrides, the last runs."""
    return MaintenanceResponse.of(await operations.maintenance(sink, runs))


@router.put(
    "/sinks/{sink}/maintenance",
    response_model=MaintenanceResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND),
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
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def run_maintenance(operations: OperationsDep, sink: SinkName, caller: Caller) -> MaintenanceRunResponse:
    """Maintain the sink's table now (expiration, compaction and the orphan sweep), under its commit lock;
    answers when the run is over, with what it did (its outcome says whether it failed, and why). 503 when
    the sink's committer holds the lock past ADMIN_LOCK_TIMEOUT_SECONDS, nothing done."""
    return MaintenanceRunResponse.model_validate(await operations.run_maintenance(sink, caller))


@router.post(
    "/sinks/{sink}/verify",
    response_model=VerificationResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def verify_sink(
    operations: OperationsDep, sink: SinkName, body: VerifyRequest, _: Caller
) -> VerificationResponse:
    """Prove that the sink's tables hold exactly what its topics held in the committed range (docs/operations.md,
    "Verification"): its epochs' offset ranges and its tables' snapshots, the live rows' Kafka positions and keys,
    and with bootstrap_servers the topics' offsets; records the outcome (GET .../verification). Reads only: no
    table or epoch changes. Answers when done (a deep verification of a large table takes seconds)."""
    return VerificationResponse.of(await operations.verify_sink(sink, body.kafka(), body.incremental))


@router.get(
    "/sinks/{sink}/verification",
    response_model=VerificationStateResponse,
    responses=error_responses(HTTPStatus.NOT_FOUND),
)
async def get_verification(operations: OperationsDep, sink: SinkName, _: Reader) -> VerificationStateResponse:
    """Where verification of each of the sink's tables stands: how far it was proven, and the last outcome."""
    return VerificationStateResponse.of(sink, await operations.verification(sink))
