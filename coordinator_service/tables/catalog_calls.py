"""Calling the Iceberg catalog from the event loop: blocking pyiceberg work in a thread, outages as Unavailable; and
how the engine tells a catalog's failures apart without naming pyiceberg (a commit conflict, a failure no retry
fixes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pyiceberg import exceptions as pyiceberg_errors
from pyiceberg.exceptions import CommitFailedException, ServerError
from sqlalchemy.exc import SQLAlchemyError

from coordinator_service.contract.errors import CatalogConflict, CatalogUnavailable, CoordinatorError, cause
from coordinator_service.log.database import DATA_ERRORS, unstorable

T = TypeVar("T")
P = ParamSpec("P")

# The catalog's and the table format's failures that retrying the same work cannot fix: the table or its namespace
# is gone, the table refuses what was built for it, the catalog refuses the coordinator's credentials.
PERMANENT_FAILURES: tuple[type[BaseException], ...] = (
    pyiceberg_errors.NoSuchTableError,
    pyiceberg_errors.NoSuchNamespaceError,
    pyiceberg_errors.ValidationError,
    pyiceberg_errors.ValidationException,
    pyiceberg_errors.BadRequestError,
    pyiceberg_errors.UnauthorizedError,
    pyiceberg_errors.ForbiddenError,
)

# The catalog refused the coordinator's credentials (a retry with the same ones fails the same way).
CREDENTIALS_REFUSED: tuple[type[BaseException], ...] = (
    pyiceberg_errors.UnauthorizedError,
    pyiceberg_errors.ForbiddenError,
)


async def in_catalog(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking catalog function in a worker thread; outages become CatalogUnavailable and commit conflicts
    CatalogConflict (both retryable), a value the catalog's database cannot store InvalidArgument. Every catalog
    call of the engine goes through here: a catalog's failure is never taken for the metastore's (a SQL catalog's
    errors are SQLAlchemy's too, and the metastore's connections would claim them)."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except CoordinatorError:
        raise
    except DATA_ERRORS as error:
        raise unstorable(error) from error
    except CommitFailedException as error:
        raise CatalogConflict(f"the Iceberg catalog refused a commit on a stale table: {cause(error)}") from error
    except (ServerError, SQLAlchemyError, OSError) as error:
        raise CatalogUnavailable(f"the Iceberg catalog or its storage failed: {cause(error)}") from error
