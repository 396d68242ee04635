"""The pre-commit record stored in pending_sink_state.metadata, and its versioned encoding.

Encoding version 1 is UTF-8 JSON:

    {"encoding": "sink-coordinator/precommit", "version": 1,
     "properties": {"<key>": "<value>", ...},
     "tables": [{"table": "<namespace.table>",
                 "data_files": [{"path": str, "writer_id": int, "file_format": "PARQUET",
                                 "record_count": int, "file_size_in_bytes": int, "spec_id": int,
                                 "partition": [<base64 or null>, ...],
                                 "column_sizes": {"<field id>": int}, "value_counts": {...},
                                 "null_value_counts": {...}, "nan_value_counts": {...},
                                 "lower_bounds": {"<field id>": <base64>}, "upper_bounds": {...},
                                 "split_offsets": [int, ...] or null}]}]}

Partition values and bounds are Iceberg's single-value binary serialization
(base64 in JSON), so the record carries every byte the Iceberg manifest entry
needs and the commit does not read the data files again. A reader refuses a
version it does not know rather than guess.

"tables" lists the sink's own table first (with its files, possibly none), then
the other tables the epoch has files in (fan-out), by name, each once. Releases
before fan-out read only records of one table, and refuse the others with a
message rather than lose their files.

Encoding version 2 is version 1 with the key files of a keyed sink's epoch (an
upsert or change stream) beside each table's data files:

     "tables": [{"table": ..., "data_files": [...],
                 "key_files": [{"path": str, "writer_id": int, "file_size_in_bytes": int,
                                "key_count": int}]}]

A key file is a Parquet file under the table's data directory holding exactly
the key columns of the table's key (its identifier fields), one row per key the
epoch touched, upserted or deleted; it is never appended to the table: the
commit resolves its keys to the positions of their live rows. A table with key
files and no data file (an epoch that only deleted) is listed too. Version 2 is
written only for an epoch with key files, version 1 for every other, so that a
release that reads only version 1 still reads the records of append streams
(and refuses, by its version, a keyed epoch it would append as plain rows).
Both versions are read.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

ENCODING = "sink-coordinator/precommit"
# The version of a record without key files; KEYED_VERSION of one with key files.
VERSION = 1
KEYED_VERSION = 2
VERSIONS = (VERSION, KEYED_VERSION)


@dataclass(frozen=True)
class DataFileEntry:
    """Everything Iceberg's manifest needs about one data file, built from its Parquet footer."""

    path: str
    writer_id: int
    record_count: int
    file_size_in_bytes: int
    spec_id: int
    partition: tuple[bytes | None, ...] = ()
    column_sizes: dict[int, int] = field(default_factory=dict)
    value_counts: dict[int, int] = field(default_factory=dict)
    null_value_counts: dict[int, int] = field(default_factory=dict)
    nan_value_counts: dict[int, int] = field(default_factory=dict)
    lower_bounds: dict[int, bytes] = field(default_factory=dict)
    upper_bounds: dict[int, bytes] = field(default_factory=dict)
    split_offsets: tuple[int, ...] | None = None
    # The table the file belongs to (fan-out); "" for the sink's own table (PreCommitMetadata.table), which
    # is never named here otherwise.
    table: str = ""


@dataclass(frozen=True)
class KeyFileEntry:
    """A key file of a keyed sink's epoch: the keys it touched in one table, as a Parquet file of the table's key
    columns (never appended: the commit resolves its keys to the positions of their live rows)."""

    path: str
    writer_id: int
    key_count: int
    file_size_in_bytes: int
    # The table whose keys it holds (fan-out); "" for the sink's own table, as for DataFileEntry.
    table: str = ""


@dataclass(frozen=True)
class PreCommitMetadata:
    """One epoch's pre-commit: the data files of its tables (`table`: the sink's own), a keyed sink's key files, and
    the writer's properties."""

    table: str
    data_files: tuple[DataFileEntry, ...]
    properties: dict[str, str] = field(default_factory=dict)
    key_files: tuple[KeyFileEntry, ...] = ()

    def table_of(self, entry: DataFileEntry | KeyFileEntry) -> str:
        return entry.table or self.table

    def by_table(self) -> dict[str, list[DataFileEntry]]:
        """The data files by table: the sink's own table first (even without files), then the others by name."""
        tables: dict[str, list[DataFileEntry]] = {self.table: []}
        for entry in sorted(self.data_files, key=lambda entry: entry.table):
            tables.setdefault(self.table_of(entry), []).append(entry)
        return tables

    def tables_with_files(self) -> set[str]:
        """The tables the epoch changes: those with data files, and those with key files (an epoch of a keyed sink
        that only deleted has key files alone, and its commit a snapshot of delete files alone)."""
        return {table for table, entries in self.by_table().items() if entries} | set(self.key_files_by_table())

    def key_files_by_table(self) -> dict[str, list[KeyFileEntry]]:
        """The key files by table, the sink's own first, then the others by name (only tables with key files)."""
        tables: dict[str, list[KeyFileEntry]] = {}
        for entry in sorted(self.key_files, key=lambda entry: (entry.table != "", entry.table)):
            tables.setdefault(self.table_of(entry), []).append(entry)
        return tables

    @property
    def paths(self) -> frozenset[str]:
        """Every path the epoch holds: its data files and its key files (the log claims both)."""
        return frozenset(entry.path for entry in self.data_files) | {entry.path for entry in self.key_files}

    @property
    def record_count(self) -> int:
        return sum(entry.record_count for entry in self.data_files)

    def paths_of_writer(self, writer_id: int) -> frozenset[str]:
        data_files = {entry.path for entry in self.data_files if entry.writer_id == writer_id}
        return frozenset(data_files | {entry.path for entry in self.key_files if entry.writer_id == writer_id})


