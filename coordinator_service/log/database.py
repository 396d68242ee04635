"""Engines and transactions on the metastore; connection failures become Unavailable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import structlog
from sqlalchemy import Engine, create_engine, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import QueuePool

from coordinator_service import metrics
from coordinator_service.contract.errors import InvalidArgument, MetastoreUnavailable, cause
from coordinator_service.metrics import scrape as metrics_scrape

log = structlog.get_logger(__name__)

T = TypeVar("T")

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


def _unreachable(error: BaseException) -> BaseException:
    """What a connectivity error means to the caller: the metastore unreachable (a retry), unless the task is being
    cancelled. A statement cut short by the cancellation leaves its connection busy, so the rollback that follows
    fails ("another command is already in progress"); taken for an outage, which callers may tolerate, the
    cancellation would be swallowed and the task would go on after its owner stopped it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return asyncio.CancelledError()
    return MetastoreUnavailable(f"the PostgreSQL metastore is unreachable: {cause(error)}")


def libpq_url(url: str | URL) -> str:
    """The URL as libpq (a plain psycopg connection) takes it: no SQLAlchemy driver name, the password kept."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_sync_engine(url: URL, options: ConnectionOptions | None = None) -> Engine:
    """A blocking engine (migrations, the start's checks); with `options`, a metastore that does not answer fails
    its connection in their time instead of hanging."""
    return create_engine(url, pool_pre_ping=True, connect_args={} if options is None else options.libpq())


async def within(seconds: float, awaitable: asyncio.Future[T] | Coroutine[Any, Any, T]) -> T:
    """The awaitable's result if it comes within `seconds`, else TimeoutError, the awaitable left to end by itself
    (cancelling a psycopg call stuck on a frozen server would wait on psycopg's own cancel request first)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.add_done_callback(_consume)
        raise TimeoutError(f"no answer within {seconds:g} s")
    return task.result()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True)
class ConnectionOptions:
    """How the coordinator connects to the metastore: timeouts, keepalives, pool and name (the DATABASE_* and
    METASTORE_* settings)."""

    connect_timeout_seconds: float = 5.0
    statement_timeout_seconds: float = 30.0
    tcp_timeout_seconds: float = 10.0
    pool_size: int = 10
    pool_timeout_seconds: float = 5.0
    application_name: str = "sink-coordinator"
    stall_seconds: float = 2.0

    def libpq_connection(self) -> dict[str, str]:
        """The connection's own parameters of libpq (no statement timeout), as URL query values."""
        return {key: str(value) for key, value in self.libpq().items() if key != "options"}

    def libpq(self) -> dict[str, Any]:
        """libpq's connection parameters (psycopg's connect keywords)."""
        tcp = max(1, int(self.tcp_timeout_seconds))
        return {
            "connect_timeout": max(1, int(self.connect_timeout_seconds)),
            "application_name": self.application_name,
            "keepalives": 1,
            "keepalives_idle": max(1, tcp // 2),
            "keepalives_interval": max(1, tcp // 6),
            "keepalives_count": 3,
            "tcp_user_timeout": tcp * 1000,
            "options": f"-c statement_timeout={int(self.statement_timeout_seconds * 1000)}",
        }


class Database:
    """The async engine of the metastore and the one way to open a transaction on it; whether it answers now."""

    def __init__(self, url: URL, options: ConnectionOptions | None = None) -> None:
        self.url = url
        self.options = options or ConnectionOptions()
        self.engine: AsyncEngine = create_async_engine(
            url,
            pool_size=self.options.pool_size,
            max_overflow=self.options.pool_size,
            pool_timeout=self.options.pool_timeout_seconds,
            pool_pre_ping=True,
            connect_args=self.options.libpq(),
        )
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        # When the watch's last ping was answered, and since when it has not been (None: answering).
        self._silent_since: float | None = None
        self._silent = asyncio.Event()
        self._last_error = ""
        self._watch: asyncio.Task[None] | None = None
        self._watch_connection: psycopg.AsyncConnection[Any] | None = None

    def start_watch(self) -> None:
        """Ping the metastore every second on a connection of its own (see answering)."""
        self._watch = asyncio.create_task(self._watch_forever(), name="metastore-watch")

    async def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)

    @property
    def silent_seconds(self) -> float:
        """How long the metastore has not answered the watch's pings (0: it answers)."""
        return 0.0 if self._silent_since is None else time.monotonic() - self._silent_since

    def check_answering(self) -> None:
        """Unavailable at once, without waiting on a connection, while the metastore does not answer the watch: a
        stalled or frozen PostgreSQL is answered in seconds, not at the caller's deadline."""
        if self._silent_since is not None:
            raise MetastoreUnavailable(
                f"the PostgreSQL metastore is unreachable (no answer for {self.silent_seconds:.0f} s: "
                f"{self._last_error}): retry"
            )

    async def silence(self) -> None:
        """Return once the metastore is taken as not answering (at once if it is now)."""
        await self._silent.wait()

    async def _watch_forever(self) -> None:
        ping: asyncio.Task[None] | None = None
        while True:
            started = time.monotonic()
            if ping is None or ping.done():
                ping = asyncio.create_task(self._ping(), name="metastore-ping")
            try:
                await within(self.options.stall_seconds, ping)
            except (TimeoutError, psycopg.Error, OSError) as error:
                # A ping stuck on a frozen server is left to end by itself (cancelling it would wait on psycopg's
                # own cancel request); the next rounds wait on it.
                self._last_error = cause(error) or "no answer"
                if isinstance(error, psycopg.Error | OSError):
                    self._watch_connection = None
                if self._silent_since is None:
                    self._silent_since = started
                    self._silent.set()
                    log.error("the metastore does not answer", error=self._last_error)
            else:
                if self._silent_since is not None:
                    log.warning("the metastore answers again", silent_seconds=round(self.silent_seconds, 1))
                self._silent_since = None
                self._silent.clear()
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    async def _ping(self) -> None:
        if self._watch_connection is None or self._watch_connection.closed:
            self._watch_connection = await psycopg.AsyncConnection.connect(
                self.libpq_url, autocommit=True, **self.options.libpq()
            )
        await self._watch_connection.execute("SELECT 1")

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
        except exc.TimeoutError as error:
            raise self._no_free_connection() from error
        except _CONNECTIVITY_ERRORS as error:
            raise _unreachable(error) from error

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
        except exc.TimeoutError as error:
            raise self._no_free_connection() from error
        except _CONNECTIVITY_ERRORS as error:
            raise _unreachable(error) from error

    def _no_free_connection(self) -> MetastoreUnavailable:
        """The pool had no connection free within DATABASE_POOL_TIMEOUT_SECONDS: counted, and retryable."""
        metrics.METASTORE_POOL_TIMEOUTS.inc()
        return MetastoreUnavailable(
            f"no free metastore connection within {self.options.pool_timeout_seconds:g} s (all "
            f"{2 * self.options.pool_size} in use): retry"
        )

    def pool_gauges(self) -> metrics_scrape.PoolGauges:
        """The pool's connections now (for /metrics)."""
        pool = self.engine.pool
        in_use = pool.checkedout() if isinstance(pool, QueuePool) else 0
        idle = pool.checkedin() if isinstance(pool, QueuePool) else 0
        return metrics_scrape.PoolGauges(in_use=in_use, idle=idle, most=2 * self.options.pool_size)

    async def dispose(self) -> None:
        await self.engine.dispose()
