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
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

ENCODING = "sink-coordinator/precommit"
VERSION = 1


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
class PreCommitMetadata:
    """One epoch's pre-commit: the data files of its tables (`table`: the sink's own) and the writer's properties."""

    table: str
    data_files: tuple[DataFileEntry, ...]
    properties: dict[str, str] = field(default_factory=dict)

    def table_of(self, entry: DataFileEntry) -> str:
        return entry.table or self.table

    def by_table(self) -> dict[str, list[DataFileEntry]]:
        """The data files by table: the sink's own table first (even without files), then the others by name."""
        tables: dict[str, list[DataFileEntry]] = {self.table: []}
        for entry in sorted(self.data_files, key=lambda entry: entry.table):
            tables.setdefault(self.table_of(entry), []).append(entry)
        return tables

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(entry.path for entry in self.data_files)

    @property
    def record_count(self) -> int:
        return sum(entry.record_count for entry in self.data_files)

    def paths_of_writer(self, writer_id: int) -> frozenset[str]:
        return frozenset(entry.path for entry in self.data_files if entry.writer_id == writer_id)


class MetadataDecodeError(ValueError):
    pass


def encode(metadata: PreCommitMetadata) -> bytes:
    document = {
        "encoding": ENCODING,
        "version": VERSION,
        "properties": metadata.properties,
        "tables": [
            {"table": table, "data_files": [_entry_to_json(entry) for entry in entries]}
            for table, entries in metadata.by_table().items()
        ],
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> PreCommitMetadata:
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise MetadataDecodeError(f"pre-commit metadata is not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("encoding") != ENCODING:
        raise MetadataDecodeError("pre-commit metadata has no sink-coordinator encoding marker")
    if document.get("version") != VERSION:
        raise MetadataDecodeError(
            f"pre-commit metadata version {document.get('version')!r} is unknown to this release "
            f"(it reads version {VERSION}): upgrade sink-coordinator"
        )
    tables = document["tables"]
    if not tables:
        raise MetadataDecodeError("pre-commit metadata names no table")
    own = tables[0]["table"]
    return PreCommitMetadata(
        table=own,
        data_files=tuple(
            _entry_from_json(item, "" if index == 0 else each["table"])
            for index, each in enumerate(tables)
            for item in each["data_files"]
        ),
        properties=dict(document.get("properties", {})),
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
