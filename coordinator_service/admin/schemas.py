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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator
from pydantic.dataclasses import dataclass

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.views import EpochStatus, EpochView, SinkTable, SinkView, from_attributes
from coordinator_service.engine.commit_state import CommitterHealth
from coordinator_service.engine.operator.answers import (
    AbortOutcome,
    EpochDetail,
    MaintenanceView,
    Reconciled,
    ResetOutcome,
    SinkDeleted,
    SinkOverview,
    SuspendedReconciled,
    TableRemoved,
)
from coordinator_service.log.models import AbortCause, EpochRecord
from coordinator_service.settings.maintenance import MaintenancePolicy

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
        description="idle: this process has not committed the sink yet (another replica may have). stuck: its "
        "commits failed in a way no retry can fix (last_error says why); fix the cause, then POST .../resume."
    )
    failed_attempts: int
    last_error: str | None
    last_error_at: datetime | None

    @classmethod
    def of(cls, health: CommitterHealth | None) -> CommitterState:
        if health is None:
            return cls(state="idle", failed_attempts=0, last_error=None, last_error_at=None)
        state: Literal["healthy", "retrying", "stuck"] = "healthy"
        if health.stuck is not None:
            state = "stuck"
        elif health.retrying:
            state = "retrying"
        return cls(
            state=state,
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
                    table=table.table,
                    committed_epoch=table.committed_epoch,
                    retrying=table.table in failing,
                    last_error=failing[table.table].error if table.table in failing else None,
                    stuck=table.table in failing and not failing[table.table].retryable,
                    also_written_by=tuple(overview.also_written_by.get(table.table, ())),
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
            committer=CommitterState.of(overview.health),
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


class AbortRequest(BaseModel):
    reason: OperatorText = Field(description="Why; kept in the epoch's reason and told to the writer.")
    force: bool = Field(
        default=False,
        description="Required to abort a PENDING epoch: its records will not reach the table. Spark may already "
        "have checkpointed it (at or below the sink's checkpoint, or above it with its report on the way), and "
        "then will not write it again; a checkpoint that covers the aborted epoch is accepted.",
    )


class AbortResponse(BaseModel):
    epoch: EpochResponse
    changed: bool = Field(description="False when the epoch was already ABORTED (nothing changed).")
    warning: str | None = Field(description="Set when a checkpointed epoch was aborted: what is lost.")

    @classmethod
    def of(cls, outcome: AbortOutcome) -> AbortResponse:
        return cls(epoch=EpochResponse.of(outcome.row), changed=outcome.changed, warning=outcome.warning)


class AdoptRequest(BaseModel):
    reason: OperatorText = Field(description="Why writers may take the table; logged with who adopted it.")


class AdoptResponse(BaseModel):
    table: str
    changed: bool = Field(
        description="False when writers could already take the table (the coordinator created it, or it was "
        "adopted before): nothing changed."
    )


class ResetRequest(BaseModel):
    confirm: str = Field(max_length=300, description="The sink's name again, to confirm.")
    reason: OperatorText


class ResetResponse(BaseModel):
    sink: SinkResponse
    aborted_epochs: list[int]

    @classmethod
    def of(cls, outcome: ResetOutcome) -> ResetResponse:
        return cls(sink=SinkResponse.of(outcome.sink), aborted_epochs=list(outcome.aborted_epochs))


class ReconcileRequest(BaseModel):
    confirm: str = Field(max_length=300, description="The sink's name again, to confirm.")
    reason: OperatorText


class ReconcileResponse(BaseModel):
    sink: SinkResponse
    restart_epoch: int = Field(
        description="Every table holds the epochs up to it: start the new writer from its end offsets (the "
        "snapshot summary's sink-coordinator.kafka.end-offsets), with a new checkpoint."
    )
    tables: dict[str, int] = Field(
        description="The newest epoch each table holds; the records of those above restart_epoch are written again "
        "by a writer started from it."
    )

    @classmethod
    def of(cls, outcome: Reconciled) -> ReconcileResponse:
        return cls(sink=SinkResponse.of(outcome.sink), restart_epoch=outcome.restart_epoch, tables=outcome.tables)


# Most sinks one request names (a reconcile of every suspended sink names none).
MOST_NAMED_SINKS = 1000


class ReconcileSuspendedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sinks: list[Annotated[str, Field(max_length=300)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MOST_NAMED_SINKS,
        description="The suspended sinks to reconcile, by name; each must be suspended (nothing is changed "
        "otherwise). Give either sinks or all_suspended.",
    )
    all_suspended: StrictBool = Field(
        default=False, description="Reconcile every sink that is suspended now (after a restore of the metastore)."
    )
    reason: OperatorText

    @model_validator(mode="after")
    def one_choice(self) -> ReconcileSuspendedRequest:
        if (self.sinks is None) == (not self.all_suspended):
            raise ValueError("give the sinks to reconcile (sinks) or all_suspended: true, one of the two")
        return self


class ReconcileRefusal(BaseModel):
    sink: str
    error: ErrorDetail = Field(description="Why this sink was not reconciled; nothing of it was changed.")


class ReconcileSuspendedResponse(BaseModel):
    reconciled: list[ReconcileResponse] = Field(description="Each sink reconciled, as its own reconcile answers.")
    refused: list[ReconcileRefusal] = Field(
        description="Each sink that could not be reconciled (another catalog, a table missing, no longer "
        "suspended): the other sinks went on."
    )

    @classmethod
    def of(cls, outcome: SuspendedReconciled) -> ReconcileSuspendedResponse:
        return cls(
            reconciled=[ReconcileResponse.of(each) for each in outcome.reconciled],
            refused=[
                ReconcileRefusal(sink=name, error=ErrorDetail(code=error.grpc_code.name, message=error.message))
                for name, error in outcome.refused
            ],
        )


class RemoveTableRequest(BaseModel):
    confirm: str = Field(max_length=300, description="The table's name again, to confirm.")
    reason: OperatorText


class GivenUpResponse(BaseModel):
    epoch: int
    files: int = Field(description="The epoch's data files in the removed table.")
    records: int = Field(description="Their records, which no table will get.")


class RemoveTableResponse(BaseModel):
    sink: SinkResponse
    given_up: list[GivenUpResponse]

    @classmethod
    def of(cls, outcome: TableRemoved) -> RemoveTableResponse:
        return cls(
            sink=SinkResponse.of(outcome.sink),
            given_up=[GivenUpResponse(epoch=e.epoch, files=e.files, records=e.records) for e in outcome.given_up],
        )


class DeleteSinkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    confirm: str = Field(max_length=300, description="The sink's name again, to confirm.")
    reason: OperatorText
    drop_tables: StrictBool = Field(
        default=False,
        description="Drop the sink's tables too: their catalog entries go, and the files they reached are deleted when "
        "proven garbage (under the table's own directories, no link, claimed by no other sink); refused when "
        "another sink writes one of them.",
    )


class DeleteSinkResponse(BaseModel):
    sink: str
    given_up: list[GivenUpResponse] = Field(description="Its PENDING epochs, aborted: their records reach no table.")
    files_deleted: int = Field(
        description="Files of its epochs not committed, and files of the tables dropped, proven garbage and deleted."
    )
    files_kept: int = Field(
        description="Files of its epochs not committed, and files the dropped tables reached, that could not be "
        "proven garbage (a table gone, one that references them, a file under another table's location or reached "
        "through a link, one another sink claims), left on storage."
    )
    tables_dropped: list[str]

    @classmethod
    def of(cls, deleted: SinkDeleted) -> DeleteSinkResponse:
        return cls(
            sink=deleted.sink,
            given_up=[GivenUpResponse(epoch=e.epoch, files=e.files, records=e.records) for e in deleted.given_up],
            files_deleted=deleted.files_deleted,
            files_kept=deleted.files_kept,
            tables_dropped=list(deleted.tables_dropped),
        )


class MaintenanceRunResponse(BaseModel):
    id: int
    trigger: str = Field(
        description="schedule (the coordinator's timing), threshold (a commit took a table past SNAPSHOT_MAX_COUNT) "
        "or operator (POST .../maintenance/run)."
    )
    started_at: datetime
    finished_at: datetime | None
    outcome: str = Field(description="running, ok or failed.")
    error: str | None
    snapshots_expired: int
    expired_files_deleted: int = Field(description="Files only the expired snapshots referenced, deleted.")
    files_compacted: int
    files_written: int
    bytes_rewritten: int
    swept: bool = Field(description="Whether the run looked for orphan files.")
    orphans_deleted: int

    model_config = ConfigDict(from_attributes=True)


class MaintenanceResponse(BaseModel):
    policy: MaintenancePolicy = Field(description="The settings in force for this sink's table.")
    overrides: dict[str, Any] = Field(description="The sink's own values, over the coordinator's defaults.")
    runs: list[MaintenanceRunResponse] = Field(description="The last runs, newest first.")

    @classmethod
    def of(cls, view: MaintenanceView) -> MaintenanceResponse:
        return cls(
            policy=view.policy,
            overrides=view.overrides,
            runs=[MaintenanceRunResponse.model_validate(run) for run in view.runs],
        )


class MaintenanceOverridesRequest(BaseModel):
    overrides: dict[str, StrictBool | StrictInt | StrictFloat] = Field(
        description="Settings of the maintenance policy (the names of GET .../maintenance's policy) that this "
        "sink's table uses instead of the coordinator's; {} goes back to the defaults.",
        max_length=50,
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
