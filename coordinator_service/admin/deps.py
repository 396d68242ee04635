"""The admin routes' dependencies: the runtime, the operator rules and the token check.

Each is taken from app.state, where create_app puts it, and from nowhere else:
a test swaps any of them with app.dependency_overrides.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from coordinator_service.admin.auth import AdminAuth, bearer_scheme
from coordinator_service.engine.operations import Operations
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    """The wired coordinator (app.state.runtime): what readiness checks."""
    runtime: Runtime = request.app.state.runtime
    return runtime


def operations_of(request: Request) -> Operations:
    """The operator rules (app.state.operations)."""
    operations: Operations = request.app.state.operations
    return operations


def auth_of(request: Request) -> AdminAuth:
    """The admin token and whether reads need it (app.state.auth)."""
    auth: AdminAuth = request.app.state.auth
    return auth


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
OperationsDep = Annotated[Operations, Depends(operations_of)]
AuthDep = Annotated[AdminAuth, Depends(auth_of)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]


def reader(auth: AuthDep, credentials: Credentials) -> None:
    """A read route: the admin token when ADMIN_READ_REQUIRES_TOKEN says so."""
    auth.check_reader(credentials)


def operator(request: Request, auth: AuthDep, credentials: Credentials) -> Operator:
    """A mutating route: who asks (the admin token, when one is set)."""
    return auth.operator(request, credentials)


Reader = Annotated[None, Depends(reader)]
Caller = Annotated[Operator, Depends(operator)]
