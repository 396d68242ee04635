"""The coordinator's errors: each maps to one gRPC status code and one HTTP status.

The Spark writer reads partition fields with the coordinator's parser (partition_syntax), which raises these:
this module imports grpc and the standard library only (tests/unit/test_writer_imports.py)."""

from __future__ import annotations

from http import HTTPStatus

import grpc

# Most characters of client input an error message quotes.
QUOTED_CHARACTERS = 200
# Most bytes (UTF-8) of an error message. gRPC sends it percent-encoded in a trailer, where each non-ASCII
# byte takes three, and clients refuse trailers over 8 KiB with RESOURCE_EXHAUSTED instead of the error.
MESSAGE_BYTES = 2000


def quote(value: str) -> str:
    """Client input as an error message shows it: repr() of at most QUOTED_CHARACTERS characters."""
    return repr(value[:QUOTED_CHARACTERS]) + _rest(value)


def cause(error: BaseException) -> str:
    """A library's error as a message cites it: the first line of the driver's own error (not SQLAlchemy's
    statement and parameters, which hold client input), cut like quoted input, since it may repeat some."""
    text = str(getattr(error, "orig", None) or error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line[:QUOTED_CHARACTERS] + _rest(line)


def _rest(text: str) -> str:
    return f"... ({len(text)} characters)" if len(text) > QUOTED_CHARACTERS else ""


def _fitted(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MESSAGE_BYTES:
        return message
    return encoded[: MESSAGE_BYTES - 20].decode(errors="ignore") + " ... (message cut)"


class CoordinatorError(Exception):
    """An error a caller can act on; the message says what was wrong and how to fix it (cut to MESSAGE_BYTES)."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: HTTPStatus = HTTPStatus.INTERNAL_SERVER_ERROR

    def __init__(self, message: str) -> None:
        message = _fitted(message)
        super().__init__(message)
        self.message = message


class InvalidArgument(CoordinatorError):
    """The request itself is malformed: nothing was changed."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = HTTPStatus.UNPROCESSABLE_ENTITY


class NotFound(CoordinatorError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = HTTPStatus.NOT_FOUND


class FailedPrecondition(CoordinatorError):
    """The request is well formed but the sink's state does not allow it."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = HTTPStatus.CONFLICT


class Fenced(FailedPrecondition):
    """A writer with an older term: a newer writer registered since."""


class EpochAborted(FailedPrecondition):
    """The epoch was aborted (by recovery or an operator) and cannot be checkpointed."""


class SinkSuspended(FailedPrecondition):
    """The log is out of step with one of the sink's tables (a restored metastore, another table, another catalog):
    nothing is committed or accepted for it until an operator reconciles it."""


class CheckpointBehind(FailedPrecondition):
    """The writer's checkpoint is behind what the coordinator recorded: it was lost or rolled back."""


class Unavailable(CoordinatorError):
    """PostgreSQL or the catalog cannot be reached: retry later."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = HTTPStatus.SERVICE_UNAVAILABLE


class MetastoreUnavailable(Unavailable):
    """The PostgreSQL metastore cannot be reached, does not answer, or has no free connection: retry later."""


class CatalogUnavailable(Unavailable):
    """The Iceberg catalog or its storage failed (an outage, or a commit conflict): retry later."""


class CatalogConflict(CatalogUnavailable):
    """The catalog refused a commit made on a table it has moved past (another commit landed first): nothing was
    changed; load the table again and look."""


class Unauthenticated(CoordinatorError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = HTTPStatus.UNAUTHORIZED


class PermissionDenied(CoordinatorError):
    """The caller's credential does not cover what the request names (a writer scope's sinks or namespaces, a
    table no operator adopted)."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = HTTPStatus.FORBIDDEN


class QuotaExceeded(CoordinatorError):
    """A writer scope already has the most sinks or tables it may have: an operator raises the quota."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = HTTPStatus.TOO_MANY_REQUESTS


class SchemaNotCurrent(Exception):
    """The metastore schema is missing, older or newer than this release knows."""


class CannotServe(Exception):
    """`serve` cannot start here (a port in use): the message names what and what to do; nothing was started."""


class CommitLockLost(Unavailable):
    """The sink's commit lock vanished with its connection: nothing relying on it was done; retry."""
