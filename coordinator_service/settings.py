"""Every knob of the coordinator, read from SINK_COORDINATOR_* variables and the matching flags."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar, Final, Self

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from coordinator_service import failpoints
from coordinator_service.contract.logs import LogFormat, LogLevel
from coordinator_service.writer_scopes import WriterScope, check_disjoint, check_scope_names

ENV_PREFIX = "SINK_COORDINATOR_"
# A token is a secret only if it cannot be guessed: at least this many characters, of the bearer-token alphabet
# (RFC 6750's b64token, what an Authorization header and gRPC metadata carry as they are), not monotonous.
MIN_TOKEN_CHARACTERS: Final = 32
MIN_DISTINCT_TOKEN_CHARACTERS: Final = 8
_TOKEN_ALPHABET: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")

# A list in a variable: comma-separated ("localhost,coordinator.example"); a flag is repeated.
CommaSeparated = Annotated[list[str], NoDecode]

# Bounds the code can live with: durations become timedeltas and SQL intervals, counts SQL limits and integers.
DAY = 24 * 3600.0
THIRTY_DAYS = 30 * DAY
TEN_YEARS = 3650 * DAY
INT32_MAX = 2**31 - 1

# A size of data files: bytes, or with a unit (128MiB, 1GB) in a flag or a variable. JSON (the admin API, where a
# sink's overrides are integers) keeps the integer's schema.
MAX_FILE_BYTES = 2**50  # 1 PiB
FileBytes = Annotated[
    ByteSize,
    Field(ge=1024, le=MAX_FILE_BYTES),
    WithJsonSchema({"type": "integer", "minimum": 1024, "maximum": MAX_FILE_BYTES}),
]


class MaintenancePolicy(BaseModel):
    """How the coordinator maintains a sink's table: the coordinator's settings, or a sink's overrides of them
    (the admin API's PUT /api/v1/sinks/{sink}/maintenance), validated by the same rules."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    maintenance_enabled: bool = Field(
        default=True,
        description="Keep every sink's table healthy between its commits: expire snapshots, merge manifests, "
        "compact small files, sweep orphan files (docs/operations.md, Maintenance).",
    )
    maintenance_interval_seconds: float = Field(
        default=300.0,
        ge=0.1,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="How often a table's snapshots are expired and its small files compacted (per sink).",
    )
    snapshot_max_age_seconds: float = Field(
        default=24 * 3600.0,
        ge=1.0,
        le=TEN_YEARS,
        allow_inf_nan=False,
        description="Snapshots older than this are expired (time travel reaches this far back at most).",
    )
    snapshot_max_count: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="At most this many snapshots are kept, the newest; older ones are expired whatever their "
        "age. Bounds the table's metadata.json, which every commit rewrites.",
    )
    manifest_merge_min_count: int = Field(
        default=16,
        ge=2,
        le=1_000_000,
        description="A commit merges the table's manifests once this many have accumulated "
        "(Iceberg's commit.manifest.min-count-to-merge, set on the tables the coordinator commits to).",
    )
    compaction_target_file_bytes: FileBytes = Field(
        default=ByteSize(128 * 1024 * 1024),
        description="Compaction rewrites data files smaller than 3/4 of this into files of about this size "
        "(bytes, or 128MiB, 1GB, ...).",
    )
    compaction_min_files: int = Field(
        default=5,
        ge=2,
        le=INT32_MAX,
        description="Fewest small files of one partition that are worth a compaction.",
    )
    compaction_max_bytes_per_run: FileBytes = Field(
        default=ByteSize(1024 * 1024 * 1024),
        description="Most bytes of data files one maintenance run rewrites (the rest waits for the next run; "
        "bytes, or 1GiB, 500MB, ...).",
    )
    orphan_sweep_interval_seconds: float = Field(
        default=3600.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="How often the files under a table's location that nothing references are looked for.",
    )
    orphan_grace_seconds: float = Field(
        default=24 * 3600.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="An unreferenced file is deleted only once it is this old: a writer may be about to "
        "pre-commit it (Spark tasks write their files before the batch's pre-commit). A pre-commit refuses a "
        "file older than the coordinator's value, and the mark of a file deleted stays this long; a sink's "
        "override can only lengthen it.",
    )
    orphan_max_files_per_run: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most orphan files one maintenance run deletes."
    )

    def with_overrides(self, overrides: Mapping[str, object] | None) -> MaintenancePolicy:
        """This policy with a sink's overrides; ValidationError for an unknown name or a value out of range."""
        policy: MaintenancePolicy = MaintenancePolicy.model_validate(
            {**self.model_dump(include=set(MaintenancePolicy.model_fields)), **(overrides or {})}
        )
        return policy


