"""Where the state lives: the PostgreSQL metastore (its connections and timeouts) and the Iceberg catalog."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
)

from coordinator_service.settings.bounds import DAY


class StorageSettings(BaseModel):
    """The metastore, the data directory and the catalog."""

    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL of the PostgreSQL metastore (postgresql+psycopg://user:pass@host/db). "
        "Unset: start the embedded PostgreSQL in DATA_DIR.",
    )
    database_url_file: Path | None = Field(default=None, description="File holding DATABASE_URL.")
    data_dir: Path = Field(
        default=Path(".sink-coordinator"),
        description="Directory of the embedded PostgreSQL and the default local warehouse.",
    )
    database_connect_timeout_seconds: float = Field(
        default=5.0, ge=1.0, le=300.0, allow_inf_nan=False, description="Longest wait for a new metastore connection."
    )
    database_statement_timeout_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="Longest metastore statement (PostgreSQL's statement_timeout; 0: none).",
    )
    database_tcp_timeout_seconds: float = Field(
        default=10.0,
        ge=1.0,
        le=600.0,
        allow_inf_nan=False,
        description="A metastore connection whose peer stops acknowledging (a failover, a host gone) is dropped after "
        "this long (TCP keepalives and tcp_user_timeout).",
    )
    database_pool_size: int = Field(
        default=10, ge=1, le=1000, description="Metastore connections kept open (as many again may be opened)."
    )
    database_pool_timeout_seconds: float = Field(
        default=5.0,
        ge=0.1,
        le=300.0,
        allow_inf_nan=False,
        description="Longest wait for a free metastore connection before the call answers UNAVAILABLE.",
    )
    database_application_name: str = Field(
        default="sink-coordinator",
        pattern=r"^[\x20-\x7e]{1,63}$",
        description="application_name of the metastore connections (pg_stat_activity shows it).",
    )
    metastore_stall_seconds: float = Field(
        default=2.0,
        ge=0.1,
        le=60.0,
        allow_inf_nan=False,
        description="The metastore is pinged every second; one that has not answered for this long is taken as "
        "down: writers' calls answer UNAVAILABLE at once, /metrics says metastore_up 0, until it answers again.",
    )
    migration_lock_timeout_seconds: float = Field(
        default=10.0,
        ge=0.1,
        le=3600.0,
        allow_inf_nan=False,
        description="migrate: how long each migration waits for a lock before it fails (the old release's pods keep "
        "serving during a rolling upgrade; a migration queued behind their transactions would block them).",
    )
    migration_retry_seconds: float = Field(
        default=120.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="migrate: how long to keep trying again when the migrations gave up on a lock or were chosen as a "
        "deadlock's victim by a serving pod's transaction (each try is rolled back whole and starts over).",
    )
    metastore_check_interval_seconds: float = Field(
        default=300.0,
        ge=1.0,
        le=DAY,
        allow_inf_nan=False,
        description="How often every sink is checked against its tables (and once at start): a table holding epochs "
        "above the log's checkpoint (a restored metastore), another table under a sink's table's name, another "
        "catalog suspend the sink (docs/operations.md, 'A restored metastore').",
    )
    catalog_name: str = Field(default="default", description="Name of the pyiceberg catalog.")
    allow_local_warehouse: bool = Field(
        default=False,
        description="Serve on an address beyond loopback (BIND_HOST) with the warehouse on this machine's file "
        "system (no catalog: DATA_DIR/warehouse; or a file: warehouse). Only where every writer's executors share "
        "that file system; otherwise `serve` refuses to start.",
    )
    catalog: dict[str, str] = Field(
        default_factory=dict,
        description="pyiceberg catalog properties (CATALOG__<key>=value, or --catalog key=value). "
        "Empty: a SQL catalog in the metastore database with a warehouse in DATA_DIR/warehouse.",
    )

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def warehouse_dir(self) -> Path:
        return self.data_dir / "warehouse"
