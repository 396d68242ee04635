"""The admin API's wire models (JSON), built from the operations' results.

A sink's and an epoch's responses are pydantic dataclasses that subclass their views
(coordinator_service.contract.views): the fields they share with the gRPC answers are declared there, once; only the
admin API's own fields are here.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field
from pydantic.dataclasses import dataclass

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.views import EpochStatus, EpochView, SinkTable, SinkView, from_attributes
from coordinator_service.engine.commit_state import CommitterHealth, stuck_reason
from coordinator_service.engine.operator.answers import EpochDetail, SinkOverview
from coordinator_service.log.models import AbortCause, EpochRecord, Sink

# Epochs are PostgreSQL bigints.
MAX_EPOCH = 2**63 - 1
# Free text that ends up in the log and in PostgreSQL, which refuses NUL in text.
OperatorText = Annotated[str, Field(min_length=1, max_length=2000, pattern=r"^[^\x00]*$")]


class EpochStatusFilter(StrEnum):
    PENDING = "pending"
    ABORTED = "aborted"
    COMMITTED = "committed"

    def as_status(self) -> EpochStatus:
        return EpochStatus(self.value.upper())


class ErrorDetail(BaseModel):
    code: str = Field(description="The gRPC-style status name, e.g. NOT_FOUND, FAILED_PRECONDITION.")
    message: str = Field(description="What was wrong and what to do about it.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class CommitterState(BaseModel):
    state: Literal["healthy", "retrying", "stuck", "idle"] = Field(
        description="idle: this process has not committed the sink yet (another replica may have). stuck: a "
        "committer (in this process or another, or a replica) met a failure no retry can fix (last_error says why); "
        "fix the cause, then POST .../resume, which resumes it everywhere."
    )
    failed_attempts: int
    last_error: str | None
    last_error_at: datetime | None

    @classmethod
    def of(cls, health: CommitterHealth | None, sink: Sink) -> CommitterState:
        """This process's committer of the sink, stuck while the log says a committer anywhere is."""
        stuck = stuck_reason(health, sink)
        if stuck is not None:
            here = health is not None and sink.committer_stuck_reason is None  # stuck here, not recorded in the log
            return cls(
                state="stuck",
                failed_attempts=0 if health is None else health.attempts,
                last_error=stuck,
                last_error_at=health.last_error_at if here and health is not None else sink.committer_stuck_at,
            )
        if health is None or health.stuck is not None:  # resumed elsewhere, not yet here
            return cls(state="idle", failed_attempts=0, last_error=None, last_error_at=None)
        return cls(
            state="retrying" if health.retrying else "healthy",
            failed_attempts=health.attempts,
            last_error=health.last_error,
            last_error_at=health.last_error_at,
        )


@dataclass(frozen=True)
class TableResponse(SinkTable):
    retrying: Annotated[
        bool,
        Field(
            description="True while this process's committer retries a failed commit to this table; the sink's "
            "other tables commit meanwhile, and its committed_epoch waits for this one."
        ),
    ]
    last_error: Annotated[
        str | None, Field(description="Why the last commit to this table failed; null when none did.")
    ]
    stuck: Annotated[
        bool,
        Field(
            description="True when the last commit to this table failed in a way no retry can fix (the table dropped "
            "from its catalog, or refusing what the commit built): the sink's committer stops until an operator "
            "fixes the cause and resumes it, or removes a fan-out table gone for good (POST .../tables/{table}/remove)."
        ),
    ]
    also_written_by: Annotated[
        tuple[str, ...],
        Field(description="The other sinks writing this table, by name: their writers' schemas must fit it too."),
    ]


