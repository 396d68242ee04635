"""Committing row mutations to a keyed table: the epochs' new rows and the position deletes of the rows they replace
or delete, as one snapshot (Iceberg's row delta), resolved against the branch head it commits on.

Blocking, like the rest of this package. The commit asserts the head it resolved against: when the table moved
(another commit, maintenance), the catalog refuses it (CommitFailedException; CatalogConflict through in_catalog)
and nothing changes; the caller loads the table again and resolves again. pyiceberg's own retry would re-apply the
same positions to a head they were never resolved against, so it is off. Delete files written for a refused commit
are referenced by nothing and stay on storage for the orphan sweep, the one place that proves a file unreferenced
before it deletes it. No equality delete file is ever written (docs/architecture.md, "Row mutations: position
deletes resolved at commit").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.typedef import EMPTY_DICT

from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables.data_file_entries import entry_data_file
from coordinator_service.tables.iceberg import commit_transaction, without_retries
from coordinator_service.tables.key_resolution import EpochRows, resolve_epochs
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


@dataclass(frozen=True)
class RowDeltaCommit:
    """A committed row delta: the table as committed, its snapshot, the head it was resolved against, and what it
    holds."""

    table: Table
    snapshot_id: int
    base_snapshot_id: int | None
    data_files: int
    delete_files: tuple[str, ...]
    deleted_rows: int
    keys_resolved: int


def commit_row_delta(
    table: Table,
    changes: Sequence[EpochChange],
    snapshot_properties: Mapping[str, str],
    table_properties: Mapping[str, str] = EMPTY_DICT,
) -> RowDeltaCommit:
    """Commit `changes` (epochs, oldest first) on `table` as loaded, as one snapshot carrying `snapshot_properties`
    in its summary (the coordinator's markers): each epoch's rows added, and position deletes for the live rows of
    every key it touched, each epoch resolved after the one before (a key an earlier epoch of the same snapshot
    wrote is deleted in that epoch's data file). `table_properties` are set in the same commit.

    The operation is Java's row delta's: `overwrite` when rows are added and deleted, `append` when only added,
    `delete` when only deleted.

    Raises:
        CommitFailedException (CatalogConflict through in_catalog): the branch head is no longer the one resolved
            against; nothing changed: load the table and commit again.
        ValueError: the table is not a keyed format v2 table; an epoch's rows hold a key twice (DuplicateKeys).
    """
    if table.format_version != KEYED_FORMAT_VERSION:
        raise ValueError(
            f"table {'.'.join(table.name())} is format v{table.format_version}: row mutations are committed as "
            f"position delete files, which need format v{KEYED_FORMAT_VERSION}"
        )
    table = without_retries(table)
    epochs = [
        EpochRows([entry_data_file(table.metadata, entry) for entry in change.entries], change.touched_keys)
        for change in changes
    ]
    resolved = resolve_epochs(table, epochs)
    delete_files = write_position_deletes(table, resolved.positions, resolved.data_files)
    data_files = [data_file for epoch in epochs for data_file in epoch.data_files]
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
    )


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
