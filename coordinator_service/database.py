"""Engines and transactions on the metastore; connection failures become Unavailable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from sqlalchemy import Engine, create_engine, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from coordinator_service.errors import InvalidArgument, Unavailable, cause

_CONNECTIVITY_ERRORS = (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, OSError)

# SQLSTATE class 22, "data exception" (a NUL byte in text, a string longer than its column, a number out of
# range), from PostgreSQL or raised by psycopg before sending: no retry can store the value.
DATA_ERRORS: tuple[type[Exception], ...] = (exc.DataError, psycopg.DataError)


def unstorable(error: BaseException) -> InvalidArgument:
    """A DATA_ERRORS failure as the caller hears it: the request's fault, not an outage to retry."""
    return InvalidArgument(f"the request holds a value that cannot be stored: {cause(error)}")


def normalize_url(url: str) -> URL:
    """Use psycopg 3 whatever PostgreSQL driver the URL names; reject other databases."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(
            f"the metastore must be PostgreSQL, got a {parsed.get_backend_name()!r} URL; "
            "use postgresql+psycopg://user:password@host:5432/database"
        )
    return parsed.set(drivername="postgresql+psycopg")


def libpq_url(url: str | URL) -> str:
    """The URL as libpq (a plain psycopg connection) takes it: no SQLAlchemy driver name, the password kept."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_sync_engine(url: URL) -> Engine:
    return create_engine(url, pool_pre_ping=True)


class Database:
    """The async engine of the metastore and the one way to open a transaction on it."""

    def __init__(self, url: URL, pool_size: int = 10) -> None:
        self.url = url
        self.engine: AsyncEngine = create_async_engine(
            url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
        )
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    @property
    def libpq_url(self) -> str:
        """The URL for a plain psycopg connection (outside SQLAlchemy's pool)."""
        return libpq_url(self.url)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends, rolled back on any error."""
        try:
            async with self._sessions() as session, session.begin():
                yield session
        except _CONNECTIVITY_ERRORS as error:
            raise Unavailable(f"the PostgreSQL metastore is unreachable: {cause(error)}") from error

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncSession]:
        """A session for reads that need no transaction: each statement commits on its own (no BEGIN and COMMIT
        round trips). What it reads may be a plan, never a decision: decisions are taken in a transaction."""
        async with self.connection(autocommit=True) as connection, AsyncSession(bind=connection) as session:
            yield session

    @asynccontextmanager
    async def connection(self, *, autocommit: bool = False) -> AsyncIterator[AsyncConnection]:
        """A connection of its own, for session-level advisory locks; with autocommit, every statement is its
        own transaction (no BEGIN and COMMIT round trips around a lock or an unlock)."""
        try:
            async with self.engine.connect() as connection:
                if autocommit:
                    await connection.execution_options(isolation_level="AUTOCOMMIT")
                yield connection
        except _CONNECTIVITY_ERRORS as error:
            raise Unavailable(f"the PostgreSQL metastore is unreachable: {cause(error)}") from error

    async def dispose(self) -> None:
        await self.engine.dispose()
