"""Position delete files (Iceberg spec, format v2): which rows of which data files a commit deletes.

One file per partition of the data files it deletes from, since a reader applies a position delete file only to the
data files of its partition (spec id and values); its rows sorted by data file path, then position, as the spec
requires; the bounds of both columns kept whole, never truncated, so that a reader finds the data files it names
(pyiceberg and Java index a delete file whose path bounds are equal by that one data file). The files are written,
not committed: nothing references them until a row delta does (coordinator_service.tables.row_deltas).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from coordinator_service.tables.pyiceberg_internals import partition_values

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
