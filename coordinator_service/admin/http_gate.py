"""What every HTTP request passes before a route reads it, and what every answer carries.

An ASGI middleware around the admin app, in this order:

1. the Host: the admin API and the console answer only SINK_COORDINATOR_ALLOWED_HOSTS (DNS rebinding of a
   tokenless coordinator on a laptop); the probes and /metrics answer any Host (the kubelet and Prometheus send
   the pod's address);
2. where an unsafe request comes from: a browser's cross-site POST, PUT or DELETE (Sec-Fetch-Site; from a browser
   that sends none, an Origin other than the Host) is refused whatever its body, so that body-less routes get
   the same care as the rest;
3. the token (coordinator_service.admin.auth's rules): the admin API's routes, /metrics, and the console's
   actions (an operator's session) are refused before their body is read;
4. the body: at most MAX_BODY_BYTES, refused from its Content-Length or as soon as it grows past it, and read
   here once, so that a route never waits on a slow sender.

Every answer says nosniff, no framing and no referrer elsewhere; the console's pages carry a Content Security
Policy that lets them load nothing but their own scripts and styles.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final
from urllib.parse import urlencode, urlsplit

from fastapi.responses import JSONResponse, RedirectResponse
from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator_service.admin.auth import AdminAuth, bearer_scheme
from coordinator_service.admin.console_session import ConsoleSessions
from coordinator_service.contract.errors import CoordinatorError, quote

# The largest request body: an abort's reason (2,000 characters) or a sink's overrides fit many times over.
MAX_BODY_BYTES: Final = 64 * 1024
API_PREFIX: Final = "/api/"
CONSOLE_PREFIX: Final = "/console"
# The console's own actions that need no operator: signing in (the token is the form) and out.
CONSOLE_OPEN_ACTIONS: Final = frozenset({"/console/login", "/console/logout"})
PROBES: Final = frozenset({"/healthz", "/readyz"})
METRICS: Final = "/metrics"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
COMMON_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
CONSOLE_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class HttpGate:
    def __init__(self, app: ASGIApp, auth: AdminAuth, sessions: ConsoleSessions, allowed_hosts: list[str]) -> None:
        self.app = app
        self.auth = auth
        self.sessions = sessions
        self.allowed_hosts = frozenset(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_headers(scope["path"], send)
        request = Request(scope, receive)
        try:
            refusal = await self._refusal(request)
        except CoordinatorError as error:
            refusal = _error(error.http_status, error.grpc_code.name, error.message)
        body = None if refusal is not None else await _bounded_body(request)
        if body is not None:
            await self.app(scope, _replaying(body, receive), send)
            return
        if refusal is None:
            refusal = _error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "INVALID_ARGUMENT",
                f"the request body is over {MAX_BODY_BYTES} bytes: nothing was read or changed",
            )
        await refusal(scope, receive, send)

    async def _refusal(self, request: Request) -> JSONResponse | RedirectResponse | None:
        path, method = request.url.path, request.method
        if path in PROBES:
            return None
        if path != METRICS and "*" not in self.allowed_hosts and _host(request) not in self.allowed_hosts:
            return _error(
                HTTPStatus.MISDIRECTED_REQUEST,
                "INVALID_ARGUMENT",
                f"this coordinator does not answer host {quote(_host(request))}: add it to "
                "SINK_COORDINATOR_ALLOWED_HOSTS if it is yours",
            )
        if method not in SAFE_METHODS and _cross_site(request):
            return _error(
                HTTPStatus.FORBIDDEN,
                "PERMISSION_DENIED",
                "a cross-site request may not act on the coordinator: send it from the console itself, or "
                "without a browser",
            )
        if path == METRICS:
            self.auth.check_metrics_reader(await bearer_scheme(request))
        elif path.startswith(API_PREFIX):
            credentials = await bearer_scheme(request)
            if method in SAFE_METHODS:
                self.auth.check_reader(credentials)
            else:
                self.auth.operator(request, credentials)
        elif (
            path.startswith(CONSOLE_PREFIX)
            and method not in SAFE_METHODS
            and path not in CONSOLE_OPEN_ACTIONS
            and not await self.sessions.may_act(request)
        ):
            return RedirectResponse(f"{CONSOLE_PREFIX}/login?{urlencode({'next': path})}", status_code=303)
        return None


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == HTTPStatus.UNAUTHORIZED else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _host(request: Request) -> str:
    """The Host header's name, lower case, without its port (or an IPv6 address's brackets)."""
    host = request.headers.get("host", "").lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _cross_site(request: Request) -> bool:
    """Whether a browser sent the request from another site. The browser's own verdict (Sec-Fetch-Site) when it
    gives one, which holds behind a proxy that rewrites the Host; else an Origin other than the Host. Clients
    that are no browser send neither."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is not None and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()


async def _bounded_body(request: Request) -> bytes | None:
    """The whole body, or None as soon as it is (or says it will be) over MAX_BODY_BYTES."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return None
    except ClientDisconnect:
        return None  # nobody is left to answer
    return bytes(body)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """The body read here, as the app's first receive; then whatever the connection says (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _with_headers(path: str, send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in COMMON_HEADERS.items():
                headers.setdefault(name, value)
            if path.startswith(CONSOLE_PREFIX):
                headers.setdefault("Content-Security-Policy", CONSOLE_POLICY)
        await send(message)

    return sending