class Settings(BaseSettings, MaintenancePolicy):
    """The coordinator's configuration.

    Values come from (highest first) command-line flags, environment variables
    with the prefix SINK_COORDINATOR_, and the defaults below. Every secret can
    also be read from a file named by the matching *_FILE setting.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

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
    grpc_port: int = Field(default=50051, ge=0, le=65535, description="Port of the gRPC writer API.")
    http_port: int = Field(default=8080, ge=0, le=65535, description="Port of the REST admin API.")
    bind_host: str = Field(default="127.0.0.1", description="Address both servers listen on.")
    admin_token: SecretStr | None = Field(
        default=None,
        description=f"Bearer token of the admin API and the console (at least {MIN_TOKEN_CHARACTERS} characters).",
    )
    admin_token_file: Path | None = Field(default=None, description="File holding ADMIN_TOKEN.")
    admin_token_previous: SecretStr | None = Field(
        default=None,
        description="During a rotation, the admin token being replaced: accepted beside ADMIN_TOKEN (actions are "
        "recorded as by 'admin (previous token)'), until it is unset.",
    )
    admin_token_previous_file: Path | None = Field(default=None, description="File holding ADMIN_TOKEN_PREVIOUS.")
    writer_token: SecretStr | None = Field(
        default=None,
        description="Token gRPC writers send in the 'authorization' metadata: every sink and table (WRITER_SCOPES "
        "gives each team a token of its own instead).",
    )
    writer_token_file: Path | None = Field(default=None, description="File holding WRITER_TOKEN.")
    writer_token_previous: SecretStr | None = Field(
        default=None,
        description="During a rotation, the writer token being replaced: accepted beside WRITER_TOKEN, until it is "
        "unset (a scope's is WRITER_SCOPES__<scope>__PREVIOUS_TOKEN).",
    )
    writer_token_previous_file: Path | None = Field(default=None, description="File holding WRITER_TOKEN_PREVIOUS.")
    writer_scopes: dict[str, WriterScope] = Field(
        default_factory=dict,
        description="Writer credentials, each covering named sinks and table namespaces, with quotas: JSON "
        '{"<scope>": {"token": ..., "sinks": ["orders-*"], "namespaces": ["sales"], "max_sinks": 100, '
        '"max_tables": 1000}}, or WRITER_SCOPES__<scope>__<field> variables (docs/operations.md, Writer scopes).',
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that opens /metrics and nothing else (for Prometheus). Once it is set, or "
        "wherever the read routes need the admin token, /metrics needs it (or the admin token).",
    )
    metrics_token_file: Path | None = Field(default=None, description="File holding METRICS_TOKEN.")
    admin_read_requires_token: bool = Field(
        default=True,
        description="With ADMIN_TOKEN set, require it on the admin API's and the console's read routes and on "
        "/metrics (which also takes METRICS_TOKEN) too; mutating routes always need it. /healthz and /readyz "
        "stay open.",
    )
    allowed_hosts: CommaSeparated = Field(
        default=["localhost", "127.0.0.1", "::1"],
        description="Host names (the Host header, without port) the admin API and the console answer; others get "
        "421, which stops DNS rebinding. '*': any. The probes and /metrics answer any Host.",
    )
    trusted_proxies: CommaSeparated = Field(
        default=[],
        description="Addresses of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed "
        "(the recorded operator address). Empty: none, the peer's address is recorded.",
    )
    metrics_cache_seconds: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        description="A /metrics scrape is answered from the last one this recent; concurrent scrapes share one "
        "read of the metastore.",
    )
    metrics_read_timeout_seconds: float = Field(
        default=5.0,
        ge=0.1,
        le=300.0,
        allow_inf_nan=False,
        description="Longest a /metrics scrape waits for the metastore's per-sink gauges; past it the scrape "
        "answers without them and with sink_coordinator_metastore_up 0 (keep it below Prometheus' scrape_timeout).",
    )
    metrics_sink_detail_max_sinks: int = Field(
        default=200,
        ge=0,
        le=1_000_000,
        description="With more sinks than this in the metastore, the latency histograms (pre-commit, commit, "
        "maintenance) and the counters of maintenance work lose their sink label: one series per bucket or count "
        "instead of one per sink (0: never per sink).",
    )
    metrics_reporter_idle_seconds: float = Field(
        default=180.0,
        ge=10.0,
        le=DAY,
        allow_inf_nan=False,
        description="The gauges read from the metastore (a sink's epochs, its last commit) come from one replica at "
        "a time, so that sum() over replicas counts each sink once; that replica gives the role up when it has not "
        "been scraped for this long (keep it above the scrape interval).",
    )
    grpc_max_concurrent_rpcs: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Most gRPC calls this process serves at once; more are refused with RESOURCE_EXHAUSTED. "
        "Multi-writer epochs hold one call per waiting writer.",
    )
    grpc_max_streams_per_connection: int = Field(
        default=100, ge=1, le=10_000, description="Most concurrent gRPC calls on one connection (HTTP/2 streams)."
    )
    grpc_max_connection_age_seconds: float = Field(
        default=1800.0,
        ge=1.0,
        le=7 * 24 * 3600.0,
        description="A gRPC connection is closed (GOAWAY) after this long, its calls given a grace to finish; "
        "clients reconnect, and spread over the replicas again.",
    )
    stalled_after_seconds: float = Field(
        default=300.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="A sink whose oldest PENDING epoch has waited this long is stalled (the admin API, the console, "
        "status, the metric sink_coordinator_sink_stalled): its writer died or hangs before the checkpoint, or its "
        "commits fail. A writer that called more recently is live: a sink is not deleted under it.",
    )
    admin_lock_timeout_seconds: float = Field(
        default=5.0,
        gt=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How long an abort, a reset, or a RegisterWriter that aborts epochs waits for a sink's "
        "commit lock (a committer finishing its Iceberg commit, the cleaner) before it answers 503 / UNAVAILABLE.",
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate (chain) that gRPC and HTTP serve; set TLS_KEY_FILE with it."
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of TLS_CERT_FILE.")
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
    commit_max_epochs: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Most checkpointed epochs coalesced into one Iceberg snapshot (1: none).",
    )
    commit_interval_seconds: float = Field(
        default=10.0,
        ge=0.0,
        le=DAY,
        allow_inf_nan=False,
        description="Least time between two Iceberg commits of one sink: the epochs checkpointed meanwhile are "
        "committed together, as one snapshot (0: a commit as soon as a checkpoint arrives). 10 s keeps a "
        "streaming table to at most 8,640 snapshots a day and the data about 10 s from the stream.",
    )
    commit_concurrency: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Most sinks committed at the same time by this process (each commit holds two metastore "
        "connections while it runs).",
    )
    table_cache_seconds: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How long table metadata read from the catalog is reused for pre-commit validation and as "
        "the committer's base before it is read again (0: read it every time). This process's own commits "
        "refresh it; a stale copy is detected (refused file, failed commit) and read again.",
    )
    retention_epochs: int = Field(
        default=1000,
        ge=0,
        le=INT32_MAX,
        description="COMMITTED epochs kept in the log per sink; older rows are pruned.",
    )
    cleanup_delay_seconds: float = Field(
        default=60.0,
        ge=0.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="Least time between the abort of an epoch (or the replacement of an attempt) and the deletion "
        "of its files, for an operator to look at them. Safety does not rest on it: an operator's abort fences "
        "the tables first, so no append built before it can land on files deleted after it.",
    )
    recovery_files_keep_seconds: float = Field(
        default=7 * 24 * 3600.0,
        ge=0.0,
        le=365 * DAY,
        allow_inf_nan=False,
        description="How long the files of an epoch aborted by recovery (a writer restarted below it) are kept "
        "while Spark has not run the batch again: if Kafka's retention removed the batch's records meanwhile, "
        "they are the last copy. The batch's new attempt releases them at once (after CLEANUP_DELAY_SECONDS). "
        "Default: Kafka's default retention, 7 days.",
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
    readiness_dependency_grace_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="/readyz turns unready over the metastore or the catalog only once it has failed this long: a "
        "blip of a dependency every replica shares must not take them all out of the Service at once.",
    )
    maintenance_concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Sinks maintained at the same time by this process (each run holds the sink's commit lock and "
        "two metastore connections).",
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
    poll_interval_seconds: float = Field(
        default=2.0,
        gt=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How often the committer looks for work recorded by other replicas.",
    )
    retry_initial_seconds: float = Field(
        default=0.2, gt=0.0, le=3600.0, allow_inf_nan=False, description="First backoff of a failed commit."
    )
    retry_max_seconds: float = Field(
        default=30.0, gt=0.0, le=DAY, allow_inf_nan=False, description="Longest backoff of a failed commit."
    )
    log_level: LogLevel = Field(default=LogLevel.INFO, description="DEBUG, INFO, WARNING or ERROR.")
    log_format: LogFormat = Field(default=LogFormat.JSON, description="json or console.")
    enable_failpoints: bool = Field(
        default=False,
        description="Testing only: allow FAILPOINTS, which kill or stall this process on purpose. Without it a "
        "non-empty FAILPOINTS is refused at start.",
    )
    failpoints: str = Field(
        default="",
        description="Testing only, with ENABLE_FAILPOINTS: comma-separated failure-injection points, e.g. "
        "precommit.after_persist=kill.",
    )

    @field_validator("failpoints")
    @classmethod
    def _known_failpoints(cls, spec: str, info: ValidationInfo) -> str:
        if failpoints.parse(spec) and not info.data.get("enable_failpoints", False):
            raise ValueError(
                f"failpoints ({spec}) kill or stall the coordinator on purpose, for tests: set "
                f"{ENV_PREFIX}ENABLE_FAILPOINTS=true to arm them, or unset {ENV_PREFIX}FAILPOINTS"
            )
        return spec

    @field_validator("allowed_hosts", "trusted_proxies", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if host != "*" and not _HOST_NAME.fullmatch(host):
                raise ValueError(f"{host[:100]!r} is not a host name or an IP address (without a port), nor '*'")
        return [host.lower().strip("[]") for host in hosts]

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_addresses(cls, proxies: list[str]) -> list[str]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy[:100]!r} is not an IP address or network (10.0.0.0/8)") from None
        return proxies

    @field_validator("writer_scopes")
    @classmethod
    def _writer_scopes(cls, scopes: dict[str, WriterScope]) -> dict[str, WriterScope]:
        check_scope_names(scopes)
        check_disjoint(scopes)
        return scopes

    @model_validator(mode="after")
    def _read_secret_files(self) -> Self:
        for name in (
            "database_url",
            "admin_token",
            "admin_token_previous",
            "writer_token",
            "writer_token_previous",
            "metrics_token",
        ):
            setattr(
                self, name, _secret(f"{ENV_PREFIX}{name.upper()}", getattr(self, name), getattr(self, f"{name}_file"))
            )
        for scope_name, scope in self.writer_scopes.items():
            variable = f"{ENV_PREFIX}WRITER_SCOPES__{scope_name}__TOKEN"
            scope.token = _secret(variable, scope.token, scope.token_file)
            if scope.token is None:
                raise ValueError(f"writer scope {scope_name} has no token: set {variable} (or {variable}_FILE)")
            previous = f"{ENV_PREFIX}WRITER_SCOPES__{scope_name}__PREVIOUS_TOKEN"
            scope.previous_token = _secret(previous, scope.previous_token, scope.previous_token_file)
        for previous, current in (("admin_token_previous", "admin_token"), ("writer_token_previous", "writer_token")):
            if getattr(self, previous) is not None and getattr(self, current) is None:
                raise ValueError(
                    f"{ENV_PREFIX}{previous.upper()} is set without {ENV_PREFIX}{current.upper()}: a rotation replaces "
                    "a token by a new one, set both (or neither)"
                )
        names = ("admin_token", "admin_token_previous", "writer_token", "writer_token_previous", "metrics_token")
        tokens = (
            {f"{ENV_PREFIX}{name.upper()}": getattr(self, name) for name in names}
            | {f"{ENV_PREFIX}WRITER_SCOPES__{name}__TOKEN": scope.token for name, scope in self.writer_scopes.items()}
            | {
                f"{ENV_PREFIX}WRITER_SCOPES__{name}__PREVIOUS_TOKEN": scope.previous_token
                for name, scope in self.writer_scopes.items()
            }
        )
        seen: dict[str, str] = {}
        for variable, token in tokens.items():
            if token is None:
                continue
            _check_token(variable, token.get_secret_value())
            other = seen.setdefault(token.get_secret_value(), variable)
            if other != variable:
                raise ValueError(
                    f"{other} and {variable} are the same token: each must be different, or one would open what "
                    "the other is for"
                )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(f"set both {ENV_PREFIX}TLS_CERT_FILE and {ENV_PREFIX}TLS_KEY_FILE, or neither")
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ValueError(
                f"{ENV_PREFIX}RETRY_MAX_SECONDS ({self.retry_max_seconds:g}) is below "
                f"{ENV_PREFIX}RETRY_INITIAL_SECONDS ({self.retry_initial_seconds:g})"
            )
        explicit = "admin_read_requires_token" in self.model_fields_set
        if explicit and self.admin_read_requires_token and self.admin_token is None:
            raise ValueError(
                f"{ENV_PREFIX}ADMIN_READ_REQUIRES_TOKEN is true but no {ENV_PREFIX}ADMIN_TOKEN is set: "
                "set the token, or the read routes would be closed to everyone"
            )
        return self

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def warehouse_dir(self) -> Path:
        return self.data_dir / "warehouse"


_HOST_NAME: Final = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+|\[?[0-9A-Fa-f:.]+\]?")


def _secret(variable: str, value: SecretStr | None, path: Path | None) -> SecretStr | None:
    """A secret setting's value, or read from its *_FILE (stripped); both set, an unreadable or empty file:
    ValueError."""
    if path is None:
        return value
    if value is not None:
        raise ValueError(f"set {variable} or {variable}_FILE, not both")
    try:
        text = path.read_text().strip()
    except OSError as error:
        raise ValueError(f"cannot read {variable}_FILE {path}: {error}") from error
    if not text:
        raise ValueError(f"{variable}_FILE {path} is empty")
    return SecretStr(text)


def _check_token(variable: str, token: str) -> None:
    """Refuse a token that is empty (a variable or a Secret key set to nothing is no token: unset it for none),
    short, monotonous, or holds a character a header does not carry as it is."""
    if not token:
        raise ValueError(
            f"{variable} is empty: set a token of at least {MIN_TOKEN_CHARACTERS} characters "
            "(openssl rand -hex 32 makes one), or unset the variable"
        )
    if len(token) < MIN_TOKEN_CHARACTERS:
        raise ValueError(
            f"{variable} has {len(token)} characters: a token needs at least {MIN_TOKEN_CHARACTERS} characters "
            "(openssl rand -hex 32 makes one)"
        )
    if not _TOKEN_ALPHABET.fullmatch(token):
        raise ValueError(
            f"{variable} may hold only letters, digits and -._~+/ (and '=' at the end), as a bearer token does"
        )
    if len(set(token)) < MIN_DISTINCT_TOKEN_CHARACTERS:
        raise ValueError(
            f"{variable} has fewer than {MIN_DISTINCT_TOKEN_CHARACTERS} different characters: use a random token "
            "(openssl rand -hex 32 makes one)"
        )
