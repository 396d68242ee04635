"""Bearer-token authentication of the admin API.

Once SINK_COORDINATOR_ADMIN_TOKEN is set, mutating routes need it; read
routes need it too when ADMIN_READ_REQUIRES_TOKEN is true. Without a token
every route is open and operators are 'anonymous'. The token is compared in
constant time and never logged.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from coordinator_service.errors import Unauthenticated
from coordinator_service.operations import Operator

# auto_error=False: a missing header is answered by AdminAuth, in the API's own error format.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="admin token",
    description="SINK_COORDINATOR_ADMIN_TOKEN, sent as 'Authorization: Bearer <token>'.",
)


class AdminAuth:
    def __init__(self, token: SecretStr | None, read_requires_token: bool) -> None:
        self._token = token
        self._read_requires_token = read_requires_token

    def operator(self, request: Request, credentials: HTTPAuthorizationCredentials | None) -> Operator:
        """Who sends a mutating request; Unauthenticated unless the token is right (when one is set)."""
        if self._token is not None:
            self._check(credentials)
        return Operator(identity="admin" if self._token is not None else "anonymous", address=_address(request))

    def check_reader(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        if self._token is not None and self._read_requires_token:
            self._check(credentials)

    def _check(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        assert self._token is not None
        if credentials is None:
            raise Unauthenticated(
                "this route needs the admin token: send 'Authorization: Bearer <SINK_COORDINATOR_ADMIN_TOKEN>'"
            )
        expected = self._token.get_secret_value().encode()
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise Unauthenticated("the admin token is wrong")


def _address(request: Request) -> str:
    if request.client is None:
        return "unknown"
    return f"{request.client.host}:{request.client.port}"
