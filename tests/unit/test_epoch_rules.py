"""The protocol's rules on rows, without a database: writer terms, repeated pre-commits, checkpoint ranges."""

from __future__ import annotations

import pytest

from coordinator_service.contract.errors import EpochAborted, FailedPrecondition, Fenced
from coordinator_service.contract.views import EpochStatus, PreCommitOutcome, PreCommitResult
from coordinator_service.engine.writer_requests import PreCommitRequest, answer_if_repeated
from coordinator_service.log import precommit_metadata
from coordinator_service.log.epoch_rules import check_checkpoint_range, check_term
from coordinator_service.log.models import AbortCause, EpochRecord, Sink
from coordinator_service.log.precommit_metadata import DataFileEntry, PreCommitMetadata

A, B = "file:///w/db/orders/data/a.parquet", "file:///w/db/orders/data/b.parquet"


def epoch_row(
    epoch: int,
    status: EpochStatus,
    files: dict[str, int] | None = None,
    attempt: int = 1,
    cause: AbortCause | None = None,
) -> EpochRecord:
    """A log row; `files` maps each data file to the writer that wrote it (10 records each)."""
    entries = tuple(
        DataFileEntry(path=path, writer_id=writer, record_count=10, file_size_in_bytes=100, spec_id=0)
        for path, writer in (files or {}).items()
    )
    return EpochRecord(
        sink_id=1,
        epoch=epoch,
        status=status,
        attempt=attempt,
        metadata_=precommit_metadata.encode(PreCommitMetadata(table="db.orders", data_files=entries)),
        file_count=len(entries),
        record_count=10 * len(entries),
        reason=f"because of {cause}" if cause else None,
        abort_cause=cause,
    )


def request(*paths: str, writer_id: int = 0) -> PreCommitRequest:
    return PreCommitRequest(sink="orders", epoch=4, writer_term=2, paths=paths, writer_id=writer_id)


def test_a_term_is_current_fenced_or_never_issued() -> None:
    sink = Sink(name="orders", writer_term=3)
    check_term(sink, 3)
    with pytest.raises(Fenced, match="writer term 2 is fenced by term 3"):
        check_term(sink, 2)
    with pytest.raises(FailedPrecondition, match="writer term 4 was never issued"):
        check_term(sink, 4)


@pytest.mark.parametrize(
    ("row", "sent", "answer"),
    [
        pytest.param(
            epoch_row(4, EpochStatus.PENDING, {A: 0, B: 0}, attempt=2),
            request(B, A),
            PreCommitResult(PreCommitOutcome.PERSISTED, attempt=2, record_count=20),
            id="the same files in another order",
        ),
        pytest.param(
            epoch_row(4, EpochStatus.PENDING, {}),
            request(),
            PreCommitResult(PreCommitOutcome.PERSISTED, attempt=1, record_count=0),
            id="an empty epoch again",
        ),
        pytest.param(
            epoch_row(4, EpochStatus.PENDING, {A: 0, B: 1}),
            request(B, writer_id=1),
            PreCommitResult(PreCommitOutcome.PERSISTED, attempt=1, record_count=20),
            id="one writer's part of a multi-writer epoch",
        ),
        pytest.param(
            epoch_row(4, EpochStatus.COMMITTED, {A: 0}, attempt=3),
            request(B),
            PreCommitResult(PreCommitOutcome.ALREADY_COMMITTED, attempt=3, record_count=0),
            id="committed, whatever the files",
        ),
        pytest.param(epoch_row(4, EpochStatus.ABORTED, {A: 0}), request(A), None, id="aborted: a new attempt"),
    ],
)
def test_the_answer_to_a_repeated_precommit(
    row: EpochRecord, sent: PreCommitRequest, answer: PreCommitResult | None
) -> None:
    assert answer_if_repeated(row, sent) == answer


@pytest.mark.parametrize(
    "sent",
    [request(A), request(A, B, "file:///w/db/orders/data/c.parquet"), request(), request(A, writer_id=1)],
    ids=["fewer files", "more files", "no files", "another writer's files"],
)
def test_other_files_for_a_pending_epoch_are_a_conflict(sent: PreCommitRequest) -> None:
    with pytest.raises(FailedPrecondition, match="already pre-committed with other data files"):
        answer_if_repeated(epoch_row(4, EpochStatus.PENDING, {A: 0, B: 0}), sent)


def test_a_checkpoint_may_cover_pending_committed_and_operator_aborted_epochs() -> None:
    rows = [
        epoch_row(3, EpochStatus.COMMITTED),
        epoch_row(4, EpochStatus.PENDING),
        epoch_row(5, EpochStatus.ABORTED, cause=AbortCause.OPERATOR),
    ]
    check_checkpoint_range("orders", rows, recorded=2, checkpoint=5)
    check_checkpoint_range("orders", [], recorded=5, checkpoint=5)  # the same checkpoint again


@pytest.mark.parametrize("cause", [AbortCause.RECOVERY, AbortCause.RESET])
def test_a_checkpoint_over_an_epoch_aborted_by_the_coordinator_is_refused(cause: AbortCause) -> None:
    rows = [epoch_row(3, EpochStatus.PENDING), epoch_row(4, EpochStatus.ABORTED, cause=cause)]
    with pytest.raises(EpochAborted, match=f"covers epoch 4, which was aborted \\(because of {cause}\\)"):
        check_checkpoint_range("orders", rows, recorded=2, checkpoint=4)


def test_a_checkpoint_over_epochs_never_precommitted_names_the_first_ten() -> None:
    with pytest.raises(FailedPrecondition, match=r"never pre-committed \(4\)"):
        check_checkpoint_range("orders", [epoch_row(3, EpochStatus.PENDING)], recorded=2, checkpoint=4)
    # A range of 2**63 epochs is named by its first ten, not walked.
    with pytest.raises(FailedPrecondition, match=r"never pre-committed \(0, 1, 2, 3, 4, 5, 6, 7, 8, 9 \.\.\.\)"):
        check_checkpoint_range("orders", [], recorded=-1, checkpoint=2**63 - 1)
