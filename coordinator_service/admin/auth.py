"""Bearer-token authentication of the admin API, the console and /metrics.

Once SINK_COORDINATOR_ADMIN_TOKEN is set, mutating routes need it; read
routes (and /metrics) need it too unless ADMIN_READ_REQUIRES_TOKEN is false.
/metrics also takes SINK_COORDINATOR_METRICS_TOKEN, which opens nothing else,
and needs one of the two whenever a metrics token is set. Without a token
every route is open and operators are 'anonymous'. Tokens are compared in
constant time and never logged. coordinator_service.admin.http_gate applies these
rules to every request before its body is read; the routes' dependencies
(admin_deps) apply them again and name the operator.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import structlog
from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from coordinator_service import metrics
from coordinator_service.contract.errors import Unauthenticated
from coordinator_service.engine.operator.answers import Operator

# auto_error=False: a missing header is answered by AdminAuth, in the API's own error format.
log = structlog.get_logger(__name__)

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="admin token",
    description="SINK_COORDINATOR_ADMIN_TOKEN, sent as 'Authorization: Bearer <token>'.",
)


class AdminAuth:
    def __init__(
        self,
        token: SecretStr | None,
        read_requires_token: bool,
        metrics_token: SecretStr | None = None,
        previous_token: SecretStr | None = None,
    ) -> None:
        for name, configured in (("admin", token), ("metrics", metrics_token), ("previous admin", previous_token)):
            if configured is not None and not configured.get_secret_value():
                raise ValueError(f"the {name} token is empty: an empty token would open what it guards")
        self._token = token
        # During a rotation: the admin token being replaced, accepted beside the new one.
        self._previous_token = previous_token
        self._read_requires_token = read_requires_token
        self._metrics_token = metrics_token

    @property
    def needs_token(self) -> bool:
        """Whether acting needs the admin token (one is configured)."""
        return self._token is not None

    @property
    def reads_need_token(self) -> bool:
        return self._token is not None and self._read_requires_token

    def operator(self, request: Request, credentials: HTTPAuthorizationCredentials | None) -> Operator:
        """Who sends a mutating request; Unauthenticated unless the token is right (when one is set)."""
        if self._token is not None:
            self._check(credentials)
            if credentials is not None and self._matches(credentials.credentials, self._previous_token):
                return Operator(identity="admin (previous token)", address=_address(request))
        return self.operator_of(request)

    def operator_of(self, request: Request) -> Operator:
        """The identity recorded for an action of this request's sender, once the token was checked."""
        return Operator(identity="admin" if self._token is not None else "anonymous", address=_address(request))

    def check_reader(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        if self.reads_need_token:
            self._check(credentials)

    def check_metrics_reader(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        """/metrics: the metrics token or the admin token, when reads need a token or a metrics token is set."""
        if not self.reads_need_token and self._metrics_token is None:
            return
        if credentials is None:
            raise _refused("/metrics needs a token: send 'Authorization: Bearer <SINK_COORDINATOR_METRICS_TOKEN>'")
        sent = credentials.credentials
        metrics = self._metrics_token
        if metrics is not None and hmac.compare_digest(sent.encode(), metrics.get_secret_value().encode()):
            return
        if self._token is None or not self.token_matches(sent):
            raise _refused("the metrics token is wrong")

    def token_matches(self, sent: str) -> bool:
        """Whether `sent` is the admin token, or during a rotation the one it replaces (compared in constant time);
        any text when none is configured."""
        return self._token is None or self._matches(sent, self._token) or self._matches(sent, self._previous_token)

    @staticmethod
    def _matches(sent: str, token: SecretStr | None) -> bool:
        return token is not None and hmac.compare_digest(sent.encode(), token.get_secret_value().encode())

    def derived_key(self, purpose: bytes) -> bytes:
        """A key for `purpose` derived from the admin token, so that a new token changes it; a random one (for
        this process) when no token is configured."""
        if self._token is None:
            return secrets.token_bytes(32)
        return hmac.new(self._token.get_secret_value().encode(), purpose, hashlib.sha256).digest()

    def _check(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        if credentials is None:
            raise _refused(
                "this route needs the admin token: send 'Authorization: Bearer <SINK_COORDINATOR_ADMIN_TOKEN>'"
            )
        if not self.token_matches(credentials.credentials):
            raise _refused("the admin token is wrong")


def _refused(why: str) -> Unauthenticated:
    """A failed authentication: counted and logged (never the token sent), for an operator to see probing."""
    metrics.AUTHENTICATION_FAILURES.labels("http").inc()
    log.warning("authentication failed", api="http", why=why)
    return Unauthenticated(why)


def _address(request: Request) -> str:
    if request.client is None:
        return "unknown"
    return f"{request.client.host}:{request.client.port}"
