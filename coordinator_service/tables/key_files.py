"""A keyed sink's key files at pre-commit: the keys an epoch touched in a table, checked like its data files.

A key file (PreCommit's `key_files`) is a Parquet file the writer wrote beside the epoch's data files, under the
table's data directory, holding one row per key the epoch touched (upserted or deleted) in exactly the columns of the
table's key (its identifier fields), required and of types the key's columns take. It is checked as a data file is
(the same place, reached through no link; its footer sent or read; its existence, size and age on storage), and its
rows are counted from the footer; it is never appended to the table: the commit resolves its keys to the positions
of their live rows (docs/architecture.md, "Row mutations: position deletes resolved at commit").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.table import Table

from coordinator_service.contract.errors import InvalidArgument, quote
from coordinator_service.log.precommit_metadata import KeyFileEntry
from coordinator_service.tables.file_paths import check_inside_location
from coordinator_service.tables.key_resolution import key_columns, key_schema
from coordinator_service.tables.precommit_files import CheckedFile, FileFacts
from coordinator_service.tables.pyiceberg_internals import check_file_schema
from coordinator_service.tables.schema_fit import flat_misfit

if TYPE_CHECKING:
    from coordinator_service.tables.iceberg import IcebergGateway

SUBJECT = "key file"


@dataclass(frozen=True)
class DescribedKeyFiles:
    """A pre-commit's key files of one table, checked, and when the oldest was written (Unix seconds), as
    DescribedFiles says of data files."""

    entries: list[KeyFileEntry]
    written_at: float | None


def read_key_files(
    tables: IcebergGateway,
    identifier: str,
    uris: Sequence[str],
    writer_id: int,
    facts: Mapping[str, FileFacts],
    directory: str = "",
) -> DescribedKeyFiles:
    """Check the key files (canonical URIs) of a pre-commit for table `identifier` and describe them. Raises
    InvalidArgument naming the first bad file, or when the table has no key. A cached table may lag behind the
    catalog: a file refused on it is tried once more on the table freshly loaded. Blocking."""
    table, from_cache = tables.cached(identifier)
    try:
        return _described(tables, table, uris, writer_id, facts, directory)
    except InvalidArgument:
        if not from_cache:
            raise
    return _described(tables, tables.load(identifier), uris, writer_id, facts, directory)


def _described(
    tables: IcebergGateway,
    table: Table,
    uris: Sequence[str],
    writer_id: int,
    facts: Mapping[str, FileFacts],
    directory: str,
) -> DescribedKeyFiles:
    name = ".".join(table.name())
    try:
        names = key_columns(table.schema())
    except ValueError:
        raise InvalidArgument(
            f"table {quote(name)} has no key (identifier fields): key files are for the keyed tables of upsert and "
            "change streams"
        ) from None
    data = table.location_provider().data_path
    for uri in uris:
        check_inside_location(uri, data, subject=SUBJECT, within="the table's data directory")
    if directory:
        check_inside_location(directory, str(table.location()), subject="files_directory")
    checked_at = time.time()
    files = tables.file_checks.check(table.io, uris, facts, directory, subject=SUBJECT)
    for file in files:
        _check_columns(table, name, names, file)
    return DescribedKeyFiles(
        entries=[KeyFileEntry(file.path, writer_id, file.footer.num_rows, file.size) for file in files],
        written_at=min((file.written_at(checked_at) for file in files), default=None),
    )


def _check_columns(table: Table, name: str, names: Sequence[str], file: CheckedFile) -> None:
    """The file holds exactly the key's columns, each of a type the key's column takes and required."""
    schema = file.footer.schema.to_arrow_schema()
    if sorted(schema.names) != sorted(names):
        raise InvalidArgument(
            f"{SUBJECT} {quote(file.path)} holds the columns {quote(', '.join(schema.names))}: a key file of table "
            f"{quote(name)} holds exactly its key's, {quote(', '.join(names))}"
        )
    try:
        check_file_schema(key_schema(table.schema()), schema, format_version=table.format_version)
    except ValueError as error:
        misfit = flat_misfit(str(error), "the file")
        raise InvalidArgument(
            f"{SUBJECT} {quote(file.path)} does not fit the key of table {quote(name)}: {misfit}"
        ) from None
