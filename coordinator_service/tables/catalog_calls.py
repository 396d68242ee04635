"""Calling the Iceberg catalog from the event loop: blocking pyiceberg work in a thread, outages as Unavailable."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pyiceberg.exceptions import CommitFailedException, ServerError
from sqlalchemy.exc import SQLAlchemyError

from coordinator_service.contract.errors import CatalogUnavailable, CoordinatorError, cause
from coordinator_service.log.database import DATA_ERRORS, unstorable

T = TypeVar("T")


async def in_catalog(function: Callable[..., T], *args: object) -> T:
    """Run a blocking catalog function in a worker thread; outages and commit conflicts become Unavailable
    (retryable), a value the catalog's database cannot store InvalidArgument."""
    try:
        return await asyncio.to_thread(function, *args)
    except CoordinatorError:
        raise
    except DATA_ERRORS as error:
        raise unstorable(error) from error
    except (CommitFailedException, ServerError, SQLAlchemyError, OSError) as error:
        raise CatalogUnavailable(f"the Iceberg catalog or its storage failed: {cause(error)}") from error
