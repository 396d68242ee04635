"""Whose a table is: the coordinator's own (it created the table), an operator's adoption, or nobody's.

A writer may name a table the coordinator will create, one it created (for this sink or another), or one
that is already some sink's; a table that exists and is none of these (another engine's, another team's
history) is taken only after an operator adopted it (POST /api/v1/tables/{table}/adopt), because the
coordinator then commits to it, expires its snapshots and sweeps its orphan files. The origin is a table
property, so that it travels with the table whatever happens to the metastore.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from coordinator_service.contract.errors import FailedPrecondition, NotFound, quote
from coordinator_service.contract.table_identifiers import check_table_identifier
from coordinator_service.tables.pyiceberg_internals import coordinator_transaction

if TYPE_CHECKING:  # the gateway creates tables with this module's origin
    from coordinator_service.tables.iceberg import IcebergGateway

log = structlog.get_logger(__name__)

ORIGIN: Final = "sink-coordinator.origin"
CREATED: Final = "created"
ADOPTED: Final = "adopted"


def adopt_action(table: str) -> str:
    return f"POST /api/v1/tables/{table}/adopt"


def require_takeable(tables: IcebergGateway, identifier: str) -> None:
    """Refuse (FailedPrecondition) a table that exists, that the coordinator did not create and no operator
    adopted; a missing table is takeable (the call creates it). Blocking: call it in the catalog's thread."""
    parts = check_table_identifier(identifier)
    try:
        table = tables.catalog.load_table(parts)
    except (NoSuchTableError, NoSuchNamespaceError):
        return
    if table.properties.get(ORIGIN) not in (CREATED, ADOPTED):
        raise FailedPrecondition(
            f"table {quote(identifier)} exists in catalog {tables.catalog_name}, was not created by the coordinator "
            f"and no sink writes it: an operator adopts it for writers with {adopt_action(identifier)}. Nothing "
            "was changed"
        )


def adopt(tables: IcebergGateway, identifier: str, reason: str, who: str, client: str) -> bool:
    """Mark an existing table as one writers may take, for operator `who` asking from `client`; whether it changed
    (False: it was the coordinator's or adopted already). NotFound for a table the catalog does not have. Blocking:
    call it in the catalog's thread."""
    parts = check_table_identifier(identifier)
    try:
        table = tables.catalog.load_table(parts)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise NotFound(f"table {quote(identifier)} does not exist in catalog {tables.catalog_name}") from None
    if table.properties.get(ORIGIN) in (CREATED, ADOPTED):
        return False
    with coordinator_transaction(table) as transaction:
        transaction.set_properties({ORIGIN: ADOPTED})
    tables.forget(identifier)
    log.warning("table adopted for writers", table=identifier, who=who, client=client, reason=reason)
    return True
