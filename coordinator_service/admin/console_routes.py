"""The operator console (/console): server-rendered pages over the same operations as the admin API.

Pages read through coordinator_service.engine.operations and show the admin API's own
models (admin_schemas); actions call the same operations with the same
operator identity, so each is checked and recorded exactly as through the API.
Who may see and act is coordinator_service.admin.console_session's business; every
action form carries the session's CSRF token. Routes are left out of the
OpenAPI document: the console is not part of the API's contract. htmx 2.0.11
(0BSD, console/static) refreshes the sink list; nothing is loaded from elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from importlib.resources import files
from pathlib import Path as FilePath
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from coordinator_service.admin import display
from coordinator_service.admin.console_session import ConsoleSessions, Role, Session
from coordinator_service.admin.deps import OperationsDep
from coordinator_service.admin.schemas import MAX_EPOCH, EpochResponse, SinkResponse
from coordinator_service.contract.errors import CoordinatorError, FailedPrecondition, InvalidArgument
from coordinator_service.contract.source_positions import VALID_THROUGH_MS
from coordinator_service.engine.operator.answers import Operator
from coordinator_service.engine.operator.base import ForceRequired

CONSOLE_PREFIX: Final = "/console"
STATIC_DIRECTORY: Final = FilePath(str(files("coordinator_service.admin").joinpath("console", "static")))
TEMPLATES: Final = Jinja2Templates(directory=str(files("coordinator_service.admin").joinpath("console", "templates")))
TEMPLATES.env.filters.update(epoch=display.epoch, duration=display.duration, ms_time=display.milliseconds_time)
# The newest epochs a sink's page shows.
TIMELINE_EPOCHS: Final = 200
# Sinks on one page of the list (sorted and filtered over all of them): a page a browser draws at once, and that
# the refresh can redraw every few seconds, whatever the number of sinks.
PAGE_ROWS: Final = 100
REFRESH_SECONDS: Final = 5
# The abort form's checkbox, as the page and its refusals name it.
FORCE_LABEL: Final = "force: give its records up"

router = APIRouter(prefix=CONSOLE_PREFIX, include_in_schema=False)


def sessions_of(request: Request) -> ConsoleSessions:
    sessions: ConsoleSessions = request.app.state.console_sessions
    return sessions


SessionsDep = Annotated[ConsoleSessions, Depends(sessions_of)]


class SortKey(StrEnum):
    SINK = "sink"
    TABLE = "table"
    LAG = "lag"
    PENDING = "pending"
    AGE = "age"
    STATE = "state"
    LAST_COMMIT = "last_commit"


class StateFilter(StrEnum):
    ANY = ""
    HEALTHY = "healthy"
    RETRYING = "retrying"
    STUCK = "stuck"
    IDLE = "idle"
    STALLED = "stalled"  # its oldest PENDING epoch waited STALLED_AFTER_SECONDS
    LAGGING = "lagging"  # epochs checkpointed but not committed


def shown_state(sink: SinkResponse) -> str:
    """The committer's state, unless the sink is stalled while its committer has nothing wrong to say: a writer that
    died leaves a healthy (or idle) committer behind."""
    if sink.stalled is not None and sink.committer.state in ("healthy", "idle"):
        return StateFilter.STALLED.value
    return sink.committer.state


@dataclass(frozen=True)
class SinkRow:
    sink: SinkResponse
    maintenance: bool

    @property
    def lag(self) -> int:
        return max(self.sink.checkpointed_epoch - self.sink.committed_epoch, 0)

    @property
    def state(self) -> str:
        return shown_state(self.sink)

    @property
    def shared_with(self) -> list[str]:
        """The other sinks writing one of its tables."""
        return sorted({other for table in self.sink.tables for other in table.also_written_by})


@dataclass(frozen=True)
class Visitor:
    session: Session
    role: Role

    @property
    def may_act(self) -> bool:
        return self.role is Role.OPERATOR


async def _visitor(request: Request, sessions: ConsoleSessions) -> Visitor:
    session = await sessions.session_of(request)
    return Visitor(session, sessions.role(session))


def _page(
    request: Request, sessions: ConsoleSessions, visitor: Visitor, name: str, status: int = 200, **context: Any
) -> Response:
    response = TEMPLATES.TemplateResponse(
        request,
        name,
        {
            "visitor": visitor,
            "prefix": CONSOLE_PREFIX,
            "refresh_seconds": REFRESH_SECONDS,
            "force_label": FORCE_LABEL,
            **context,
        },
        status_code=status,
    )
    sessions.keep(response, visitor.session)
    return response


def _to_login(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{CONSOLE_PREFIX}/login?{urlencode({'next': request.url.path})}", status_code=303)


async def _rows(
    operations: OperationsDep, q: str, state: StateFilter, sort: SortKey, descending: bool
) -> list[SinkRow]:
    settings = operations.settings
    rows = [
        SinkRow(
            SinkResponse.of(overview), settings.with_overrides(overview.sink.maintenance_overrides).maintenance_enabled
        )
        for overview in await operations.sinks()
    ]
    needle = q.strip().lower()
    if needle:
        rows = [row for row in rows if needle in row.sink.sink.lower() or needle in row.sink.table.lower()]
    if state is StateFilter.LAGGING:
        rows = [row for row in rows if row.lag > 0 or row.sink.pending_epochs > 0]
    elif state is StateFilter.STALLED:
        rows = [row for row in rows if row.sink.stalled is not None]
    elif state is not StateFilter.ANY:
        rows = [row for row in rows if row.state == state.value]
    keys = {
        SortKey.SINK: lambda row: row.sink.sink,
        SortKey.TABLE: lambda row: row.sink.table,
        SortKey.LAG: lambda row: row.lag,
        SortKey.PENDING: lambda row: row.sink.pending_epochs,
        SortKey.AGE: lambda row: row.sink.oldest_pending_age_seconds or 0.0,
        SortKey.STATE: lambda row: row.state,
        SortKey.LAST_COMMIT: lambda row: row.sink.last_commit_at or datetime.min.replace(tzinfo=UTC),
    }
    return sorted(rows, key=keys[sort], reverse=descending)


@dataclass(frozen=True)
class ListQuery:
    """What the list shows: the filter, the order and the page (the same for the page and its refresh)."""

    q: str
    state: StateFilter
    sort: SortKey
    desc: bool
    page: int

    def arguments(self, **changed: object) -> str:
        values = {"q": self.q, "state": self.state.value, "sort": self.sort.value, "desc": str(self.desc).lower()}
        return urlencode({**values, **changed})


def list_query(
    q: Annotated[str, Query(max_length=200)] = "",
    state: StateFilter = StateFilter.ANY,
    sort: SortKey = SortKey.SINK,
    desc: bool = False,
    page: Annotated[int, Query(ge=1)] = 1,
) -> ListQuery:
    return ListQuery(q, state, sort, desc, page)


ListQueryDep = Annotated[ListQuery, Depends(list_query)]


async def _page_of_rows(operations: OperationsDep, query: ListQuery) -> tuple[list[SinkRow], int, int]:
    """The rows of the query's page (the last page when it asks beyond), every row's count, and the page."""
    rows = await _rows(operations, query.q, query.state, query.sort, query.desc)
    page = min(query.page, max(math.ceil(len(rows) / PAGE_ROWS), 1))
    return rows[(page - 1) * PAGE_ROWS : page * PAGE_ROWS], len(rows), page


@router.get("")
async def sinks_page(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    query: ListQueryDep,
    done: Annotated[str, Query(max_length=8000)] = "",
) -> Response:
    visitor = await _visitor(request, sessions)
    if visitor.role is Role.NONE:
        return _to_login(request)
    rows, total, page = await _page_of_rows(operations, query)
    return _page(
        request,
        sessions,
        visitor,
        "sinks.html",
        rows=rows,
        total=total,
        first=(page - 1) * PAGE_ROWS + 1,
        page=page,
        pages=max(math.ceil(total / PAGE_ROWS), 1),
        q=query.q,
        state=query.state.value,
        sort=query.sort.value,
        desc=query.desc,
        states=[member.value for member in StateFilter if member.value],
        query=query.arguments(),
        page_query=query.arguments(page=page),
        done=sessions.notice_text(done),
    )


@router.get("/sinks-table")
async def sinks_table(
    request: Request, operations: OperationsDep, sessions: SessionsDep, query: ListQueryDep
) -> Response:
    """The rows of a page alone: what the list page fetches every REFRESH_SECONDS."""
    visitor = await _visitor(request, sessions)
    if visitor.role is Role.NONE:
        return Response(status_code=401)
    rows, _, _ = await _page_of_rows(operations, query)
    return _page(request, sessions, visitor, "sinks_rows.html", rows=rows)


@router.get("/sinks/{sink}")
async def sink_page(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    done: Annotated[str, Query(max_length=8000)] = "",
) -> Response:
    visitor = await _visitor(request, sessions)
    if visitor.role is Role.NONE:
        return _to_login(request)
    try:
        return await _sink_page(request, operations, sessions, visitor, sink, done=sessions.notice_text(done))
    except CoordinatorError as error:
        return _page(request, sessions, visitor, "error.html", status=error.http_status, message=error.message)


async def _sink_page(
    request: Request,
    operations: OperationsDep,
    sessions: ConsoleSessions,
    visitor: Visitor,
    sink: str,
    *,
    done: str = "",
    error: str = "",
    status: int = 200,
    form: Mapping[str, object] | None = None,
) -> Response:
    overview = await operations.sink(sink)
    epochs, _ = await operations.epochs(sink, None, None, TIMELINE_EPOCHS)
    samples = operations.committer.history.samples(sink)
    window = operations.committer.history.window_seconds
    shown = SinkResponse.of(overview)
    # A table whose commits fail may be gone from the catalog: then it waits for an operator to remove it.
    dropped = await operations.missing_from_catalog([table.table for table in shown.tables if table.retrying])
    return _page(
        request,
        sessions,
        visitor,
        "sink.html",
        status=status,
        sink=shown,
        state=shown_state(shown),
        dropped=dropped,
        epochs=[EpochResponse.of(row) for row in epochs],
        latency_chart=line_chart([(sample.at, sample.seconds * 1000) for sample in samples], "ms", window),
        lag_chart=line_chart([(sample.at, float(sample.lag_epochs)) for sample in samples], "epochs", window),
        commits=len(samples),
        window_minutes=round(window / 60),
        done=done,
        error=error,
        form=form or {},
    )


@router.get("/sinks/{sink}/epochs/{epoch}")
async def epoch_page(
    request: Request, operations: OperationsDep, sessions: SessionsDep, sink: str, epoch: int
) -> Response:
    visitor = await _visitor(request, sessions)
    if visitor.role is Role.NONE:
        return _to_login(request)
    try:
        detail = await operations.epoch(sink, epoch)
    except CoordinatorError as error:
        return _page(request, sessions, visitor, "error.html", status=error.http_status, message=error.message)
    return _page(
        request,
        sessions,
        visitor,
        "epoch.html",
        sink=sink,
        epoch=EpochResponse.of(detail.row),
        files=detail.metadata.data_files,
        properties=detail.metadata.properties,
        valid_through=VALID_THROUGH_MS,
    )


async def _acting(request: Request, sessions: ConsoleSessions, csrf: str) -> Visitor | Response:
    """The visitor, if they may act and the form is theirs; otherwise the answer that refuses it."""
    visitor = await _visitor(request, sessions)
    if visitor.role is Role.NONE:
        return _to_login(request)
    if not visitor.may_act:
        return _page(
            request, sessions, visitor, "error.html", status=403, message="Sign in with the admin token to act."
        )
    if not sessions.csrf_matches(visitor.session, csrf):
        return _page(
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
        return await _sink_page(
            request, operations, sessions, acting, sink, error=error.message, status=error.http_status, form=form
        )
    return RedirectResponse(
        f"{then or f'{CONSOLE_PREFIX}/sinks/{sink}'}?{urlencode({'done': sessions.notice(done)})}", status_code=303
    )


@router.get("/login")
async def login_page(
    request: Request, sessions: SessionsDep, next: Annotated[str, Query(max_length=500)] = CONSOLE_PREFIX
) -> Response:
    visitor = await _visitor(request, sessions)
    return _page(request, sessions, visitor, "login.html", next=_local(next), failed=False)


@router.post("/login")
async def login(
    request: Request,
    sessions: SessionsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=500)] = CONSOLE_PREFIX,
) -> Response:
    session = sessions.sign_in(token)
    if session is None:
        visitor = await _visitor(request, sessions)
        return _page(request, sessions, visitor, "login.html", status=401, next=_local(next), failed=True)
    response = RedirectResponse(_local(next), status_code=303)
    sessions.keep(response, session)
    return response


@router.post("/logout")
async def logout(request: Request, sessions: SessionsDep, csrf: Annotated[str, Form()] = "") -> Response:
    visitor = await _visitor(request, sessions)
    if not sessions.csrf_matches(visitor.session, csrf):
        return _page(request, sessions, visitor, "error.html", status=403, message="Reload the page and try again.")
    response = RedirectResponse(f"{CONSOLE_PREFIX}/login", status_code=303)
    await sessions.end(response, visitor.session)
    return response


def _local(target: str) -> str:
    """Only a path of the console: a login must not send the browser elsewhere."""
    return target if target.startswith(CONSOLE_PREFIX) and "//" not in target and "\\" not in target else CONSOLE_PREFIX


@dataclass(frozen=True)
class Chart:
    """A line chart of the last hour in SVG coordinates (x 0-600 from an hour ago to now, y 0-120), with its top
    value as a label."""

    points: tuple[tuple[float, float], ...]
    top: str
    unit: str

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in self.points)


CHART_WIDTH: Final = 600
CHART_HEIGHT: Final = 120


def line_chart(series: list[tuple[float, float]], unit: str, window_seconds: float) -> Chart:
    if not series:
        return Chart((), "", unit)
    start = time.time() - window_seconds
    top = max(value for _, value in series) or 1.0
    points = tuple(
        ((at - start) / window_seconds * CHART_WIDTH, CHART_HEIGHT - 4 - value / top * (CHART_HEIGHT - 12))
        for at, value in series
    )
    shown = f"{top:.0f}" if top >= 10 or math.isclose(top, round(top)) else f"{top:.2f}"
    return Chart(points, shown, unit)
