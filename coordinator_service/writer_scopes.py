"""Writer scopes: which sinks and table namespaces a writer credential covers, and how many it may create.

A scope is configured with its own token (SINK_COORDINATOR_WRITER_SCOPES__<scope>__TOKEN), the sink names it
covers and the namespaces of the tables its sinks may write, each a list of patterns: a name, or a prefix
ending in '*' ('*' alone covers every name). The sink patterns of two scopes never overlap (checked at start),
so every sink belongs to at most one scope, and that scope's quotas (max_sinks, max_tables) count the sinks
its patterns cover and the tables those sinks write. SINK_COORDINATOR_WRITER_TOKEN is the unscoped credential:
every sink, every namespace, the default quotas. With no writer credential at all (a laptop), every caller
has the open scope, the same.

The rules are pure functions of the scope and the request; coordinator_service.grpc_gate applies them to every
call, and coordinator_service.engine.writer_admission counts the quotas in the metastore.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

from coordinator_service.contract.errors import PermissionDenied, quote

# Scope names are environment variable name parts (lower-cased by the settings, '__' separates parts).
SCOPE_NAME: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]|_(?!_)){0,62}")
# The name scopes the unscoped credential and a coordinator without writer credentials go by: no scope key
# can take them (scope keys are lower case).
UNSCOPED: Final = "WRITER_TOKEN"
OPEN: Final = "OPEN"
DEFAULT_MAX_SINKS: Final = 10_000
DEFAULT_MAX_TABLES: Final = 100_000
_PATTERN: Final = re.compile(r"[^\s*\x00-\x1f\x7f]{0,255}\*?")


def _check_pattern(pattern: str) -> str:
    if not pattern or not _PATTERN.fullmatch(pattern):
        raise ValueError(
            f"pattern {quote(pattern)} is not a name or a prefix ending in '*' (at most 255 characters, no spaces, "
            "no control characters, '*' only at the end)"
        )
    return pattern


Pattern = Annotated[str, AfterValidator(_check_pattern)]


def matches(pattern: str, name: str) -> bool:
    """Whether `name` is the pattern's name, or starts with its prefix (a pattern ending in '*')."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def overlap(first: str, second: str) -> bool:
    """Whether some name matches both patterns."""
    if first.endswith("*") and second.endswith("*"):
        return first[:-1].startswith(second[:-1]) or second[:-1].startswith(first[:-1])
    if first.endswith("*"):
        return matches(first, second)
    if second.endswith("*"):
        return matches(second, first)
    return first == second


def namespace_of(table: str) -> str:
    """The namespace of a table identifier ('db' of 'db.orders', 'a.b' of 'a.b.t')."""
    return table.rpartition(".")[0]


class WriterScope(BaseModel):
    """One writer credential's reach: its token, the sinks and table namespaces it covers, its quotas."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    token: SecretStr | None = Field(default=None, description="The scope's writer token.")
    token_file: Path | None = Field(default=None, description="File holding the scope's token.")
    previous_token: SecretStr | None = Field(
        default=None, description="During a rotation, the scope's token being replaced, accepted beside its token."
    )
    previous_token_file: Path | None = Field(default=None, description="File holding the scope's previous token.")
    sinks: list[Pattern] = Field(min_length=1, max_length=1000, description="Sink names or prefixes ('orders-*').")
    namespaces: list[Pattern] = Field(
        min_length=1, max_length=1000, description="Namespaces of the tables the sinks may write, or prefixes."
    )
    max_sinks: int = Field(
        default=DEFAULT_MAX_SINKS, ge=0, le=1_000_000, description="Most sinks the scope's patterns cover."
    )
    max_tables: int = Field(
        default=DEFAULT_MAX_TABLES, ge=0, le=10_000_000, description="Most tables the scope's sinks write."
    )

    def covers_sink(self, sink: str) -> bool:
        return any(matches(pattern, sink) for pattern in self.sinks)

    def covers_table(self, table: str) -> bool:
        namespace = namespace_of(table)
        return any(matches(pattern, namespace) for pattern in self.namespaces)


EVERYTHING: Final = WriterScope(sinks=["*"], namespaces=["*"])


def check_scope_names(scopes: Mapping[str, WriterScope]) -> None:
    for name in scopes:
        if not SCOPE_NAME.fullmatch(name):
            raise ValueError(
                f"writer scope name {quote(name)} is invalid: use 1 to 63 lower-case letters, digits, '-' and single "
                "'_', starting with a letter or digit (it is part of environment variable names)"
            )


def check_disjoint(scopes: Mapping[str, WriterScope]) -> None:
    """Refuse two scopes whose sink patterns overlap: a sink must have one scope, whose quotas count it."""
    named = sorted(scopes.items())
    for index, (first_name, first) in enumerate(named):
        for second_name, second in named[index + 1 :]:
            for pattern in first.sinks:
                clash = next((other for other in second.sinks if overlap(pattern, other)), None)
                if clash is not None:
                    raise ValueError(
                        f"writer scopes {first_name} and {second_name} both cover some sink names ({quote(pattern)} "
                        f"and {quote(clash)}): a sink belongs to one scope, so make their sink patterns disjoint"
                    )


@dataclass(frozen=True)
class Scope:
    """A writer scope as a call holds it: its name and its rules."""

    name: str
    rules: WriterScope

    def authorize(self, sink: str, tables: Iterable[str]) -> None:
        """PermissionDenied unless the scope covers the sink and every table named."""
        if not self.rules.covers_sink(sink):
            raise PermissionDenied(
                f"writer scope {self.name} does not cover sink {quote(sink)} (it covers {_shown(self.rules.sinks)}): "
                "use a sink it covers, or ask an operator to extend the scope"
            )
        for table in tables:
            if not self.rules.covers_table(table):
                raise PermissionDenied(
                    f"writer scope {self.name} does not cover table {quote(table)}: its namespaces are "
                    f"{_shown(self.rules.namespaces)}; write a table there, or ask an operator to extend the scope"
                )


def _shown(patterns: Sequence[str]) -> str:
    return ", ".join(quote(pattern) for pattern in patterns[:5]) + (" ..." if len(patterns) > 5 else "")


class Credentials:
    """The writer tokens a coordinator accepts, each with its scope; none configured: everyone has the open scope.

    A sent token is looked up by its SHA-256 digest, so that the lookup's time says nothing about the tokens."""

    def __init__(
        self,
        writer_token: SecretStr | None,
        scopes: Mapping[str, WriterScope],
        writer_token_previous: SecretStr | None = None,
    ) -> None:
        self._by_digest: dict[bytes, Scope] = {}
        # During a rotation both the new token and the one it replaces open the same scope.
        for token in (writer_token, writer_token_previous):
            if token is not None:
                self._by_digest[_digest(token.get_secret_value())] = Scope(UNSCOPED, EVERYTHING)
        for name, rules in scopes.items():
            assert rules.token is not None, "settings read every scope's token"
            for token in (rules.token, rules.previous_token):
                if token is not None:
                    self._by_digest[_digest(token.get_secret_value())] = Scope(name, rules)

    @property
    def required(self) -> bool:
        """Whether calls need a token (some writer credential is configured)."""
        return bool(self._by_digest)

    def scope_of(self, token: str | None) -> Scope | None:
        """The scope of a sent token (None: no token was sent); None if it is no writer token."""
        if not self._by_digest:
            return Scope(OPEN, EVERYTHING)
        if token is None:
            return None
        return self._by_digest.get(_digest(token))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode(errors="surrogateescape")).digest()
