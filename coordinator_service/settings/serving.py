"""Where and how the coordinator serves: its ports, TLS, the hosts and proxies it trusts, its logs and failpoints."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path
from typing import Final

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
)

from coordinator_service import failpoints
from coordinator_service.contract.logs import LogFormat, LogLevel
from coordinator_service.settings.bounds import ENV_PREFIX, CommaSeparated

# Where cgroup v2 says how much CPU time the container may use: "<quota> <period>" in microseconds, or "max <period>".
CPU_MAX: Final = Path("/sys/fs/cgroup/cpu.max")

# The most serving processes: well above the cores a coordinator is given, low enough that a typo (10000) is refused.
MAX_PROCESSES: Final = 256


def cores_given(cpu_max: Path = CPU_MAX) -> int:
    """The cores this process may run on: the CPUs of its affinity, fewer when its cgroup's CPU quota is lower
    (rounded up), at least 1."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        pass  # no cgroup v2 here, or nothing it says: the affinity alone
    return max(1, cores)


class ServingSettings(BaseModel):
    """The servers: ports, TLS, the gRPC bounds, the hosts and proxies trusted, logs, failpoints."""

    processes: int = Field(
        default_factory=cores_given,
        ge=1,
        le=MAX_PROCESSES,
        description="Serving processes behind the two ports, each a whole coordinator sharing the metastore as "
        "replicas do; default: the cores this container is given (its CPU affinity and cgroup quota). 1: one "
        "process, as before.",
    )

    grpc_port: int = Field(default=50051, ge=0, le=65535, description="Port of the gRPC writer API.")
    http_port: int = Field(default=8080, ge=0, le=65535, description="Port of the REST admin API.")
    bind_host: str = Field(default="127.0.0.1", description="Address both servers listen on.")
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate (chain) that gRPC and HTTP serve; set TLS_KEY_FILE with it."
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of TLS_CERT_FILE.")
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
    readiness_dependency_grace_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="/readyz turns unready over the metastore or the catalog only once it has failed this long: a "
        "blip of a dependency every replica shares must not take them all out of the Service at once.",
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


_HOST_NAME: Final = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+|\[?[0-9A-Fa-f:.]+\]?")