class MetadataDecodeError(ValueError):
    pass


def encode(metadata: PreCommitMetadata) -> bytes:
    """Version 1, or version 2 when the epoch has key files (the module's docstring)."""
    data_files = metadata.by_table()
    key_files = metadata.key_files_by_table()
    tables = [metadata.table, *sorted((set(data_files) | set(key_files)) - {metadata.table})]
    document = {
        "encoding": ENCODING,
        "version": KEYED_VERSION if metadata.key_files else VERSION,
        "properties": metadata.properties,
        "tables": [
            {
                "table": table,
                "data_files": [_entry_to_json(entry) for entry in data_files.get(table, [])],
                **(
                    {"key_files": [_key_file_to_json(entry) for entry in key_files.get(table, [])]}
                    if metadata.key_files
                    else {}
                ),
            }
            for table in tables
        ],
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> PreCommitMetadata:
    """Version 1 or 2; MetadataDecodeError for anything else, or a record missing what its version holds."""
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise MetadataDecodeError(f"pre-commit metadata is not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("encoding") != ENCODING:
        raise MetadataDecodeError("pre-commit metadata has no sink-coordinator encoding marker")
    version = document.get("version")
    if version not in VERSIONS:
        raise MetadataDecodeError(
            f"pre-commit metadata version {version!r} is unknown to this release "
            f"(it reads versions {', '.join(map(str, VERSIONS))}): upgrade sink-coordinator"
        )
    try:
        return _decoded(document, keyed=version == KEYED_VERSION)
    except MetadataDecodeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise MetadataDecodeError(f"pre-commit metadata version {version} is malformed: {error!r}") from error


def _decoded(document: dict[str, Any], keyed: bool) -> PreCommitMetadata:
    tables = document["tables"]
    if not tables:
        raise MetadataDecodeError("pre-commit metadata names no table")
    own = tables[0]["table"]
    key_files = tuple(
        _key_file_from_json(item, "" if index == 0 else each["table"])
        for index, each in enumerate(tables)
        for item in (each["key_files"] if keyed else [])
    )
    if keyed and not key_files:
        raise MetadataDecodeError(
            f"pre-commit metadata version {KEYED_VERSION} holds no key file: it is written only with some"
        )
    return PreCommitMetadata(
        table=own,
        data_files=tuple(
            _entry_from_json(item, "" if index == 0 else each["table"])
            for index, each in enumerate(tables)
            for item in each["data_files"]
        ),
        properties=dict(document.get("properties", {})),
        key_files=key_files,
    )


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(value: str) -> bytes:
    return base64.b64decode(value.encode("ascii"), validate=True)


def _entry_to_json(entry: DataFileEntry) -> dict[str, Any]:
    return {
        "path": entry.path,
        "writer_id": entry.writer_id,
        "file_format": "PARQUET",
        "record_count": entry.record_count,
        "file_size_in_bytes": entry.file_size_in_bytes,
        "spec_id": entry.spec_id,
        "partition": [None if value is None else _b64(value) for value in entry.partition],
        "column_sizes": {str(k): v for k, v in entry.column_sizes.items()},
        "value_counts": {str(k): v for k, v in entry.value_counts.items()},
        "null_value_counts": {str(k): v for k, v in entry.null_value_counts.items()},
        "nan_value_counts": {str(k): v for k, v in entry.nan_value_counts.items()},
        "lower_bounds": {str(k): _b64(v) for k, v in entry.lower_bounds.items()},
        "upper_bounds": {str(k): _b64(v) for k, v in entry.upper_bounds.items()},
        "split_offsets": None if entry.split_offsets is None else list(entry.split_offsets),
    }


def _entry_from_json(item: dict[str, Any], table: str) -> DataFileEntry:
    if item.get("file_format") != "PARQUET":
        raise MetadataDecodeError(f"data file format {item.get('file_format')!r} is not PARQUET")
    offsets = item.get("split_offsets")
    return DataFileEntry(
        path=item["path"],
        writer_id=int(item["writer_id"]),
        record_count=int(item["record_count"]),
        file_size_in_bytes=int(item["file_size_in_bytes"]),
        spec_id=int(item["spec_id"]),
        partition=tuple(None if value is None else _unb64(value) for value in item["partition"]),
        column_sizes={int(k): int(v) for k, v in item["column_sizes"].items()},
        value_counts={int(k): int(v) for k, v in item["value_counts"].items()},
        null_value_counts={int(k): int(v) for k, v in item["null_value_counts"].items()},
        nan_value_counts={int(k): int(v) for k, v in item["nan_value_counts"].items()},
        lower_bounds={int(k): _unb64(v) for k, v in item["lower_bounds"].items()},
        upper_bounds={int(k): _unb64(v) for k, v in item["upper_bounds"].items()},
        split_offsets=None if offsets is None else tuple(int(offset) for offset in offsets),
        table=table,
    )


def _key_file_to_json(entry: KeyFileEntry) -> dict[str, Any]:
    return {
        "path": entry.path,
        "writer_id": entry.writer_id,
        "file_size_in_bytes": entry.file_size_in_bytes,
        "key_count": entry.key_count,
    }


def _key_file_from_json(item: dict[str, Any], table: str) -> KeyFileEntry:
    return KeyFileEntry(
        path=item["path"],
        writer_id=int(item["writer_id"]),
        key_count=int(item["key_count"]),
        file_size_in_bytes=int(item["file_size_in_bytes"]),
        table=table,
    )
