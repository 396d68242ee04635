"""The admin API's operator actions as they cross the wire: each request and its answer (an abort, an adoption, a
reset, a reconcile, a table removed, a sink deleted)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from coordinator_service.admin.schemas import EpochResponse, ErrorDetail, OperatorText, SinkResponse
from coordinator_service.engine.operator.answers import (
    AbortOutcome,
    Reconciled,
    ResetOutcome,
    SinkDeleted,
    SuspendedReconciled,
    TableRemoved,
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
