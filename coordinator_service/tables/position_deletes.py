"""Position delete files (Iceberg spec, format v2): which rows of which data files a commit deletes, and reading
them back.

One file per partition of the data files it deletes from, since a reader applies a position delete file only to the
data files of its partition (spec id and values); its rows sorted by data file path, then position, as the spec
requires; the bounds of both columns kept whole, never truncated, so that a reader finds the data files it names
(pyiceberg and Java index a delete file whose path bounds are equal by that one data file). The files are written,
not committed: nothing references them until a row delta does (coordinator_service.tables.row_deltas).

Reading one (deleted_positions) groups its rows by data file in one pass. pyiceberg's own reading filters the whole
file once for each data file it names: 0.52-0.86 s for a merged delete file of 600,000 rows naming 200 files,
against 5 ms (bench/OPTIMISATIONS.md, 23). Every reading of delete files' rows the coordinator makes goes through
deleted_rows: the merge of a partition's delete files, the key index's catch-up, its rebuild's scan, the verifier's
count of the rows a rewrite left out.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from coordinator_service.tables.pyiceberg_internals import partition_values, pyiceberg_deleted_positions

# The spec's reserved field ids of a position delete file's columns (pyiceberg's own POSITIONAL_DELETE_SCHEMA types
# `pos` as an int; the spec says long).
FILE_PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
POSITION_DELETE_SCHEMA = Schema(
    NestedField(FILE_PATH_FIELD_ID, "file_path", StringType(), required=True),
    NestedField(POS_FIELD_ID, "pos", LongType(), required=True),
)
POSITION_DELETE_ARROW = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(FILE_PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}),
    ]
)
# Whole values in the bounds of both columns (Java writes delete files with full metrics too).
_FULL_METRICS = {"write.metadata.metrics.default": "full"}
_STATISTICS_PLAN = compute_statistics_plan(POSITION_DELETE_SCHEMA, _FULL_METRICS)
_COLUMN_MAPPING = parquet_path_to_id_mapping(POSITION_DELETE_SCHEMA)
# Row positions in a data file: a commit's, as Python ints; a merge's, as read from delete files.
RowPositions: TypeAlias = Sequence[int] | npt.NDArray[np.int64]
# Row positions in one data file, as read from delete files.
RowNumbers: TypeAlias = npt.NDArray[np.int64]


def deleted_positions(io: FileIO, delete_file: DataFile) -> dict[str, RowNumbers]:
    """The row positions a position delete file deletes, by data file path, each path's in the file's order: a
    Parquet file read here (its two columns, the paths as a dictionary array, grouped by path in one pass), any other
    (ORC, a v3 deletion vector) by pyiceberg.

    Raises ValueError when a row has no path or no position (the spec requires both)."""
    if delete_file.file_format != FileFormat.PARQUET:
        return {
            path: positions.to_numpy().astype(np.int64, copy=False)
            for path, positions in pyiceberg_deleted_positions(io, delete_file).items()
        }
    with io.new_input(delete_file.file_path).open() as stream:
        rows = pq.read_table(stream, columns=["file_path", "pos"], read_dictionary=["file_path"])
    if rows.column("file_path").null_count or rows.column("pos").null_count:
        raise ValueError(f"position delete file {delete_file.file_path} has rows without a file_path or a pos")
    if not rows.num_rows:
        return {}
    paths = rows.unify_dictionaries().column("file_path").combine_chunks()
    numbers = paths.indices.to_numpy()
    positions = rows.column("pos").to_numpy().astype(np.int64, copy=False)
    order = np.argsort(numbers, kind="stable")  # a path's rows in the file's order
    numbers, positions = numbers[order], positions[order]
    starts = np.flatnonzero(numbers[1:] != numbers[:-1]) + 1
    names = paths.dictionary.to_pylist()
    return {
        names[group[0]]: part
        for group, part in zip(np.split(numbers, starts), np.split(positions, starts), strict=True)
    }


def deleted_rows(
    io: FileIO, delete_files: Iterable[DataFile], read: Callable[..., Iterable[Any]] = map
) -> dict[str, RowNumbers]:
    """The row positions these position delete files delete together, by data file path, each once and in order;
    each delete file read once (deleted_positions), by `read` (`map`, or an executor's, to read several at once)."""
    unique = {delete_file.file_path: delete_file for delete_file in delete_files}
    parts: dict[str, list[RowNumbers]] = defaultdict(list)
    for positions in read(lambda delete_file: deleted_positions(io, delete_file), unique.values()):
        for path, rows in positions.items():
            parts[path].append(rows)
    return {path: _ascending_once(arrays) for path, arrays in parts.items()}


def _ascending_once(arrays: list[RowNumbers]) -> RowNumbers:
    """The positions of `arrays` together, each once, in order: one array in order already (a delete file the spec's
    way) as it is, without sorting it again."""
    if len(arrays) == 1 and bool(np.all(arrays[0][1:] > arrays[0][:-1])):
        return arrays[0]
    return np.unique(np.concatenate(arrays))


def position_delete_rows(positions: Mapping[str, RowPositions]) -> pa.Table:
    """The rows of a position delete file for `positions` (data file path -> row positions in it): sorted by path,
    then position, each (path, position) once."""
    paths = sorted(path for path, rows in positions.items() if len(rows))
    ordered = [np.unique(np.asarray(positions[path], dtype=np.int64)) for path in paths]
    numbers = np.repeat(np.arange(len(paths), dtype=np.int32), [len(rows) for rows in ordered])
    file_paths = pa.DictionaryArray.from_arrays(pa.array(numbers, pa.int32()), pa.array(paths, pa.string()))
    return pa.table(
        {
            "file_path": file_paths.cast(pa.string()),
            "pos": pa.array(np.concatenate(ordered) if ordered else np.empty(0, np.int64), pa.int64()),
        },
        schema=POSITION_DELETE_ARROW,
    )


def write_position_deletes(
    table: Table, positions: Mapping[str, RowPositions], data_files: Mapping[str, DataFile]
) -> list[DataFile]:
    """Write the position delete files that delete `positions` (data file path -> row positions) from the table's data
    files `data_files` (by path: each path of `positions` must be there, for its partition); return them, described
    for a manifest. One file per partition, under the table's data location; nothing references them yet."""
    by_partition: dict[tuple[int, tuple[Any, ...]], dict[str, RowPositions]] = defaultdict(dict)
    for path, rows in positions.items():
        if not len(rows):
            continue
        data_file = data_files[path]
        by_partition[(data_file.spec_id, partition_values(data_file.partition))][path] = rows
    written = []
    for group in by_partition.values():
        first = data_files[next(iter(group))]
        written.append(_write_one(table, position_delete_rows(group), first))
    return written


def _write_one(table: Table, rows: pa.Table, partition_of: DataFile) -> DataFile:
    buffer = pa.BufferOutputStream()
    pq.write_table(rows, buffer)
    contents = buffer.getvalue()
    footer = pq.read_metadata(pa.BufferReader(contents))
    path = table.location_provider().new_data_location(f"{uuid.uuid4()}-deletes.parquet")
    with table.io.new_output(path).create(overwrite=False) as stream:
        stream.write(contents.to_pybytes())
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer, stats_columns=_STATISTICS_PLAN, parquet_column_mapping=_COLUMN_MAPPING
    ).to_serialized_dict()
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition_of.partition,
        record_count=rows.num_rows,
        file_size_in_bytes=len(contents),
        column_sizes=statistics["column_sizes"],
        value_counts=statistics["value_counts"],
        null_value_counts=statistics["null_value_counts"],
        nan_value_counts=statistics["nan_value_counts"],
        lower_bounds=statistics["lower_bounds"],
        upper_bounds=statistics["upper_bounds"],
        split_offsets=statistics["split_offsets"],
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    delete_file.spec_id = partition_of.spec_id  # not a field of the manifest entry: from_args drops it
    return delete_file
