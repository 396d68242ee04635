"""Who may call: the admin, writer and metrics tokens (each also from a *_FILE), the writers' scopes, and what the
metrics endpoint reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    field_validator,
)

from coordinator_service.settings.bounds import DAY
from coordinator_service.writer_scopes import WriterScope, check_disjoint, check_scope_names

# A token is a secret only if it cannot be guessed: at least this many characters, of the bearer-token alphabet
# (RFC 6750's b64token, what an Authorization header and gRPC metadata carry as they are), not monotonous.
MIN_TOKEN_CHARACTERS: Final = 32
MIN_DISTINCT_TOKEN_CHARACTERS: Final = 8
_TOKEN_ALPHABET: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class AccessSettings(BaseModel):
    """The tokens, the writers' scopes, the metrics endpoint's reads."""

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

    @field_validator("writer_scopes")
    @classmethod
    def _writer_scopes(cls, scopes: dict[str, WriterScope]) -> dict[str, WriterScope]:
        check_scope_names(scopes)
        check_disjoint(scopes)
        return scopes


def secret_from_file(variable: str, value: SecretStr | None, path: Path | None) -> SecretStr | None:
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


def check_token(variable: str, token: str) -> None:
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
