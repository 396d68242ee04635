"""The keyed commit path's place (issue 29): a keyed sink's epochs are committed as row deltas, never appended.
refuse_keyed_epochs is the one place the committer calls it; until it is built, such epochs wait PENDING."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from coordinator_service.log.models import EpochRecord, Sink
from coordinator_service.log.precommit_metadata import PreCommitMetadata

log = structlog.get_logger(__name__)


class KeyedCommitNotBuilt(Exception):
    """Epochs of a keyed sink (an upsert or change stream) wait for the keyed commit path, which this release does not
    have: appending their rows would put a key in the table twice."""


def refuse_keyed_epochs(sink: Sink, pending: Sequence[EpochRecord], decoded: Sequence[PreCommitMetadata]) -> None:
    """The one place the keyed commit path goes (issue 29, docs/architecture.md "Row mutations: position deletes
    resolved at commit"): every epoch of a keyed sink with files, and every epoch with key files, must be committed
    as a row delta per table (tables.row_deltas.commit_row_delta: its data files, and its key files' keys resolved
    to position deletes), never appended. Until that path is built, such a pass raises KeyedCommitNotBuilt: the
    committer is stuck (the admin API and the metrics say so) and the epochs stay PENDING, in the log, for a release
    that commits them. An empty epoch changes no row and is committed as ever."""
    keyed = [
        row.epoch
        for row, metadata in zip(pending, decoded, strict=True)
        if metadata.key_files or (sink.key_columns and metadata.data_files)
    ]
    if keyed:
        raise KeyedCommitNotBuilt(
            f"the keyed commit path is not built in this release: epochs {keyed[:5]} of keyed sink {sink.name} stay "
            "PENDING (an append would put keys in the table twice); upgrade the coordinator, then resume the sink"
        )
