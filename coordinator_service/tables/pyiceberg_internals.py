"""Every use of pyiceberg's private API, each under a name that says what the coordinator needs from it.

pyiceberg's public API does not offer these (yet): checking a file's schema against a table's without committing,
a schema evolution applied in memory, a partition record's values, one metadata request for a file's size and
modification time, writing data files of a table without appending them, and a `replace` snapshot. Each is pinned
by a test of its own in tests/unit/test_pyiceberg_internals.py, so that an upgrade that moves one fails there, by
name, before anything else; pyproject.toml pins pyiceberg to the minor release they were checked on."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyarrow.fs import FileInfo
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFile, _check_pyarrow_schema_compatible, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, Record


def check_file_schema(table_schema: Schema, file_schema: pa.Schema, format_version: int) -> None:
    """Raise ValueError when files of `file_schema` cannot be appended to a table of `table_schema` (a column the
    table requires that may hold nulls, a type that does not promote): the check pyiceberg's own append makes."""
    _check_pyarrow_schema_compatible(table_schema, file_schema, format_version=format_version)  # type: ignore[arg-type]


def evolved_schema(update: UpdateSchema) -> Schema:
    """The schema `update` would commit, applied in memory only (nothing is committed)."""
    return update._apply()


def partition_values(partition: Record) -> tuple[Any, ...]:
    """A partition record's values in its fields' order."""
    return tuple(partition._data)


def file_info(input_file: PyArrowFile) -> FileInfo:
    """A file's size and modification time in one metadata request (len() asks for the size alone)."""
    return input_file._file_info()


def data_files_of(metadata: TableMetadata, rows: pa.Table, io: FileIO) -> Iterable[DataFile]:
    """Write `rows` as data files of the table (its schema's field ids, its partition spec, its target file size,
    their statistics) without appending them: nothing references them until a commit does."""
    return _dataframe_to_data_files(metadata, rows, io, write_uuid=uuid.uuid4())


class ReplaceFiles(_OverwriteFiles):
    """A snapshot with Iceberg's `replace` operation (no row changed, so incremental readers skip it). pyiceberg
    writes overwrites of files and its summaries do not know `replace`: the summary is computed as for the
    overwrite of the same files (the same figures) and then labelled `replace`."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        summary = super()._summary(snapshot_properties)
        return Summary(Operation.REPLACE, **summary.additional_properties)


def replace_files(
    table: Table, replaced: Sequence[DataFile], written: Sequence[DataFile], marker: dict[str, str]
) -> Table:
    """Commit one `replace` snapshot on `table` as loaded: `replaced` out, `written` in, `marker` in its summary."""
    transaction = table.transaction()
    with ReplaceFiles(
        operation=Operation.OVERWRITE, transaction=transaction, io=table.io, snapshot_properties=marker
    ) as rewrite:
        for data_file in replaced:
            rewrite.delete_data_file(data_file)
        for data_file in written:
            rewrite.append_data_file(data_file)
    return transaction.commit_transaction()
