"""Who looks at the console: a signed session cookie, the role it grants, and a CSRF token per session.

The console opens nothing the admin API keeps closed. Its one secret is the
admin token (SINK_COORDINATOR_ADMIN_TOKEN): signing in with it makes an
operator, who may act; without it a visitor only reads, and only when the API
lets reads through without the token (ADMIN_READ_REQUIRES_TOKEN false). With no
admin token configured every visitor is an operator, as every API caller is.

The cookie holds no token: a session (signed in or not, and its CSRF token),
signed with a key derived from the admin token, so that changing the token ends
every session; it is HTTP-only, Secure (browsers keep Secure cookies from
http://localhost and 127.0.0.1 too) and SameSite=Strict, and lasts
SESSION_SECONDS. Every form that acts carries the session's CSRF token, which
the action compares with the cookie's in constant time.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from coordinator_service.admin_auth import AdminAuth

COOKIE: Final = "sink_console"
SESSION_SECONDS: Final = 12 * 3600


class Role(StrEnum):
    NONE = "none"  # must sign in to see anything
    READER = "reader"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Session:
    signed_in: bool
    csrf: str


class ConsoleSessions:
    """Console sessions under the admin API's own token rules (coordinator_service.admin_auth)."""

    def __init__(self, auth: AdminAuth) -> None:
        self.auth = auth
        self._serializer = URLSafeTimedSerializer(
            auth.derived_key(b"sink-coordinator console"), salt="sink-console-session"
        )

    def session_of(self, request: Request) -> Session:
        """The request's session, or a new anonymous one (not signed in) when it has none that is valid."""
        raw = request.cookies.get(COOKIE)
        if raw:
            try:
                data = self._serializer.loads(raw, max_age=SESSION_SECONDS)
            except BadSignature:
                data = None
            if isinstance(data, dict) and isinstance(data.get("csrf"), str):
                return Session(signed_in=data.get("in") is True, csrf=data["csrf"])
        return Session(signed_in=False, csrf=secrets.token_urlsafe(24))

    def role(self, session: Session) -> Role:
        if not self.auth.needs_token or session.signed_in:
            return Role.OPERATOR
        return Role.NONE if self.auth.reads_need_token else Role.READER

    def sign_in(self, token: str) -> Session | None:
        """A new signed-in session when the token is the admin token (never an empty one)."""
        if not token or not self.auth.token_matches(token):
            return None
        return Session(signed_in=True, csrf=secrets.token_urlsafe(24))

    def keep(self, response: Response, session: Session) -> None:
        """Put the session in the response's cookie."""
        response.set_cookie(
            COOKIE,
            self._serializer.dumps({"in": session.signed_in, "csrf": session.csrf}),
            max_age=SESSION_SECONDS,
            httponly=True,
            secure=True,
            samesite="strict",
            path="/console",
        )

    @staticmethod
    def end(response: Response) -> None:
        response.delete_cookie(COOKIE, path="/console", httponly=True, secure=True, samesite="strict")

    @staticmethod
    def csrf_matches(session: Session, sent: str) -> bool:
        return bool(sent) and hmac.compare_digest(session.csrf.encode(), sent.encode())
