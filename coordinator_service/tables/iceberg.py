"""Everything the coordinator does to Iceberg tables, through pyiceberg.

The gateway: tables loaded and remembered, created and evolved, pre-commit
metadata from Parquet footers (data_file_entries.py holds the rules), the
idempotent marker-carrying append (markers.py: what a snapshot says), the
ancestry walk that finds what a sink already committed, and the fence. Where a
file may lie is file_paths.py; whether a schema fits, schema_fit.py. All
functions are blocking: the engine runs them in worker threads (catalog_calls).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import structlog
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.typedef import EMPTY_DICT

from coordinator_service.contract.markers import (
    FENCE_REASON,
    FENCE_SINK,
    FENCE_SINK_ID,
    MARKER_COMMIT_ID,
    MARKER_EPOCH,
    Marker,
    SinkIdentity,
    snapshot_properties,
)
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables import key_files, table_origin
from coordinator_service.tables.data_file_entries import entry_data_file
from coordinator_service.tables.file_descriptions import FileDescriptions
from coordinator_service.tables.format import TableIdentity
from coordinator_service.tables.key_files import DescribedKeyFiles
from coordinator_service.tables.precommit_files import FileFacts
from coordinator_service.tables.pyiceberg_internals import MetadataOnceTransaction, coordinator_transaction

log = structlog.get_logger(__name__)


class IcebergGateway(FileDescriptions):
    """The Iceberg side of the commit protocol, over one pyiceberg catalog (named apart from pyiceberg's own
    `IcebergTables`, the SQL catalog's table model).

    Table metadata is cached per table for `cache_seconds` (0: no cache), and replaced by the
    result of every commit this process makes. Users of a cached table must tolerate staleness:
    the pre-commit validates again on a fresh table before it refuses a file, and the committer's
    append asserts the branch head it walked, so a stale base fails the commit instead of
    appending twice (see docs/architecture.md, "The table-metadata cache").
    """

    def exists(self, identifier: str) -> bool:
        return bool(self.catalog.table_exists(identifier))

    def drop(self, identifier: str) -> None:
        self.catalog.drop_table(identifier)
        self.forget(identifier)

    def identity(self, table: Table) -> TableIdentity:
        return TableIdentity(table.metadata.table_uuid, str(table.location()))

    def snapshot_count(self, table: Table) -> int:
        return len(table.metadata.snapshots)

    def require_takeable(self, identifier: str) -> None:
        table_origin.require_takeable(self, identifier)

    def read_key_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        facts: Mapping[str, FileFacts],
        directory: str = "",
    ) -> DescribedKeyFiles:
        return key_files.read_key_files(self, identifier, uris, writer_id, facts, directory)

    def sink_markers(
        self, identifier: str, sink: SinkIdentity, down_to_epoch: int, table: Table | None = None
    ) -> list[Marker]:
        """The sink's own markers on the current branch, oldest first, back to the first below `down_to_epoch`,
        or to a marker of its name that is not its own (an earlier incarnation or generation, whose epoch
        numbers mean nothing now): the walk stops there.

        On `table` when given (the committer's cached table), else on the table loaded now."""
        table = table if table is not None else self.load(identifier)
        markers: list[Marker] = []
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            properties = snapshot_properties(snapshot)
            owned = sink.owns(properties)
            if owned is None:
                continue
            if not owned:
                break
            epoch = int(properties[MARKER_EPOCH])
            markers.append(Marker(epoch=epoch, snapshot_id=snapshot.snapshot_id))
            if epoch < down_to_epoch:
                break
        markers.reverse()
        return markers

    def append(
        self,
        identifier: str,
        sink: SinkIdentity,
        epoch: int,
        commit_id: str,
        entries: Sequence[DataFileEntry],
        table: Table | None = None,
        properties: Mapping[str, str] = EMPTY_DICT,
        summary: Mapping[str, str] = EMPTY_DICT,
    ) -> int:
        """Append the entries as one snapshot carrying the sink's marker and `summary`; return its id.

        `properties` are table properties the commit makes sure of (maintenance: manifest merging, old
        metadata files removed); with manifest merging on, the append merges the table's manifests once
        enough have accumulated (pyiceberg's merge append), else it is a fast append.
        pyiceberg's own retry of a conflicting commit would re-apply the append
        without looking at the markers, so it is turned off here: the caller's
        retry re-runs the ancestry check first. Given `table` (the one whose
        ancestry the caller walked), the append builds on it, and the commit
        asserts that the branch head is still that table's: a stale table fails
        with CommitFailedException rather than append on an unseen history.
        The committed table replaces the cached one; any failure drops it.
        """
        try:
            snapshot_id, committed = self._append(
                identifier, {**summary, **sink.marker(epoch, commit_id)}, entries, table, properties
            )
        except BaseException:
            self.forget(identifier)
            raise
        self.remember(identifier, committed)
        return snapshot_id

    def _append(
        self,
        identifier: str,
        markers: dict[str, str],
        entries: Sequence[DataFileEntry],
        table: Table | None,
        properties: Mapping[str, str],
    ) -> tuple[int, Table]:
        # A copy: the cached table object is shared with other threads and must not change under them.
        table = without_retries(
            table if table is not None else self.catalog.load_table(parse_table_identifier(identifier))
        )
        transaction = commit_transaction(table, properties)
        update = transaction.update_snapshot(snapshot_properties=markers)
        merge = transaction.table_metadata.properties.get(TableProperties.MANIFEST_MERGE_ENABLED) == "true"
        with update.merge_append() if merge else update.fast_append() as append:
            for entry in entries:
                append.append_data_file(entry_data_file(table.metadata, entry))
        committed = transaction.commit_transaction()
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        assert snapshot_properties(snapshot).get(MARKER_COMMIT_ID) == markers[MARKER_COMMIT_ID]
        return int(snapshot.snapshot_id), committed

    def fence(self, identifier: str, sink: SinkIdentity, reason: str) -> int:
        """Commit a snapshot that changes no row and carries the sink's fence (no marker: marker walks pass over it),
        on the table loaded now; return its id. Any append built on the branch head before it fails its
        requirement instead of landing: an operator's abort or reset fences the sink's tables under the commit
        lock before it aborts anything whose files may then be deleted (docs/architecture.md, "The fence")."""
        try:
            table = without_retries(self.load(identifier))
            transaction = coordinator_transaction(table)
            fence = {FENCE_SINK: sink.name, FENCE_SINK_ID: sink.incarnation, FENCE_REASON: reason[:500]}
            with transaction.update_snapshot(snapshot_properties=fence).fast_append():
                pass  # no file: the new head is the fence
            committed = transaction.commit_transaction()
        except BaseException:
            self.forget(identifier)
            raise
        self.remember(identifier, committed)
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        return int(snapshot.snapshot_id)


def without_retries(table: Table) -> Table:
    """A copy of the table whose commits pyiceberg does not retry by itself: its retry re-applies the change to
    whatever the table has become, where the coordinator must look again (markers, plans) on a fresh load."""
    table = copy.copy(table)
    table.metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
    )
    return table


def commit_transaction(table: Table, properties: Mapping[str, str]) -> MetadataOnceTransaction:
    """A transaction on the table that makes sure of `properties` (those a sink's commits keep: maintenance) and of a
    name mapping (files written by name, not by field id, read right): every commit of files opens one."""
    transaction = coordinator_transaction(table)
    wanted = dict(properties)
    if table.metadata.name_mapping() is None:
        wanted[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
    changed = {key: value for key, value in wanted.items() if table.metadata.properties.get(key) != value}
    if changed:
        transaction.set_properties(changed)
    return transaction
