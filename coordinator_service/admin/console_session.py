"""Who looks at the console: a signed session cookie, the role it grants, and a CSRF token per session.

The console opens nothing the admin API keeps closed. Its one secret is the
admin token (SINK_COORDINATOR_ADMIN_TOKEN): signing in with it makes an
operator, who may act; without it a visitor only reads, and only when the API
lets reads through without the token (ADMIN_READ_REQUIRES_TOKEN false). With no
admin token configured every visitor is an operator, as every API caller is.

The cookie holds no token: a session (signed in or not, its id and its CSRF
token), signed with a key derived from the admin token, so that changing the
token ends every session; it is HTTP-only, Secure (browsers keep Secure cookies
from http://localhost and 127.0.0.1 too) and SameSite=Strict, and lasts
SESSION_SECONDS from the last page. Signing out records the session's id in the
metastore (console_sign_outs), and every replica then refuses the cookie, a
copy of it included. Every form that acts carries the session's CSRF token,
which the action compares with the cookie's in constant time. The message an
action leaves for the next page travels signed too, so that a link cannot make
the console say that something was done.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Final

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import delete, exists, select
from sqlalchemy.dialects.postgresql import insert

from coordinator_service.admin.auth import AdminAuth
from coordinator_service.log.database import Database
from coordinator_service.log.models import ConsoleSignOut

COOKIE: Final = "sink_console"
SESSION_SECONDS: Final = 12 * 3600
# How long the message an action leaves for the page it redirects to stays readable.
NOTICE_SECONDS: Final = 600


class Role(StrEnum):
    NONE = "none"  # must sign in to see anything
    READER = "reader"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Session:
    signed_in: bool
    csrf: str
    # Names a signed-in session, for its sign-out; "" for one that is not signed in.
    id: str = ""


class ConsoleSessions:
    """Console sessions under the admin API's own token rules (coordinator_service.admin.auth)."""

    def __init__(self, auth: AdminAuth, database: Database) -> None:
        self.auth = auth
        self._database = database
        key = auth.derived_key(b"sink-coordinator console")
        self._serializer = URLSafeTimedSerializer(key, salt="sink-console-session")
        self._notices = URLSafeTimedSerializer(key, salt="sink-console-notice")

    async def session_of(self, request: Request) -> Session:
        """The request's session, or a new anonymous one (not signed in) when it has none that is valid: none, a
        bad signature, too old, or signed out. Unavailable when the metastore cannot say which."""
        raw = request.cookies.get(COOKIE)
        if raw:
            try:
                data = self._serializer.loads(raw, max_age=SESSION_SECONDS)
            except BadSignature:
                data = None
            if isinstance(data, dict) and isinstance(data.get("csrf"), str):
                session = Session(signed_in=data.get("in") is True, csrf=data["csrf"], id=str(data.get("id") or ""))
                if not session.signed_in or (session.id and not await self._signed_out(session.id)):
                    return session
        return Session(signed_in=False, csrf=secrets.token_urlsafe(24))

    def role(self, session: Session) -> Role:
        if not self.auth.needs_token or session.signed_in:
            return Role.OPERATOR
        return Role.NONE if self.auth.reads_need_token else Role.READER

    async def may_act(self, request: Request) -> bool:
        """Whether the request's session is an operator's (what every action needs, before its form is read)."""
        return self.role(await self.session_of(request)) is Role.OPERATOR

    def sign_in(self, token: str) -> Session | None:
        """A new signed-in session when the token is the admin token (never an empty one)."""
        if not token or not self.auth.token_matches(token):
            return None
        return Session(signed_in=True, csrf=secrets.token_urlsafe(24), id=secrets.token_urlsafe(18))

    def keep(self, response: Response, session: Session) -> None:
        """Put the session in the response's cookie."""
        response.set_cookie(
            COOKIE,
            self._serializer.dumps({"in": session.signed_in, "csrf": session.csrf, "id": session.id}),
            max_age=SESSION_SECONDS,
            httponly=True,
            secure=True,
            samesite="strict",
            path="/console",
        )

    async def end(self, response: Response, session: Session) -> None:
        """Sign the session out on every replica (until its cookie would have expired), and drop the cookie."""
        if session.id:
            now = datetime.now(UTC)
            async with self._database.transaction() as transaction:
                await transaction.execute(delete(ConsoleSignOut).where(ConsoleSignOut.expires_at < now))
                await transaction.execute(
                    insert(ConsoleSignOut)
                    .values(session_id=session.id, expires_at=now + timedelta(seconds=SESSION_SECONDS))
                    .on_conflict_do_nothing()
                )
        response.delete_cookie(COOKIE, path="/console", httponly=True, secure=True, samesite="strict")

    async def _signed_out(self, session_id: str) -> bool:
        async with self._database.reading() as reading:
            found = await reading.scalar(select(exists().where(ConsoleSignOut.session_id == session_id)))
        return bool(found)

    @staticmethod
    def csrf_matches(session: Session, sent: str) -> bool:
        return bool(sent) and hmac.compare_digest(session.csrf.encode(), sent.encode())

    def notice(self, message: str) -> str:
        """The message an action leaves for the next page, signed: what a link's `done=` carries."""
        return self._notices.dumps(message)

    def notice_text(self, signed: str) -> str:
        """The message of a signed notice; "" for anything this console did not sign lately."""
        try:
            message = self._notices.loads(signed, max_age=NOTICE_SECONDS)
        except BadSignature:
            return ""
        return message if isinstance(message, str) else ""
