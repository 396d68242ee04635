"""Openings of a SQL catalog on PostgreSQL take turns, so that coordinators starting together all open it.

pyiceberg's SQL catalog creates its tables when it is opened (SqlCatalog's constructor: CREATE TABLE for each one it
does not find). Coordinators that start together on a fresh database (the serving processes of one supervisor, the
replicas of a first deployment) would race there: PostgreSQL lets one CREATE TABLE of a name through and fails the
others (a unique violation on pg_type, or DuplicateTable), and the start of each loser ended with "cannot serve".
Under a session-level advisory lock on the catalog's database, each opening finds the tables made, or makes them
alone. Any other catalog opens as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import psycopg
from sqlalchemy import exc, make_url

from coordinator_service.log.database import ConnectionOptions, libpq_url

# Advisory lock class of the catalog's creation ("CT"), apart from the commit lock's, the admission lock's and the
# reporter lease's classes.
CATALOG_LOCK_CLASS: Final = 0x4354
CATALOG_LOCK_KEY: Final = 0


def _postgres_sql_catalog(properties: Mapping[str, str]) -> str | None:
    """The URL of a SQL catalog's PostgreSQL database; None for any other catalog."""
    if properties.get("type") != "sql":
        return None
    try:
        url = make_url(properties.get("uri", ""))
    except exc.ArgumentError:
        return None  # pyiceberg says what is wrong with it when it opens the catalog
    return libpq_url(url) if url.get_backend_name() == "postgresql" else None


@contextmanager
def catalog_creation_turn(properties: Mapping[str, str], options: ConnectionOptions | None = None) -> Iterator[None]:
    """The block (a catalog's opening) run alone among those of the same SQL catalog on PostgreSQL."""
    url = _postgres_sql_catalog(properties)
    if url is None:
        yield
        return
    with psycopg.connect(url, autocommit=True, **({} if options is None else options.libpq())) as connection:
        lock = {"class_id": CATALOG_LOCK_CLASS, "key": CATALOG_LOCK_KEY}
        connection.execute("SELECT pg_advisory_lock(%(class_id)s, %(key)s)", lock)
        try:
            yield
        finally:
            connection.execute("SELECT pg_advisory_unlock(%(class_id)s, %(key)s)", lock)
