"""SQLAlchemy models of the metastore: the sinks and their two-phase commit log."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from coordinator_service.contract.views import EpochStatus


class Base(DeclarativeBase):
    pass


# One row: the oldest release head whose code runs on the schema as migrated (coordinator_service.log.schema).
schema_compatibility = Table(
    "schema_compatibility", Base.metadata, Column("oldest_compatible_code", Text, nullable=False)
)


class AbortCause(enum.StrEnum):
    # RegisterWriter: the writer restarted from a checkpoint below the epoch; Spark runs the batch again.
    RECOVERY = "RECOVERY"
    # An operator aborted the epoch (admin API).
    OPERATOR = "OPERATOR"
    # An operator reset the sink (a lost Spark checkpoint).
    RESET = "RESET"


E = TypeVar("E", bound=enum.StrEnum)


class TextEnum(TypeDecorator[E]):
    """A StrEnum kept as its value in a text column (which keeps its CHECK of the values): rows read back hold
    members, never bare strings."""

    impl = Text
    cache_ok = True

    def __init__(self, members: type[E]) -> None:
        super().__init__()
        self.members = members

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.members(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.members(value)


class MaintenanceTrigger(enum.StrEnum):
    """What started a maintenance run (maintenance_runs.trigger)."""

    # The sink's maintenance interval came round.
    SCHEDULE = "schedule"
    # A commit took a table past one of its bounds: its snapshots, or small files to compact
    # (coordinator_service.engine.maintenance, Maintainer.appended).
    THRESHOLD = "threshold"
    # An operator asked (admin API, console).
    OPERATOR = "operator"


class MaintenanceOutcome(enum.StrEnum):
    """How a maintenance run ended (maintenance_runs.outcome); RUNNING until it does."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"


class Sink(Base):
    """One streaming query writing one Iceberg table (its own), or several (fan-out: sink_tables)."""

    __tablename__ = "sinks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    table_identifier: Mapped[str] = mapped_column(Text)
    catalog: Mapped[str] = mapped_column(Text)
    # The newest epoch whose Spark checkpoint is durable, as the writer reported it.
    checkpointed_epoch: Mapped[int] = mapped_column(BigInteger, default=-1, server_default="-1")
    # The newest epoch whose files are in its tables (all epochs at or below it are): the least of sink_tables'.
    committed_epoch: Mapped[int] = mapped_column(BigInteger, default=-1, server_default="-1")
    writer_term: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    writer_count: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Bumped by an operator reset: epoch numbers (and the table's markers) of an older generation
    # belong to a lost Spark checkpoint and say nothing about the epochs of the new one.
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Set by a reset: the next RegisterWriter adopts whatever checkpoint the writer presents.
    rebase_on_register: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Created with the row and written into every snapshot marker: a sink created again under the same name
    # (a recreated or restored metastore, a deleted row) never takes an earlier incarnation's markers as its own.
    incarnation: Mapped[uuid.UUID] = mapped_column(Uuid, unique=True, server_default=text("gen_random_uuid()"))
    # Sinks that existed before incarnations (migration 0003): markers without one count as theirs.
    legacy_markers: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # When its writer last called (a successful call, on any replica; migration 0012):
    # coordinator_service.engine.writer_calls.
    writer_last_call_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The columns of its key (an upsert or change stream), fixed when it is created; empty: an append stream
    # (migration 0013).
    key_columns: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list, server_default=text("'{}'::text[]"))
    # Settings of its table's maintenance that differ from the coordinator's (maintenance.MaintenancePolicy).
    maintenance_overrides: Mapped[dict[str, object] | None] = mapped_column(JSONB, nullable=True)
    # Set when the log is out of step with one of its tables (coordinator_service.engine.metastore_checks): nothing is
    # committed or accepted for the sink until an operator reconciles it, or the cause goes away.
    suspended_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Set when a committer (in any process or replica) met a failure no retry fixes, cleared by a resume; and the
    # resumes so far, which a stuck committer anywhere follows (migration 0018).
    committer_stuck_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    committer_stuck_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    resumes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    __table_args__ = (
        CheckConstraint("committed_epoch <= checkpointed_epoch", name="committed_not_after_checkpoint"),
        CheckConstraint("writer_count >= 1", name="writer_count_positive"),
    )


