"""The admin API's table routes (/api/v1/tables): an operator adopts an existing table for writers.

A writer may not take a table that exists, that the coordinator did not create and that no sink writes
(coordinator_service.tables.table_origin): an operator decides that, here, with a reason that is logged.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParameter

from coordinator_service.admin.action_schemas import AdoptRequest, AdoptResponse
from coordinator_service.admin.deps import Caller, RuntimeDep
from coordinator_service.admin.routes_sinks import API_ERRORS, API_PREFIX, error_responses
from coordinator_service.tables import table_origin
from coordinator_service.tables.catalog_calls import in_catalog

TableName = Annotated[
    str, PathParameter(max_length=600, description="The table's identifier in the catalog, 'namespace.table'.")
]

router = APIRouter(prefix=API_PREFIX, tags=["tables"], responses=API_ERRORS)


@router.post("/tables/{table}/adopt", response_model=AdoptResponse, responses=error_responses(HTTPStatus.NOT_FOUND))
async def adopt_table(runtime: RuntimeDep, table: TableName, body: AdoptRequest, caller: Caller) -> AdoptResponse:
    """Let writers take an existing table the coordinator did not create (a RegisterWriter or EnsureTables naming
    it is refused until then): the coordinator will commit to it, expire its snapshots and sweep its orphan
    files like its own. Marks the table (property sink-coordinator.origin=adopted); 404 when the catalog has
    no such table."""
    changed = await in_catalog(table_origin.adopt, runtime.iceberg, table, body.reason, caller.identity, caller.address)
    return AdoptResponse(table=table, changed=changed)
