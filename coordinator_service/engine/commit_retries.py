"""Which failures of a commit pass retrying can fix, and what the retries metric names each."""

from __future__ import annotations

import psycopg
import pydantic
import structlog
from sqlalchemy.exc import SQLAlchemyError

from coordinator_service.contract.errors import (
    CatalogConflict,
    CatalogUnavailable,
    CommitLockLost,
    InvalidArgument,
    MetastoreUnavailable,
    SinkSuspended,
)
from coordinator_service.log.precommit_metadata import MetadataDecodeError
from coordinator_service.tables.catalog_calls import PERMANENT_FAILURES
from coordinator_service.tables.key_resolution import KeysUnresolvable

log = structlog.get_logger(__name__)


# Failures of a commit pass that retrying cannot fix: the log's record cannot be decoded, the table is gone or
# refuses what the pass built, a keyed commit cannot resolve the epochs' keys (a key twice in an epoch), the catalog
# refuses the coordinator's credentials, or the code met a state it does not expect. Everything else (conflicts,
# outages, a lost lock, timeouts) is retried.
PERMANENT_COMMIT_FAILURES: tuple[type[BaseException], ...] = (
    MetadataDecodeError,
    InvalidArgument,
    SinkSuspended,
    KeysUnresolvable,
    *PERMANENT_FAILURES,
    pydantic.ValidationError,
    AssertionError,
    TypeError,
    AttributeError,
    KeyError,
)


def cannot_succeed_by_retrying(error: BaseException) -> bool:
    return isinstance(error, PERMANENT_COMMIT_FAILURES)


def retry_cause(error: BaseException | None) -> str:
    """Why a commit pass failed, as the retries metric names it (metrics.RETRY_CAUSES)."""
    if isinstance(error, CommitLockLost):
        return "commit_lock_lost"
    chain: list[BaseException] = []
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    if any(isinstance(each, CatalogConflict) for each in chain):
        return "catalog_conflict"
    for each in chain:  # the outermost that says whose failure it was
        if isinstance(each, CatalogUnavailable):
            return "catalog"
        if isinstance(each, MetastoreUnavailable | SQLAlchemyError | psycopg.Error):
            return "metastore"
    return "other"
