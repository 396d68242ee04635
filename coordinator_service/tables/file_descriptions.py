"""A pre-commit's data files checked against their table (location, schema, partitioning, the facts the writer sent)
and described as the manifest entries a commit appends, from their Parquet footers."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from pyiceberg.conversions import to_bytes
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import EMPTY_DICT

from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables.data_file_entries import FileRules, primitive
from coordinator_service.tables.file_paths import check_inside_location
from coordinator_service.tables.precommit_files import FileFacts
from coordinator_service.tables.pyiceberg_internals import partition_values
from coordinator_service.tables.schema_fit import FitKey, schema_misfit
from coordinator_service.tables.table_creation import TableCreation

log = structlog.get_logger(__name__)


# Table schema versions whose file-description rules are kept (the oldest is dropped first).
_FILE_RULES_KEPT = 256


@dataclass(frozen=True)
class DescribedFiles:
    """A pre-commit's files of one table, validated: their manifest entries, and when the oldest was written (Unix
    seconds; where storage does not tell, when it was checked), from which its claim's deadline counts."""

    entries: list[DataFileEntry]
    written_at: float | None


class FileDescriptions(TableCreation):
    """A pre-commit's data files checked against their table and described as manifest entries."""

    def read_data_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        evolve_schema: bool,
        facts: Mapping[str, FileFacts] = EMPTY_DICT,
        directory: str = "",
    ) -> DescribedFiles:
        """Validate the files (canonical URIs) of a pre-commit and build their manifest entries.

        The entries come from the Parquet footers (the ones the writer sent in `facts`, else read from storage);
        the data pages are not read; `directory` (or "") holds every file, listed once to check them. Raises
        InvalidArgument naming the first bad file. A cached table may lag behind a change another writer made
        (a new column): a file refused on it, or an evolution that conflicts, is tried once more on the table
        freshly loaded.
        """
        table, from_cache = self.cached(identifier)
        if not from_cache:
            return self._read_data_files(table, uris, writer_id, evolve_schema, facts, directory)
        try:
            return self._read_data_files(table, uris, writer_id, evolve_schema, facts, directory)
        except (InvalidArgument, CommitFailedException):
            return self._read_data_files(self.load(identifier), uris, writer_id, evolve_schema, facts, directory)

    def _read_data_files(
        self,
        table: Table,
        uris: Sequence[str],
        writer_id: int,
        evolve_schema: bool,
        facts: Mapping[str, FileFacts],
        directory: str,
    ) -> DescribedFiles:
        # Only under the table's data directory: a writer never names the table's metadata files, or another
        # table's, since the coordinator deletes the files of an epoch it aborts (file_deletion).
        data = table.location_provider().data_path
        for uri in uris:
            check_inside_location(uri, data, within="the table's data directory")
        if directory:
            check_inside_location(directory, str(table.location()), subject="files_directory")
        checked_at = time.time()
        files = self.file_checks.check(table.io, uris, facts, directory)
        if evolve_schema:
            table = self._evolve_for(table, [file.footer.schema.to_arrow_schema() for file in files])
        return DescribedFiles(
            entries=[
                self._entry_from_footer(table.metadata, file.path, file.footer, file.size, writer_id) for file in files
            ],
            written_at=min((file.written_at(checked_at) for file in files), default=None),
        )

    def _rules(self, metadata: TableMetadata) -> FileRules:
        key = FileRules.key_of(metadata)
        rules = self._file_rules.get(key)
        if rules is None:
            if len(self._file_rules) >= _FILE_RULES_KEPT:
                self._file_rules.pop(next(iter(self._file_rules)), None)
            rules = self._file_rules[key] = FileRules.of(key, metadata)
        return rules

    def _evolve_for(self, table: Table, schemas: Iterable[pa.Schema]) -> Table:
        known = set(table.schema().column_names)
        for schema in schemas:
            if any(name not in known for name in schema.names):
                self._add_missing_columns(table, schema)
                table = self.load(".".join(table.name()))
                known = set(table.schema().column_names)
        return table

    def _entry_from_footer(
        self, metadata: TableMetadata, path: str, footer: pq.FileMetaData, size: int, writer_id: int
    ) -> DataFileEntry:
        rules = self._rules(metadata)
        misfit = schema_misfit(FitKey(rules.key, footer.schema.to_arrow_schema().serialize().to_pybytes(), rules))
        if misfit is not None:
            raise InvalidArgument(f"data file {quote(path)} does not fit the schema of the table: {misfit}")
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer,
            stats_columns=rules.statistics_plan,
            parquet_column_mapping=rules.column_mapping,
        )
        spec, partition_type = rules.spec, rules.partition_type
        try:
            partition = statistics.partition(spec, rules.schema)
        except ValueError as error:
            raise InvalidArgument(
                f"data file {quote(path)} cannot be placed in one partition of {spec}: {cause(error)}; "
                "write one file per partition"
            ) from error
        serialized = statistics.to_serialized_dict()
        return DataFileEntry(
            path=path,
            writer_id=writer_id,
            record_count=int(serialized["record_count"]),
            file_size_in_bytes=size,
            spec_id=spec.spec_id,
            partition=tuple(
                None if value is None else to_bytes(primitive(field.field_type), value)
                for field, value in zip(partition_type.fields, partition_values(partition), strict=True)
            ),
            column_sizes=dict(serialized["column_sizes"]),
            value_counts=dict(serialized["value_counts"]),
            null_value_counts=dict(serialized["null_value_counts"]),
            nan_value_counts=dict(serialized["nan_value_counts"]),
            lower_bounds=dict(serialized["lower_bounds"]),
            upper_bounds=dict(serialized["upper_bounds"]),
            split_offsets=None if serialized["split_offsets"] is None else tuple(serialized["split_offsets"]),
        )