class EpochRecord(Base):
    """One epoch of one sink: its pre-committed files and where it stands, PENDING, COMMITTED or ABORTED (the
    table's name, older than the COMMITTED rows it holds, stays for the migrations' sake)."""

    __tablename__ = "pending_sink_state"

    sink_id: Mapped[int] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[EpochStatus] = mapped_column(
        Enum(EpochStatus, name="epoch_status", native_enum=True, validate_strings=True)
    )
    # The encoded pre-commit result (see coordinator_service.log.precommit_metadata).
    metadata_: Mapped[bytes] = mapped_column("metadata", LargeBinary)
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    file_count: Mapped[int] = mapped_column(Integer)
    record_count: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    files_cleaned: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Set exactly while the epoch is ABORTED: why, and since when (the cleaner's delays count from it).
    abort_cause: Mapped[AbortCause | None] = mapped_column(
        Enum(AbortCause, name="abort_cause", native_enum=True, validate_strings=True), nullable=True
    )
    aborted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    __table_args__ = (
        CheckConstraint("epoch >= 0", name="epoch_not_negative"),
        CheckConstraint(
            "(status = 'ABORTED') = (abort_cause IS NOT NULL AND aborted_at IS NOT NULL)",
            name="abort_cause_iff_aborted",
        ),
        # The committer and the cleaner look up epochs by status, not by key.
        Index("ix_pending_sink_state_sink_status_epoch", "sink_id", "status", "epoch"),
    )


class SinkTableRecord(Base):
    """One table a sink writes (fan-out), its own table among them, and the newest epoch that table holds.

    committed_epoch: the newest epoch whose files of this table the table holds, every epoch below it included
    (an epoch without files here is held trivially). Never below the sink's committed_epoch: a trigger
    (migration 0006) raises the tables of a sink with it, whatever statement moves it. The committer raises a
    table past the sink's as it appends to it, and the sink's follows once every table holds an epoch.
    """

    __tablename__ = "sink_tables"

    sink_id: Mapped[int] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="CASCADE"), primary_key=True)
    table_identifier: Mapped[str] = mapped_column(Text, primary_key=True)
    committed_epoch: Mapped[int] = mapped_column(BigInteger)
    # The table's UUID as its first check found it: another table under the same name is not this one.
    table_uuid: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class EpochFile(Base):
    """A path whose fate the log decides: the claim of an epoch's attempt or of a waiting part, the cleaner's queue,
    or a deletion's mark. One row per path, so that a claim and a deletion of a path exclude each other.

    * held: an epoch's attempt (epoch, attempt) or a part waiting in epoch_parts (epoch, no attempt) holds it;
    * discarded (discarded_at): garbage since then (an abort, a replaced attempt, a dropped part), due for the
      cleaner after CLEANUP_DELAY_SECONDS, or RECOVERY_FILES_KEEP_SECONDS with keep_for_rerun; epoch is NULL once
      its epoch row is gone (pruned, or an older numbering after a reset);
    * marked (deleting_at): a deletion is deleting it, or did (deleted_at); no claim takes it, and the mark stays
      ORPHAN_GRACE_SECONDS after the deletion (coordinator_service.engine.file_deletion).
    """

    __tablename__ = "epoch_files"

    path: Mapped[str] = mapped_column(Text, primary_key=True)
    # NULL once its sink is deleted: only a deletion's mark stays then, until its grace is over.
    sink_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="SET NULL"), nullable=True)
    epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    discarded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    keep_for_rerun: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    deleting_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    __table_args__ = (
        CheckConstraint("deleted_at IS NULL OR deleting_at IS NOT NULL", name="deleted_after_marked"),
        Index("ix_epoch_files_sink_epoch", "sink_id", "epoch"),
        Index("ix_epoch_files_discarded", "discarded_at", postgresql_where=text("discarded_at IS NOT NULL")),
        Index("ix_epoch_files_deleting", "deleting_at", postgresql_where=text("deleting_at IS NOT NULL")),
    )


