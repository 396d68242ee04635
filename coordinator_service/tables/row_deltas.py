"""Committing row mutations to a keyed table: the epochs' new rows and the position deletes of the rows they replace
or delete, as one snapshot (Iceberg's row delta), resolved against the branch head it commits on.

Blocking, like the rest of this package. A commit is planned (plan_row_delta: the epochs' own files read, the keys
they touched), resolved against where those keys live (key_resolution.live_rows, a scan; or the key index's same
answer, coordinator_service.engine.key_index) and committed (commit_planned_row_delta); commit_row_delta does all
three with the scan. The commit asserts the head it resolved against: when the table moved
(another commit, maintenance), the catalog refuses it (CommitFailedException; CatalogConflict through in_catalog)
and nothing changes; the caller loads the table again and resolves again. pyiceberg's own retry would re-apply the
same positions to a head they were never resolved against, so it is off. Delete files written for a refused commit
are referenced by nothing and stay on storage for the orphan sweep, the one place that proves a file unreferenced
before it deletes it. No equality delete file is ever written (docs/architecture.md, "Row mutations: position
deletes resolved at commit").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.typedef import EMPTY_DICT

from coordinator_service.log.precommit_metadata import DataFileEntry, KeyFileEntry
from coordinator_service.tables.data_file_entries import entry_data_file
from coordinator_service.tables.iceberg import commit_transaction, without_retries
from coordinator_service.tables.key_resolution import (
    EpochKeys,
    EpochRows,
    Key,
    KeysUnresolvable,
    LiveRows,
    RowPosition,
    epoch_keys,
    key_schema,
    live_rows,
    resolve_epochs,
)
from coordinator_service.tables.keyed_tables import KEYED_FORMAT_VERSION
from coordinator_service.tables.position_deletes import write_position_deletes
from coordinator_service.tables.pyiceberg_internals import RowDelta


@dataclass(frozen=True)
class EpochChange:
    """One epoch's change to a keyed table, as the log holds it: the pre-commit entries of the data files of its rows
    (the last row of each key it upserted) and every key it touched, upserted or deleted (a table of the key
    columns, by name)."""

    entries: Sequence[DataFileEntry]
    touched_keys: pa.Table


def epoch_change(table: Table, entries: Sequence[DataFileEntry], key_files: Sequence[KeyFileEntry]) -> EpochChange:
    """One epoch's change to `table` from its pre-commit record: its data files' entries, and the keys its key files
    hold (each read: O(epoch); an epoch without key files touched only the keys of its rows)."""
    key_arrow = key_schema(table.schema()).as_arrow()
    touched = [key_arrow.empty_table()]
    for key_file in key_files:
        with table.io.new_input(key_file.path).open() as stream:
            touched.append(pq.read_table(stream, columns=key_arrow.names))
    # A writer's key file may hold a key column in a narrower type than the table's (an int of a long column).
    return EpochChange(entries, pa.concat_tables(touched, promote_options="permissive"))


@dataclass(frozen=True)
class PlannedRowDelta:
    """A row delta ready to be resolved: the table as loaded (pyiceberg's retries off), the epochs' files as manifest
    entries, and what the epochs do by key (their new rows read: O(epoch)). `keys.keys` is every key whose live rows
    the commit must know."""

    table: Table
    epochs: tuple[EpochRows, ...]
    keys: EpochKeys


@dataclass(frozen=True)
class RowDeltaCommit:
    """A committed row delta: the table as committed, its snapshot, the head it was resolved against, and what it
    holds: the row positions it deleted (data file path -> positions, in the table's files and in its own: every
    live row of every key it touched), the keys it touched, its new data files and their rows' keys and positions
    (what the key index records: coordinator_service.engine.key_index)."""

    table: Table
    snapshot_id: int
    base_snapshot_id: int | None
    data_files: int
    delete_files: tuple[str, ...]
    deleted_rows: int
    keys_resolved: int
    deleted_positions: Mapping[str, Sequence[int]] = field(default_factory=dict)
    touched_keys: frozenset[Key] = frozenset()
    new_data_files: tuple[DataFile, ...] = ()
    new_rows: tuple[tuple[Key, RowPosition], ...] = ()


def plan_row_delta(table: Table, changes: Sequence[EpochChange]) -> PlannedRowDelta:
    """Plan the commit of `changes` (epochs, oldest first) on `table` as loaded: the epochs' data files described for
    a manifest and their rows' keys read (O(epoch): the table's own files are not read).

    Raises:
        KeysUnresolvable: the table is not a keyed format v2 table; an epoch's rows hold a key twice (DuplicateKeys).
    """
    if table.format_version != KEYED_FORMAT_VERSION:
        raise KeysUnresolvable(
            f"table {'.'.join(table.name())} is format v{table.format_version}: row mutations are committed as "
            f"position delete files, which need format v{KEYED_FORMAT_VERSION}"
        )
    table = without_retries(table)
    epochs = tuple(
        EpochRows([entry_data_file(table.metadata, entry) for entry in change.entries], change.touched_keys)
        for change in changes
    )
    return PlannedRowDelta(table, epochs, epoch_keys(table, epochs))


def commit_planned_row_delta(
    planned: PlannedRowDelta,
    live: LiveRows,
    snapshot_properties: Mapping[str, str],
    table_properties: Mapping[str, str] = EMPTY_DICT,
) -> RowDeltaCommit:
    """Commit a planned row delta as one snapshot carrying `snapshot_properties` in its summary (the coordinator's
    markers), given where its keys live among the live rows of `planned.table` (`live`: key_resolution.live_rows of
    `planned.keys.keys`, or the key index's same answer): each epoch's rows added, and position deletes for the live
    rows of every key it touched, each epoch resolved after the one before (a key an earlier epoch of the same
    snapshot wrote is deleted in that epoch's data file). `table_properties` are set in the same commit.

    The operation is Java's row delta's: `overwrite` when rows are added and deleted, `append` when only added,
    `delete` when only deleted.

    Raises:
        CommitFailedException (CatalogConflict through in_catalog): the branch head is no longer the one resolved
            against; nothing changed: load the table and commit again.
    """
    table = planned.table
    resolved = resolve_epochs(table, planned.epochs, planned.keys, live)
    delete_files = write_position_deletes(table, resolved.positions, resolved.data_files)
    data_files = [data_file for epoch in planned.epochs for data_file in epoch.data_files]
    committed = _commit(table, data_files, delete_files, snapshot_properties, table_properties)
    snapshot = committed.current_snapshot()
    assert snapshot is not None
    return RowDeltaCommit(
        table=committed,
        snapshot_id=snapshot.snapshot_id,
        base_snapshot_id=resolved.base_snapshot_id,
        data_files=len(data_files),
        delete_files=tuple(delete_file.file_path for delete_file in delete_files),
        deleted_rows=resolved.deleted_rows,
        keys_resolved=resolved.keys_resolved,
        deleted_positions=resolved.positions,
        touched_keys=frozenset(planned.keys.keys),
        new_data_files=tuple(data_files),
        new_rows=tuple(row for rows in planned.keys.new_rows for row in rows),
    )


def commit_row_delta(
    table: Table,
    changes: Sequence[EpochChange],
    snapshot_properties: Mapping[str, str],
    table_properties: Mapping[str, str] = EMPTY_DICT,
) -> RowDeltaCommit:
    """Commit `changes` (epochs, oldest first) on `table` as loaded, as one snapshot, their keys resolved by scanning
    the table (key_resolution.live_rows): plan_row_delta, then commit_planned_row_delta.

    Raises:
        CommitFailedException (CatalogConflict through in_catalog): the branch head is no longer the one resolved
            against; nothing changed: load the table and commit again.
        KeysUnresolvable: the table is not a keyed format v2 table; an epoch's rows hold a key twice (DuplicateKeys).
    """
    planned = plan_row_delta(table, changes)
    live = live_rows(planned.table, planned.keys.keys)
    return commit_planned_row_delta(planned, live, snapshot_properties, table_properties)


def _commit(
    table: Table,
    data_files: Sequence[DataFile],
    delete_files: Sequence[DataFile],
    snapshot_properties: Mapping[str, str],
    table_properties: Mapping[str, str],
) -> Table:
    transaction = commit_transaction(table, table_properties)
    delta = RowDelta(transaction, table.io, dict(snapshot_properties))
    for data_file in data_files:
        delta.append_data_file(data_file)
    for delete_file in delete_files:
        delta.add_delete_file(delete_file)
    delta.commit()
    return transaction.commit_transaction()
