"""The `sink-writer` command line's own flag parsers and checks: a number of seconds in a range, a name against
its policy, the coordinator's address, partition fields, an operation map. Each refuses a bad value with a
typer.BadParameter that names it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import typer

from spark_writer.mutations.modes import Op, parse_op_map
from spark_writer.sink.partitioning import parse_partition_specs

SECONDS: Final = "<seconds>"
MAX_WAIT_SECONDS: Final = 86_400.0


def seconds(low: float, high: float) -> Callable[[str], float]:
    """A flag's parser of a number of seconds from `low` to `high` (not NaN, not infinite)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise typer.BadParameter(f"{text!r} is not between {low:g} and {high:g} seconds")
        return value

    return parse


def refused_by(problem: Callable[[str], str | None]) -> Callable[[str], str]:
    """A flag's check of a name against a policy (coordinator_service.contract.table_identifiers), naming the flag."""

    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise typer.BadParameter(found)
        return value

    return check


# gRPC's own target schemes (dns:///host:port, unix:/path, ...): taken as they are.
GRPC_TARGET_SCHEMES: Final = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:")


def coordinator_address(value: str) -> str:
    """A flag's check of the coordinator's gRPC address: HOST:PORT (a port from 1 to 65535), or a gRPC target."""
    if value.startswith(GRPC_TARGET_SCHEMES):
        return value
    if "://" in value:
        raise typer.BadParameter(f"{value!r} is a URL: give the coordinator's gRPC address, HOST:PORT")
    host, _, port = value.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (a port from 1 to 65535), such as 127.0.0.1:50051")
    return value


def partition_syntax(values: list[str] | None) -> list[str] | None:
    try:
        parse_partition_specs(values or ())
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return values


def op_map_flag(text: str) -> dict[str, Op]:
    try:
        return parse_op_map(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
