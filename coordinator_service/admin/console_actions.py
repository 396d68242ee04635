"""The operator console's actions (an epoch aborted, a sink reset or deleted, a table removed) and its sign-in and
sign-out: each action checks the session's CSRF token and calls the same operation as the admin API, with the same
operator identity."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import RedirectResponse, Response

from coordinator_service.admin.console_routes import (
    CONSOLE_PREFIX,
    FORCE_LABEL,
    SessionsDep,
    Visitor,
    render_page,
    render_sink_page,
    to_login,
    visitor_of,
)
from coordinator_service.admin.console_session import ConsoleSessions, Role
from coordinator_service.admin.deps import OperationsDep
from coordinator_service.admin.schemas import MAX_EPOCH
from coordinator_service.contract.errors import CoordinatorError, FailedPrecondition, InvalidArgument
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.engine.operator.base import ForceRequired

router = APIRouter(prefix=CONSOLE_PREFIX, include_in_schema=False)


async def _acting(request: Request, sessions: ConsoleSessions, csrf: str) -> Visitor | Response:
    """The visitor, if they may act and the form is theirs; otherwise the answer that refuses it."""
    visitor = await visitor_of(request, sessions)
    if visitor.role is Role.NONE:
        return to_login(request)
    if not visitor.may_act:
        return render_page(
            request, sessions, visitor, "error.html", status=403, message="Sign in with the admin token to act."
        )
    if not sessions.csrf_matches(visitor.session, csrf):
        return render_page(
            request,
            sessions,
            visitor,
            "error.html",
            status=403,
            message="This form is not from your session (missing or stale CSRF token): reload the page and try again.",
        )
    return visitor


@router.post("/sinks/{sink}/abort")
async def abort_epoch(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    epoch: Annotated[int, Form(ge=0, le=MAX_EPOCH)],
    reason: Annotated[str, Form(max_length=2000)] = "",
    force: Annotated[bool, Form()] = False,
    csrf: Annotated[str, Form()] = "",
) -> Response:
    async def abort(operator: Operator) -> str:
        try:
            outcome = await operations.abort_epoch(sink, epoch, reason, force, operator)
        except ForceRequired as refused:  # said with the form's checkbox, not the API's field
            raise FailedPrecondition(refused.explained(f"Tick “{FORCE_LABEL}”")) from None
        done = f"epoch {epoch} aborted" if outcome.changed else f"epoch {epoch} was already aborted; nothing changed"
        return done + (f" ({outcome.warning})" if outcome.warning else "")

    form = {"form": "abort", "epoch": epoch, "reason": reason, "force": force}
    return await _act(request, operations, sessions, sink, csrf, reason, "the abort", abort, form)


@router.post("/sinks/{sink}/reset")
async def reset_sink(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    confirm: Annotated[str, Form(max_length=300)] = "",
    reason: Annotated[str, Form(max_length=2000)] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    async def reset(operator: Operator) -> str:
        outcome = await operations.reset_sink(sink, confirm, reason, operator)
        aborted = ", ".join(str(epoch) for epoch in outcome.aborted_epochs) or "none"
        return f"sink reset (generation {outcome.sink.sink.generation}); epochs aborted: {aborted}"

    form = {"form": "reset", "confirm": confirm, "reason": reason}
    return await _act(request, operations, sessions, sink, csrf, reason, "the reset", reset, form)


@router.post("/sinks/{sink}/delete")
async def delete_sink(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    confirm: Annotated[str, Form(max_length=300)] = "",
    reason: Annotated[str, Form(max_length=2000)] = "",
    drop_tables: Annotated[bool, Form()] = False,
    csrf: Annotated[str, Form()] = "",
) -> Response:
    async def delete(operator: Operator) -> str:
        return (await operations.delete_sink(sink, confirm, reason, drop_tables, operator)).summary()

    form = {"form": "delete", "confirm": confirm, "reason": reason, "drop_tables": drop_tables}
    return await _act(
        request, operations, sessions, sink, csrf, reason, "the deletion", delete, form, then=CONSOLE_PREFIX
    )


@router.post("/sinks/{sink}/tables/{table}/remove")
async def remove_table(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    table: Annotated[str, Path(max_length=600)],
    confirm: Annotated[str, Form(max_length=600)] = "",
    reason: Annotated[str, Form(max_length=2000)] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    async def remove(operator: Operator) -> str:
        return (await operations.remove_table(sink, table, confirm, reason, operator)).summary()

    form = {"form": "remove", "table": table, "confirm": confirm, "reason": reason}
    return await _act(request, operations, sessions, sink, csrf, reason, "the removal", remove, form)


async def _act(
    request: Request,
    operations: OperationsDep,
    sessions: ConsoleSessions,
    sink: str,
    csrf: str,
    reason: str,
    what: str,
    action: Callable[[Operator], Awaitable[str]],
    form: Mapping[str, object],
    then: str = "",
) -> Response:
    """An operator's action from a form of their session, with a reason: on to `then` (the sink's page) saying what
    it did, or the sink's page again with why it was refused (nothing changed) and the form as it was sent."""
    acting = await _acting(request, sessions, csrf)
    if not isinstance(acting, Visitor):
        return acting
    try:
        if not reason.strip() or "\x00" in reason:
            raise InvalidArgument(f"give the reason for {what}: it is recorded")
        done = await action(sessions.auth.operator_of(request))
    except CoordinatorError as error:
        return await render_sink_page(
            request, operations, sessions, acting, sink, error=error.message, status=error.http_status, form=form
        )
    return RedirectResponse(
        f"{then or f'{CONSOLE_PREFIX}/sinks/{sink}'}?{urlencode({'done': sessions.notice(done)})}", status_code=303
    )


@router.get("/login")
async def login_page(
    request: Request, sessions: SessionsDep, next: Annotated[str, Query(max_length=500)] = CONSOLE_PREFIX
) -> Response:
    visitor = await visitor_of(request, sessions)
    return render_page(request, sessions, visitor, "login.html", next=_local(next), failed=False)


@router.post("/login")
async def login(
    request: Request,
    sessions: SessionsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=500)] = CONSOLE_PREFIX,
) -> Response:
    session = sessions.sign_in(token)
    if session is None:
        visitor = await visitor_of(request, sessions)
        return render_page(request, sessions, visitor, "login.html", status=401, next=_local(next), failed=True)
    response = RedirectResponse(_local(next), status_code=303)
    sessions.keep(response, session)
    return response


@router.post("/logout")
async def logout(request: Request, sessions: SessionsDep, csrf: Annotated[str, Form()] = "") -> Response:
    visitor = await visitor_of(request, sessions)
    if not sessions.csrf_matches(visitor.session, csrf):
        return render_page(
            request, sessions, visitor, "error.html", status=403, message="Reload the page and try again."
        )
    response = RedirectResponse(f"{CONSOLE_PREFIX}/login", status_code=303)
    await sessions.end(response, visitor.session)
    return response


def _local(target: str) -> str:
    """Only a path of the console: a login must not send the browser elsewhere."""
    return target if target.startswith(CONSOLE_PREFIX) and "//" not in target and "\\" not in target else CONSOLE_PREFIX
