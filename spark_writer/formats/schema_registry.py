"""The schema registry as the writer reaches it: settings that travel, one client per process, schemas by id.

Invariants:

* What is shipped to the executors is ``RegistrySettings`` (the URL and the client's
  options, as text): never a client, whose HTTP session cannot be pickled. Each
  process builds its client once (``registry_client``) and keeps it.
* A schema id names one schema for good (the registry never reuses an id), so a
  schema fetched by id is cached for the life of the process. The latest version
  of a subject is not: ``latest_version`` asks the registry every time (the driver
  calls it once per batch).
* Only "this schema id does not exist" (HTTP 404) is a fault of the record that
  carries the id, and only once it lasts: a registry replica that lags behind the
  one a producer registered with answers 404 for a schema id just registered, so a
  404 for an id is asked again, with backoff, for ``SCHEMA_ID_LAG_SECONDS`` before
  the id counts as unknown. Any other failure (unreachable, refused credentials,
  5xx) raises ``RegistryUnavailableError``: the batch fails and runs again,
  nothing is decoded as bad.
* ``mock://name`` URLs give confluent-kafka's in-memory registry. It lives in this
  process only; within it, the same URL gives the same registry, so a test that
  registers schemas through ``registry_client(settings)`` decodes against them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient, SchemaRegistryError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

# The client's options that it takes as numbers (the command line gives text).
NUMERIC_OPTIONS: Final = frozenset(
    {"timeout", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.wait.ms", "retries.max.wait.ms"}
)
NOT_FOUND: Final = 404
# How long a schema id the registry answers 404 for is asked again before it counts as unknown (a replica's lag).
SCHEMA_ID_LAG_SECONDS: Final = 10.0
SCHEMA_ID_FIRST_WAIT_SECONDS: Final = 0.1
MOCK_SCHEME: Final = "mock://"

T = TypeVar("T")


class RegistryUnavailableError(RuntimeError):
    """The registry could not answer (not the record's fault): the batch fails and Spark runs it again."""


class SchemaNotFoundError(LookupError):
    """The registry has no such schema id, subject or version."""


@dataclass(frozen=True)
class RegistrySettings:
    """Where the schema registry is and how to reach it: confluent-kafka's client options (``basic.auth.user.info``,
    ``ssl.ca.location``, ``bearer.auth.*``, ``timeout``, ...)."""

    url: str
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if "url" in dict(self.options):
            raise ValueError("give the registry's URL as --schema-registry-url, not as an option")
        for key, value in self.options:
            if key in NUMERIC_OPTIONS:
                try:
                    float(value)
                except ValueError:
                    raise ValueError(f"schema registry option {key}={value!r} is not a number") from None
        try:
            SchemaRegistryClient.new_client(self.client_config()).close()
        except (ValueError, TypeError) as error:  # the client's own check of its options, before any request
            raise ValueError(f"bad schema registry settings for {self.safe_url}: {error}") from None

    @classmethod
    def of(cls, url: str, options: Mapping[str, str] | None = None) -> RegistrySettings:
        return cls(url, tuple(sorted((options or {}).items())))

    @property
    def safe_url(self) -> str:
        """The URL without credentials, for messages and logs."""
        parts = urlsplit(self.url.split(",")[0].strip())
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def client_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"url": self.url}
        for key, value in self.options:
            config[key] = _number(value) if key in NUMERIC_OPTIONS else value
        return config


def _number(text: str) -> int | float:
    number = float(text)
    return int(number) if number.is_integer() else number


_clients: dict[RegistrySettings | str, SchemaRegistryClient] = {}
_schemas: dict[tuple[RegistrySettings, int, str | None], Schema] = {}
_parsed: dict[tuple[str, RegistrySettings, int], Any] = {}
_lock = threading.Lock()


def registry_client(settings: RegistrySettings) -> SchemaRegistryClient:
    """This process's client of the registry (built at the first call, then kept)."""
    # An in-memory registry is its URL's, whatever the options: the one a test registered its schemas in.
    key: RegistrySettings | str = settings.url if settings.url.startswith(MOCK_SCHEME) else settings
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SchemaRegistryClient.new_client(settings.client_config())
        return client


def _call(settings: RegistrySettings, what: str, request: Callable[[], T]) -> T:
    try:
        return request()
    except SchemaRegistryError as error:
        if error.http_status_code == NOT_FOUND:
            raise SchemaNotFoundError(f"the schema registry at {settings.safe_url} has no {what}") from None
        raise RegistryUnavailableError(
            f"the schema registry at {settings.safe_url} refused to give {what}: {error}"
        ) from error
    except Exception as error:  # the HTTP client's own errors: connection refused, timeouts, TLS
        raise RegistryUnavailableError(
            f"the schema registry at {settings.safe_url} could not be reached for {what}: {error!r}"
        ) from error


def schema_by_id(settings: RegistrySettings, schema_id: int, fmt: str | None = None) -> Schema:
    """The schema of an id (cached for the process) in the registry's format `fmt` (``serialized``: a Protobuf
    schema as a base64 FileDescriptorProto); SchemaNotFoundError when the registry has none."""
    key = (settings, schema_id, fmt)
    with _lock:
        cached = _schemas.get(key)
    if cached is not None:
        return cached
    schema: Schema = Retrying(
        retry=retry_if_exception_type(SchemaNotFoundError),
        wait=wait_exponential(multiplier=SCHEMA_ID_FIRST_WAIT_SECONDS, max=SCHEMA_ID_LAG_SECONDS / 4),
        stop=stop_after_delay(SCHEMA_ID_LAG_SECONDS),
        reraise=True,
    )(_call, settings, f"schema id {schema_id}", lambda: registry_client(settings).get_schema(schema_id, fmt=fmt))
    with _lock:
        _schemas[key] = schema
    return schema


def parsed_schema(
    kind: str, settings: RegistrySettings, schema_id: int, parse: Callable[[Schema], T], fmt: str | None = None
) -> T:
    """`parse` applied to the schema of an id, once per process and kind of parse (a decoder's own form of it)."""
    key = (kind, settings, schema_id)
    with _lock:
        if key in _parsed:
            return _parsed[key]  # type: ignore[no-any-return]
    parsed = parse(schema_by_id(settings, schema_id, fmt))
    with _lock:
        _parsed[key] = parsed
    return parsed


def latest_version(
    settings: RegistrySettings, subject: str, fmt: str | None = None, *, deleted: bool = False
) -> RegisteredSchema:
    """The subject's latest registered version, asked of the registry now (not the client's cache); with `deleted`,
    among its soft-deleted versions too."""
    return _call(
        settings,
        f"subject {subject!r}",
        lambda: registry_client(settings).get_version(subject, "latest", deleted=deleted, fmt=fmt),
    )


def subject_versions(settings: RegistrySettings, subject: str, *, deleted: bool = False) -> list[int]:
    """The numbers of a subject's versions, asked of the registry now; with `deleted`, its soft-deleted ones too."""
    return _call(
        settings,
        f"the versions of subject {subject!r}",
        lambda: registry_client(settings).get_versions(subject, deleted=deleted),
    )


def subject_version(settings: RegistrySettings, subject: str, version: int, fmt: str | None = None) -> RegisteredSchema:
    """A version of a subject (a schema reference's target), soft-deleted or not: it names a schema for good."""
    return _call(
        settings,
        f"version {version} of subject {subject!r}",
        lambda: registry_client(settings).get_version(subject, version, deleted=True, fmt=fmt),
    )
