"""The coordinator's errors: each maps to one gRPC status code and one HTTP status."""

from __future__ import annotations

from http import HTTPStatus

import grpc


class CoordinatorError(Exception):
    """An error a caller can act on; the message says what was wrong and how to fix it."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: HTTPStatus = HTTPStatus.INTERNAL_SERVER_ERROR

    def __init__(self, message: str) -> None:
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


class CheckpointBehind(FailedPrecondition):
    """The writer's checkpoint is behind what the coordinator recorded: it was lost or rolled back."""


class Unavailable(CoordinatorError):
    """PostgreSQL or the catalog cannot be reached: retry later."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = HTTPStatus.SERVICE_UNAVAILABLE


class Unauthenticated(CoordinatorError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = HTTPStatus.UNAUTHORIZED


class SchemaNotCurrent(Exception):
    """The metastore schema is missing, older or newer than this release knows."""


class CommitLockLost(Unavailable):
    """The sink's commit lock vanished with its connection: nothing relying on it was done; retry."""
