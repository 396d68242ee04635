"""What a writer asks of the protocol (a pre-commit, a table to ensure) and the rules a request meets on its own,
before any state is read: its bounds, its properties, and whether it repeats a pre-commit already persisted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from coordinator_service.contract.errors import FailedPrecondition, InvalidArgument
from coordinator_service.contract.source_positions import check_positions
from coordinator_service.contract.table_identifiers import check_sink_name
from coordinator_service.contract.views import EpochStatus, PreCommitOutcome, PreCommitResult
from coordinator_service.log import precommit_metadata
from coordinator_service.log.models import EpochRecord
from coordinator_service.tables.precommit_files import FileFacts, check_facts

log = structlog.get_logger(__name__)


MAX_FILES_PER_PRECOMMIT = 100_000


# Tables one EnsureTables call may name.
MAX_TABLES_PER_ENSURE = 1_000


MAX_PROPERTIES_BYTES = 64 * 1024


@dataclass(frozen=True)
class PreCommitRequest:
    sink: str
    epoch: int
    writer_term: int
    paths: tuple[str, ...]
    writer_id: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    evolve_schema: bool = False
    # What the writer sent about some of the files besides their paths (their footers, sizes), by path.
    file_facts: Mapping[str, FileFacts] = field(default_factory=dict)
    # A directory holding every file (the writer's directory of the batch), listed once to check them; or "".
    files_directory: str = ""
    # Fan-out: the table of each file that names one (by path); the others are the sink's own table's.
    file_tables: Mapping[str, str] = field(default_factory=dict)
    # A keyed sink's key files (their facts and tables by path too, in file_facts and file_tables).
    key_paths: tuple[str, ...] = ()

    @property
    def all_paths(self) -> tuple[str, ...]:
        """Every file the pre-commit names: its data files, then its key files."""
        return (*self.paths, *self.key_paths)


@dataclass(frozen=True)
class TableRequest:
    """A table a fan-out writer routes records to (EnsureTables)."""

    table: str
    arrow_schema: bytes = b""
    partition_by: tuple[str, ...] = ()
    key_columns: tuple[str, ...] = ()


def check_precommit_request(request: PreCommitRequest) -> None:
    check_sink_name(request.sink)
    if request.epoch < 0:
        raise InvalidArgument(f"epoch {request.epoch} is negative: Spark batch ids start at 0")
    if request.writer_term < 1:
        raise InvalidArgument(f"writer_term {request.writer_term} is not a term RegisterWriter returns (>= 1)")
    if request.writer_id < 0:
        raise InvalidArgument(f"writer_id {request.writer_id} is negative")
    if len(request.all_paths) > MAX_FILES_PER_PRECOMMIT:
        raise InvalidArgument(
            f"{len(request.all_paths)} data and key files in one pre-commit exceed {MAX_FILES_PER_PRECOMMIT}: write "
            "larger files"
        )
    if sum(len(k) + len(v) for k, v in request.properties.items()) > MAX_PROPERTIES_BYTES:
        raise InvalidArgument(f"pre-commit properties exceed {MAX_PROPERTIES_BYTES} bytes")
    try:
        check_positions(request.properties)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None
    for path, facts in request.file_facts.items():
        check_facts(path, facts)


def answer_if_repeated(row: EpochRecord, request: PreCommitRequest) -> PreCommitResult | None:
    """The answer to a pre-commit that repeats a persisted one, or None if it is not a repeat."""
    if row.status == EpochStatus.COMMITTED:
        return PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=row.attempt, record_count=0)
    if row.status == EpochStatus.ABORTED:
        return None
    recorded = precommit_metadata.decode(row.metadata_)
    if recorded.paths_of_writer(request.writer_id) == frozenset(request.all_paths):
        return PreCommitResult(PreCommitOutcome.PERSISTED, attempt=row.attempt, record_count=row.record_count)
    raise conflicting_precommit(request)


def conflicting_precommit(request: PreCommitRequest) -> FailedPrecondition:
    return FailedPrecondition(
        f"sink {request.sink} epoch {request.epoch} is already pre-committed with other data files by "
        f"writer {request.writer_id} in term {request.writer_term}; an epoch's files cannot change within a term"
    )
