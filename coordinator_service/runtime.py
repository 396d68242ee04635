"""Resolving the metastore and the catalog from the settings: the embedded defaults or the configured ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import structlog
from pyiceberg.catalog import Catalog, load_catalog
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from coordinator_service import metrics
from coordinator_service.engine.cleaner import Cleaner
from coordinator_service.engine.committer import Committer
from coordinator_service.engine.maintenance import Maintainer
from coordinator_service.engine.metastore_checks import MetastoreChecks
from coordinator_service.engine.protocol import Coordinator
from coordinator_service.log import schema, sink_rows
from coordinator_service.log.catalog_creation import catalog_creation_turn
from coordinator_service.log.database import ConnectionOptions, Database, create_sync_engine, normalize_url
from coordinator_service.log.embedded import start_embedded_postgres
from coordinator_service.log.reporter_lease import ReporterLease
from coordinator_service.settings import Settings
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.pyiceberg_internals import keep_avro_readers, keeping_metadata
from coordinator_service.tables.warehouse import local_warehouse

log = structlog.get_logger(__name__)

# How long a part of the background work may take to end once cancelled, before the close goes on without it: a
# task whose clean-up waits on something that never comes (a connection's lock, a server that does not answer) must
# not hold a shutdown until the orchestrator's kill.
STOP_SECONDS: Final = 10.0


async def _stop_within(name: str, stop: Callable[[], Awaitable[None]]) -> None:
    try:
        async with asyncio.timeout(STOP_SECONDS):
            await stop()
    except TimeoutError:
        # The timeout cancelled the wait, and with it the task once more: what it waited on is interrupted.
        log.error(
            "a part of the background work did not stop in time; closing without waiting for it",
            part=name,
            seconds=STOP_SECONDS,
        )


def metastore_url(settings: Settings) -> tuple[URL, bool]:
    """The metastore URL, and whether it is the embedded server (started here if needed)."""
    if settings.database_url is not None:
        return normalize_url(settings.database_url.get_secret_value()), False
    return normalize_url(start_embedded_postgres(settings.postgres_dir)), True


# SQLSTATEs of a migration that met a serving transaction: it gave up on a lock (lock_timeout), or PostgreSQL chose it
# as a deadlock's victim. Either way the whole run was rolled back, and the same run can succeed a moment later.
_LOCK_CONFLICTS: Final = frozenset({"55P03", "40P01"})
_FIRST_RETRY_SECONDS: Final = 0.5
_LONGEST_RETRY_SECONDS: Final = 5.0


def migrate(url: URL, to: str = "head", lock_timeout_seconds: float = 10.0, retry_seconds: float = 0.0) -> str:
    """Upgrade the metastore's schema to `to` (head: this release's), or roll it back to an older revision (ValueError
    for a revision this release does not know, nothing touched). A run that met a serving pod's transaction (a lock
    given up after `lock_timeout_seconds`, a deadlock) is rolled back whole and tried again, with backoff, for up to
    `retry_seconds`."""
    schema.check_target(to)
    deadline, delay = time.monotonic() + retry_seconds, _FIRST_RETRY_SECONDS
    while True:
        try:
            return _migrate_once(url, to, lock_timeout_seconds)
        except OperationalError as error:
            if getattr(error.orig, "sqlstate", None) not in _LOCK_CONFLICTS or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "the migration met a serving transaction's locks and was rolled back; trying again",
                error=str(error.orig).strip(),
                retry_in_seconds=delay,
            )
            time.sleep(delay)
            delay = min(delay * 2, _LONGEST_RETRY_SECONDS)


def _migrate_once(url: URL, to: str, lock_timeout_seconds: float) -> str:
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            current = schema.current_revision(connection)
            if to != "head" and current is not None and to < current:
                schema.downgrade(connection, to, lock_timeout_seconds)
            else:
                schema.upgrade(connection, to, lock_timeout_seconds)
            revision = schema.current_revision(connection)
    finally:
        engine.dispose()
    return revision or ""


def require_migrated(url: URL, options: ConnectionOptions | None = None) -> None:
    engine = create_sync_engine(url, options)
    try:
        with engine.connect() as connection:
            schema.require_current_schema(connection)
    finally:
        engine.dispose()


def connection_options(settings: Settings) -> ConnectionOptions:
    return ConnectionOptions(
        connect_timeout_seconds=settings.database_connect_timeout_seconds,
        statement_timeout_seconds=settings.database_statement_timeout_seconds,
        tcp_timeout_seconds=settings.database_tcp_timeout_seconds,
        pool_size=settings.database_pool_size,
        pool_timeout_seconds=settings.database_pool_timeout_seconds,
        application_name=settings.database_application_name,
        stall_seconds=settings.metastore_stall_seconds,
    )


def catalog_properties(settings: Settings, url: URL) -> dict[str, str]:
    """The configured pyiceberg catalog properties, or a SQL catalog in the metastore database."""
    warehouse = local_warehouse(settings)
    # Made here (the configured one too), so that readiness tells a warehouse that vanished from one never made.
    if warehouse is not None:
        warehouse.mkdir(parents=True, exist_ok=True)
    if settings.catalog:
        return dict(settings.catalog)
    return {
        "type": "sql",
        "uri": url.render_as_string(hide_password=False),
        "warehouse": settings.warehouse_dir.expanduser().resolve().as_uri(),
    }


def open_catalog(settings: Settings, url: URL, options: ConnectionOptions | None = None) -> Catalog:
    """The catalog; the default SQL catalog in the metastore connects with `options` (its connect timeout and
    keepalives: a metastore that does not answer fails the start's attempt instead of hanging it)."""
    properties = catalog_properties(settings, url)
    if not settings.catalog and options is not None:
        uri = url.update_query_dict(options.libpq_connection())
        properties["uri"] = uri.render_as_string(hide_password=False)
    keep_avro_readers()  # every catalog's commits and maintenance read manifests in this process
    # Its tables are created at its first opening: coordinators starting together take turns (catalog_creation).
    with catalog_creation_turn(properties, options):
        return keeping_metadata(load_catalog(settings.catalog_name, **properties))


@dataclass
class Runtime:
    """The wired coordinator: metastore, catalog, committer and protocol."""

    settings: Settings
    database: Database
    iceberg: IcebergGateway
    committer: Committer
    cleaner: Cleaner
    coordinator: Coordinator
    maintainer: Maintainer
    checks: MetastoreChecks
    # Whether this replica reports the gauges read from the log (coordinator_service.log.reporter_lease).
    lease: ReporterLease
    # Readiness: since when each shared dependency (metastore, catalog) has been failing (admin.routes_health).
    dependencies_failing_since: dict[str, float] = field(default_factory=dict)

    @classmethod
    async def open(cls, settings: Settings) -> Runtime:
        """The runtime, its metastore and catalog reached; their failures as they are (coordinator_service.startup
        tells those a retry may fix)."""
        options = connection_options(settings)
        url, embedded = await asyncio.to_thread(metastore_url, settings)
        if embedded:
            revision = await asyncio.to_thread(migrate, url)
            log.info("embedded metastore migrated", revision=revision, data_dir=str(settings.data_dir))
        else:
            await asyncio.to_thread(require_migrated, url, options)
        catalog = await asyncio.to_thread(open_catalog, settings, url, options)
        database = Database(url, options)
        tables = IcebergGateway(catalog, settings.table_cache_seconds, settings.orphan_grace_seconds)
        committer = Committer(database, tables, settings)
        cleaner = Cleaner(database, tables, settings)
        metrics.SINK_SERIES.configure(settings.metrics_sink_detail_max_sinks)
        try:
            async with database.transaction() as session:
                metrics.SINK_SERIES.track(await sink_rows.sink_names(session))
        except BaseException:
            await database.dispose()
            raise
        return cls(
            settings,
            database,
            tables,
            committer,
            cleaner,
            Coordinator(database, tables, committer, cleaner),
            Maintainer(database, tables, committer, cleaner.deleter, settings),
            MetastoreChecks(database, tables, committer, settings),
            ReporterLease(database, settings.metrics_reporter_idle_seconds),
        )

    def start(self) -> None:
        """The background work: the metastore's watch, the checks of the log against the tables, the committer (with
        its poller), the cleaner and table maintenance."""
        self.database.start_watch()
        self.checks.start()
        self.committer.start()
        self.cleaner.start()
        self.maintainer.start()  # always: a sink's overrides may turn maintenance on where the default is off
        self.lease.start()

    async def close(self) -> None:
        """Stop the background work, each part within STOP_SECONDS, then let the metastore's connections go."""
        for name, stop in (
            ("reporter lease", self.lease.stop),
            ("checks", self.checks.stop),
            ("maintenance", self.maintainer.stop),
            ("cleaner", self.cleaner.stop),
            ("committer", self.committer.stop),
            ("writer requests", self.coordinator.close),
            ("metastore watch", self.database.stop_watch),
        ):
            await _stop_within(name, stop)
        await self.database.dispose()