class MaintenanceRun(Base):
    """One maintenance run of a sink's table: what it did, or why it failed."""

    __tablename__ = "maintenance_runs"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    sink_id: Mapped[int] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="CASCADE"))
    # 'schedule' (the coordinator's own timing), 'threshold' (a commit took a table past a bound: SNAPSHOT_MAX_COUNT,
    # or small files to compact) or 'operator' (the admin API's run-now).
    trigger: Mapped[MaintenanceTrigger] = mapped_column(TextEnum(MaintenanceTrigger))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    outcome: Mapped[MaintenanceOutcome] = mapped_column(
        TextEnum(MaintenanceOutcome), server_default=MaintenanceOutcome.RUNNING.value
    )
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    snapshots_expired: Mapped[int] = mapped_column(Integer, server_default="0")
    expired_files_deleted: Mapped[int] = mapped_column(Integer, server_default="0")
    files_compacted: Mapped[int] = mapped_column(Integer, server_default="0")
    files_written: Mapped[int] = mapped_column(Integer, server_default="0")
    bytes_rewritten: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Position delete files merged into fewer (a keyed table's: no data file rewritten for them).
    delete_files_merged: Mapped[int] = mapped_column(Integer, server_default="0")
    swept: Mapped[bool] = mapped_column(Boolean, server_default="false")
    orphans_deleted: Mapped[int] = mapped_column(Integer, server_default="0")

    __table_args__ = (
        CheckConstraint("trigger IN ('schedule', 'threshold', 'operator')", name="maintenance_trigger_known"),
        CheckConstraint("outcome IN ('running', 'ok', 'failed')", name="maintenance_outcome_known"),
        Index("ix_maintenance_runs_sink_started", "sink_id", "started_at"),
    )


class EpochPart(Base):
    """One writer's part of a multi-writer epoch, kept until every writer of the epoch sent its own."""

    __tablename__ = "epoch_parts"

    sink_id: Mapped[int] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    writer_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    writer_term: Mapped[int] = mapped_column(BigInteger)
    # The part's pre-commit record (precommit_metadata's encoding; its table is the sink's).
    metadata_: Mapped[bytes] = mapped_column("metadata", LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ConsoleSignOut(Base):
    """A console session its operator signed out of: its cookie is refused until it would have expired anyway."""

    __tablename__ = "console_sign_outs"

    session_id: Mapped[str] = mapped_column(Text, primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class KeyIndexTable(Base):
    """The key index of one keyed table (its UUID), shared by every sink that writes it: the snapshot whose live rows
    it holds (coordinator_service.log.key_index)."""

    __tablename__ = "key_index_tables"

    index_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    table_uuid: Mapped[uuid.UUID] = mapped_column(Uuid, unique=True)
    # The table's name when the index was last built (for operators: the UUID is what identifies the table).
    table_identifier: Mapped[str] = mapped_column(Text)
    # The snapshot whose live rows the index holds; NULL: the table had no snapshot.
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The key's columns and their Iceberg types, in order, as the index's keys were encoded for.
    key_columns: Mapped[list[str]] = mapped_column(ARRAY(Text))
    key_types: Mapped[list[str]] = mapped_column(ARRAY(Text))
    rows: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # When it was last built from the table's live rows; NULL: never, or taken as wrong since (rebuilt at next use).
    built_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class KeyIndexFile(Base):
    """A data file the key index names: its number in the index, its path, and its manifest description."""

    __tablename__ = "key_index_files"

    index_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("key_index_tables.index_id", ondelete="CASCADE"), primary_key=True
    )
    file_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    # The partition type of its description is its spec's under this schema (a promoted column widens it).
    spec_id: Mapped[int] = mapped_column(Integer)
    schema_id: Mapped[int] = mapped_column(Integer)
    # pyiceberg's Avro encoding of the manifest entry's data file (coordinator_service.tables.data_file_codec).
    data_file: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (UniqueConstraint("index_id", "path", name="key_index_files_index_id_path_key"),)


class KeyIndexRow(Base):
    """A live row of an indexed table: its key's canonical bytes (coordinator_service.tables.key_encoding) and where
    it is (its file's number times 2**32 plus its position in the file). No foreign key to key_index_files: see
    migration 0015."""

    __tablename__ = "key_index"

    index_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[bytes] = mapped_column(LargeBinary)
    file_row: Mapped[int] = mapped_column(BigInteger, primary_key=True)

    __table_args__ = (Index("ix_key_index_index_id_key", "index_id", "key"),)


class VerificationRecord(Base):
    """Where verification of one of a sink's tables stands (coordinator_service.engine.verification): the newest
    snapshot, the sink's newest epoch and the sink's end offsets it proved (an incremental verification starts
    there; a failed one does not move them), and the last verification's outcome, faults and notes."""

    __tablename__ = "sink_verifications"

    sink_id: Mapped[int] = mapped_column(Integer, ForeignKey("sinks.id", ondelete="CASCADE"), primary_key=True)
    table_identifier: Mapped[str] = mapped_column(Text, primary_key=True)
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    verified_epoch: Mapped[int] = mapped_column(BigInteger)
    # {"topic": {"partition": offset}}, as kafka.end-offsets spells them.
    end_offsets: Mapped[dict[str, dict[str, int]]] = mapped_column(JSONB)
    outcome: Mapped[str] = mapped_column(Text)
    # The last verification's: [{"kind", "epoch", "detail"}], and its notes (what it could not prove).
    faults: Mapped[list[dict[str, object]]] = mapped_column(JSONB)
    notes: Mapped[list[str]] = mapped_column(JSONB)
    deep: Mapped[bool] = mapped_column(Boolean)
    kafka: Mapped[bool] = mapped_column(Boolean)
    checked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    __table_args__ = (CheckConstraint("outcome IN ('ok', 'failed')", name="verification_outcome_known"),)