@dataclass(frozen=True)
class SinkResponse(SinkView):
    tables: Annotated[
        tuple[TableResponse, ...],
        Field(
            description="Every table the sink writes, its own first, then (fan-out) the others by name; "
            "committed_epoch of the sink is the least of theirs."
        ),
    ]
    generation: Annotated[int, Field(description="Bumped by each reset; the table's markers carry it.")]
    incarnation: Annotated[
        uuid.UUID,
        Field(
            description="Created with the sink; the table's markers carry it, so a sink created again under the same "
            "name never takes an earlier one's markers as its own."
        ),
    ]
    awaiting_writer_after_reset: Annotated[
        bool,
        Field(description="True after a reset until a writer registers: that writer's checkpoint will be adopted."),
    ]
    suspended_reason: Annotated[
        str | None,
        Field(
            description="Set while the sink's log is out of step with one of its tables (a restored metastore, another "
            "table, another catalog): nothing is accepted or committed for it; says how to recover."
        ),
    ]
    pending_epochs: int
    aborted_epochs: int
    oldest_pending_age_seconds: Annotated[
        float | None, Field(description="Seconds since the oldest PENDING epoch was pre-committed; null without one.")
    ]
    stalled: Annotated[
        str | None,
        Field(
            description="Why the sink does not advance, once its oldest PENDING epoch has waited "
            "STALLED_AFTER_SECONDS (its writer died or hangs before the checkpoint, or its commits fail); null "
            "while it advances."
        ),
    ]
    writer_last_call_at: Annotated[
        datetime | None,
        Field(description="When the sink's writer last made a call a coordinator answered (any replica); null: none."),
    ]
    writer_last_call_age_seconds: Annotated[
        float | None, Field(description="Seconds since writer_last_call_at; null without one.")
    ]
    last_commit_at: Annotated[
        datetime | None,
        Field(
            description="When the log marked the committed epoch COMMITTED, whichever replica or process did; null "
            "when it has none (no commit yet, pruned, or an epoch an operator aborted)."
        ),
    ]
    committer: CommitterState
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, overview: SinkOverview) -> SinkResponse:
        sink, counts = overview.sink, overview.counts
        failing = {} if overview.health is None else overview.health.failing_tables
        return from_attributes(
            cls,
            sink,
            sink=sink.name,
            table=sink.table_identifier,
            tables=tuple(
                TableResponse(
                    table=table.identifier,
                    committed_epoch=table.committed_epoch,
                    retrying=table.identifier in failing,
                    last_error=failing[table.identifier].error if table.identifier in failing else None,
                    stuck=table.identifier in failing and not failing[table.identifier].retryable,
                    also_written_by=tuple(overview.also_written_by.get(table.identifier, ())),
                )
                for table in overview.tables
            ),
            awaiting_writer_after_reset=sink.rebase_on_register,
            pending_epochs=counts.pending,
            aborted_epochs=counts.aborted,
            oldest_pending_age_seconds=counts.oldest_pending_age_seconds,
            stalled=overview.stalled,
            writer_last_call_age_seconds=counts.writer_last_call_age_seconds,
            last_commit_at=counts.last_commit_at,
            committer=CommitterState.of(overview.health, sink),
        )


class SinkList(BaseModel):
    sinks: list[SinkResponse]


@dataclass(frozen=True)
class EpochResponse(EpochView):
    abort_cause: Annotated[AbortCause | None, Field(description="Set while ABORTED: RECOVERY, OPERATOR or RESET.")]
    aborted_at: Annotated[
        datetime | None, Field(description="Set while ABORTED: when; the cleaner's delays count from it.")
    ]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: EpochRecord) -> EpochResponse:
        return from_attributes(cls, row)


class EpochPage(BaseModel):
    epochs: list[EpochResponse]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")


class DataFileResponse(BaseModel):
    path: str
    table: str = Field(description="The table the file is for: the sink's own, or (fan-out) another of its tables.")
    writer_id: int
    record_count: int
    file_size_in_bytes: int
    spec_id: int


@dataclass(frozen=True)
class EpochDetailResponse(EpochResponse):
    table: str
    files: list[DataFileResponse]
    properties: dict[str, str]

    @classmethod
    def of_detail(cls, detail: EpochDetail) -> EpochDetailResponse:
        return from_attributes(
            cls,
            detail.row,
            table=detail.metadata.table,
            files=[
                DataFileResponse(
                    path=entry.path,
                    table=detail.metadata.table_of(entry),
                    writer_id=entry.writer_id,
                    record_count=entry.record_count,
                    file_size_in_bytes=entry.file_size_in_bytes,
                    spec_id=entry.spec_id,
                )
                for entry in detail.metadata.data_files
            ],
            properties=detail.metadata.properties,
        )


def encode_cursor(below_epoch: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"below": below_epoch}).encode()).decode()


def decode_cursor(cursor: str) -> int:
    """The epoch a page starts below; InvalidArgument for a token this API did not make."""
    try:
        below = json.loads(base64.urlsafe_b64decode(cursor.encode()))["below"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeError):
        below = None
    if not isinstance(below, int) or isinstance(below, bool) or not 0 <= below <= MAX_EPOCH:
        raise InvalidArgument("cursor is not a token from a previous page's next_cursor: omit it for the first page")
    return below
