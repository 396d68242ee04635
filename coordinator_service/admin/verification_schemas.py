"""A sink's verification as the admin API and `sink-coordinator verify --json` show it (the same model), and the
request of POST /api/v1/sinks/{sink}/verify."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.engine.verification.findings import Fault, TableVerification, Verification
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.log.models import VerificationRecord

SettingText = Annotated[str, Field(min_length=1, max_length=2000, pattern=r"^[^\x00-\x1f]*$")]


class VerifyRequest(BaseModel):
    incremental: StrictBool = Field(
        default=False,
        description="From where each table was proven last (only newer snapshots read); false: from the start.",
    )
    bootstrap_servers: SettingText | None = Field(
        default=None,
        description="Kafka's bootstrap servers: with them, every offset the topics still hold in the "
        "committed range must be in a live row (tables with the writer's Kafka position columns).",
    )
    kafka_options: dict[SettingText, SettingText] = Field(
        default_factory=dict, max_length=50, description="librdkafka settings (security.protocol, sasl.*, ...)."
    )

    model_config = ConfigDict(extra="forbid")

    def kafka(self) -> KafkaAccess | None:
        """InvalidArgument for options without servers, or settings the verifier cannot take."""
        if self.bootstrap_servers is None:
            if self.kafka_options:
                raise InvalidArgument("Kafka options need the bootstrap servers (bootstrap_servers) too")
            return None
        return KafkaAccess(self.bootstrap_servers, dict(self.kafka_options))


class FaultResponse(BaseModel):
    kind: str = Field(
        description="overlap, gap, end-mismatch, too-many-rows, foreign-change, snapshot-rows, "
        "duplicate-position, outside-range, duplicate-key, missing-record, rows-not-read."
    )
    table: str
    epoch: int | None = Field(description="The epoch at fault (none: a change outside the coordinator, a key).")
    detail: str = Field(description="The first offsets, keys or files at fault.")

    @classmethod
    def of(cls, fault: Fault) -> FaultResponse:
        return cls(kind=fault.kind.value, table=fault.table, epoch=fault.epoch, detail=fault.detail)


class TableVerificationResponse(BaseModel):
    table: str
    ok: bool
    faults: list[FaultResponse]
    notes: list[str] = Field(description="What could not be proven, and why.")
    snapshot_id: int | None = Field(description="The newest snapshot verified.")
    verified_epoch: int = Field(description="The sink's newest epoch the table holds, as verified (-1: none).")
    deep: bool = Field(description="Whether the live rows' Kafka positions or keys were checked.")
    kafka: bool = Field(description="Whether the topics' offsets were checked against the rows.")
    rows_read: int
    files_read: int
    manifests_read: int

    @classmethod
    def of(cls, table: TableVerification) -> TableVerificationResponse:
        return cls(
            table=table.table,
            ok=not table.faults,
            faults=[FaultResponse.of(fault) for fault in table.faults],
            notes=table.notes,
            snapshot_id=table.snapshot_id,
            verified_epoch=table.verified_epoch,
            deep=table.deep,
            kafka=table.kafka,
            rows_read=table.rows_read,
            files_read=table.files_read,
            manifests_read=table.manifests_read,
        )


class VerificationResponse(BaseModel):
    sink: str
    ok: bool
    incremental: bool
    verified_epoch: int = Field(description="The least over the tables.")
    end_offsets: dict[str, dict[str, int]] = Field(description="Where the committed range ends, by topic, partition.")
    tables: list[TableVerificationResponse]

    @classmethod
    def of(cls, verification: Verification) -> VerificationResponse:
        offsets: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(verification.end_offsets.items()):
            offsets.setdefault(topic, {})[str(partition)] = offset
        return cls(
            sink=verification.sink,
            ok=verification.ok,
            incremental=verification.incremental,
            verified_epoch=verification.verified_epoch,
            end_offsets=offsets,
            tables=[TableVerificationResponse.of(table) for table in verification.tables],
        )


class VerificationRecordResponse(BaseModel):
    table: str
    outcome: str = Field(description="ok or failed, of the last verification.")
    snapshot_id: int | None = Field(description="The newest snapshot proven (a failed verification keeps it).")
    verified_epoch: int
    end_offsets: dict[str, dict[str, int]]
    faults: list[FaultResponse]
    notes: list[str]
    deep: bool
    kafka: bool
    checked_at: datetime


class VerificationStateResponse(BaseModel):
    sink: str
    tables: list[VerificationRecordResponse] = Field(description="Each verified table's (none: never verified).")

    @classmethod
    def of(cls, sink: str, records: list[VerificationRecord]) -> VerificationStateResponse:
        return cls(
            sink=sink,
            tables=[
                VerificationRecordResponse(
                    table=record.table_identifier,
                    outcome=record.outcome,
                    snapshot_id=record.snapshot_id,
                    verified_epoch=record.verified_epoch,
                    end_offsets=record.end_offsets,
                    faults=[
                        FaultResponse.model_validate({**fault, "table": record.table_identifier})
                        for fault in record.faults
                    ],
                    notes=record.notes,
                    deep=record.deep,
                    kafka=record.kafka,
                    checked_at=record.checked_at,
                )
                for record in records
            ],
        )
