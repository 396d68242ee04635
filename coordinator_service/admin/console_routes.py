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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from importlib.resources import files
from pathlib import Path as FilePath
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from coordinator_service.admin import display
from coordinator_service.admin.console_charts import line_chart
from coordinator_service.admin.console_session import ConsoleSessions, Role, Session
from coordinator_service.admin.deps import OperationsDep
from coordinator_service.admin.schemas import EpochResponse, SinkResponse
from coordinator_service.admin.verification_schemas import VerificationStateResponse
from coordinator_service.contract.errors import CoordinatorError
from coordinator_service.contract.source_positions import VALID_THROUGH_MS

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


async def visitor_of(request: Request, sessions: ConsoleSessions) -> Visitor:
    session = await sessions.session_of(request)
    return Visitor(session, sessions.role(session))


def render_page(
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


def to_login(request: Request) -> RedirectResponse:
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
    visitor = await visitor_of(request, sessions)
    if visitor.role is Role.NONE:
        return to_login(request)
    rows, total, page = await _page_of_rows(operations, query)
    return render_page(
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
    visitor = await visitor_of(request, sessions)
    if visitor.role is Role.NONE:
        return Response(status_code=401)
    rows, _, _ = await _page_of_rows(operations, query)
    return render_page(request, sessions, visitor, "sinks_rows.html", rows=rows)


@router.get("/sinks/{sink}")
async def sink_page(
    request: Request,
    operations: OperationsDep,
    sessions: SessionsDep,
    sink: str,
    done: Annotated[str, Query(max_length=8000)] = "",
) -> Response:
    visitor = await visitor_of(request, sessions)
    if visitor.role is Role.NONE:
        return to_login(request)
    try:
        return await render_sink_page(request, operations, sessions, visitor, sink, done=sessions.notice_text(done))
    except CoordinatorError as error:
        return render_page(request, sessions, visitor, "error.html", status=error.http_status, message=error.message)


async def render_sink_page(
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
    verification = VerificationStateResponse.of(sink, await operations.verification(sink))
    return render_page(
        request,
        sessions,
        visitor,
        "sink.html",
        status=status,
        sink=shown,
        state=shown_state(shown),
        dropped=dropped,
        verification=verification,
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
    visitor = await visitor_of(request, sessions)
    if visitor.role is Role.NONE:
        return to_login(request)
    try:
        detail = await operations.epoch(sink, epoch)
    except CoordinatorError as error:
        return render_page(request, sessions, visitor, "error.html", status=error.http_status, message=error.message)
    return render_page(
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
