"""Some columns of a table's data files, every row as written (no delete applied): the one reading of a few columns
of whole files, for the verifier's new rows and the key index's rows of a file.

A file is read straight from its Parquet (pyarrow's dataset reader through the table's FileIO) when each column is in
it under the table's field id (the file's own ids, or for a file without them the table's name mapping: what the Spark
writer writes) and in the table's type. pyiceberg's ArrowScan reads such a file to the same table, with about half a
millisecond more per file (its schema conversions and projection of every batch), which was half of an incremental
verification's reading (bench/OPTIMISATIONS.md). Any other file (one that lacks a column, holds it in a type since
promoted, has no field ids while the table has no name mapping, has field ids into nested columns or two columns of
one name, is not Parquet) is read by ArrowScan, which projects it onto the table's schema."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile, FileFormat
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import IcebergType

FIELD_ID = b"PARQUET:field_id"


def data_file_columns(
    table: Table,
    data_files: Sequence[DataFile],
    columns: Sequence[str],
    dictionary: Collection[str] = (),
    read: Callable[..., Iterable[Any]] = map,
) -> pa.Table:
    """The `columns` of every row of `data_files`, file after file in their order; those named in `dictionary`
    (string columns) as dictionary arrays. Each file is read by `read` (`map`, or an executor's, to read several at
    once)."""
    projected = table.schema().select(*columns)

    def wanted_type(name: str) -> pa.DataType:
        arrow = _arrow_type(projected.find_type(name))
        return pa.dictionary(pa.int32(), arrow) if name in dictionary else arrow

    wanted = pa.schema([pa.field(name, wanted_type(name)) for name in columns])
    parquet = ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(dictionary_columns=set(dictionary)),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True),
    )

    mapping = table.metadata.name_mapping()
    mapped = None if mapping is None else {n: f.field_id for f in mapping if f.field_id is not None for n in f.names}
    # Each column's field id, name and Arrow type, as a file read as written must hold it.
    expected = [(field.field_id, field.name, _arrow_type(field.field_type)) for field in projected.fields]

    def one(data_file: DataFile) -> pa.Table:
        rows = _as_written(table, data_file, expected, parquet, mapped)
        if rows is None:
            rows = ArrowScan(table.metadata, table.io, projected, AlwaysTrue()).to_table([FileScanTask(data_file)])
        return _typed(rows, wanted)

    return pa.concat_tables([wanted.empty_table(), *read(one, data_files)])


def _as_written(
    table: Table,
    data_file: DataFile,
    expected: Sequence[tuple[int, str, pa.DataType]],
    parquet: ds.ParquetFileFormat,
    mapped: dict[str, int] | None,
) -> pa.Table | None:
    """The file's columns read as they are, when they are the table's own (`expected`: field id, name, Arrow type
    each; None: ArrowScan must project them)."""
    if data_file.file_format != FileFormat.PARQUET:
        return None
    with table.io.new_input(data_file.file_path).open() as stream:
        fragment = parquet.make_fragment(stream)
        physical = fragment.physical_schema
        names = _names_by_field_id(physical, mapped)
        if names is None:
            return None
        read = []
        for field_id, _, arrow in expected:
            name = names.get(field_id)
            if name is None or _arrow_type(physical.field(name).type) != arrow:
                return None
            read.append(name)
        rows = ds.Scanner.from_fragment(fragment, columns=read).to_table()
    return rows.rename_columns([name for _, name, _ in expected])


def _names_by_field_id(physical: pa.Schema, mapped: dict[str, int] | None) -> dict[int, str] | None:
    """The file's top-level columns by field id, as pyiceberg resolves them: by the file's own ids when every column
    has one, else by the table's name mapping (`mapped`: its top-level names' ids); None when it has neither, when
    its own ids go on into nested columns, or when two of its columns have one name (ArrowScan resolves those)."""
    if len(set(physical.names)) < len(physical.names):
        return None
    own = [(field.metadata or {}).get(FIELD_ID) for field in physical]
    if all(own):
        if any(pa.types.is_nested(field.type) for field in physical):
            return None
        return {int(field_id or b""): field.name for field_id, field in zip(own, physical, strict=True)}
    if mapped is None:
        return None
    return {mapped[field.name]: field.name for field in physical if field.name in mapped}


def _arrow_type(column_type: IcebergType | pa.DataType) -> pa.DataType:
    """A column's Arrow type, a string as Arrow's string (the coordinator's writers write string, pyiceberg
    large_string: the same column), a column read as a dictionary array as its values'."""
    if not isinstance(column_type, pa.DataType):
        column_type = schema_to_pyarrow(column_type, include_field_ids=False)
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    return pa.string() if column_type == pa.large_string() else column_type


def _typed(rows: pa.Table, wanted: pa.Schema) -> pa.Table:
    """`rows` in `wanted`'s types: a string column as a dictionary array or as plain strings, as asked."""
    arrays = []
    for field in wanted:
        column = rows.column(field.name)
        if column.type != field.type:
            if pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(column.type):
                column = pc.dictionary_encode(column.cast(field.type.value_type))
            else:
                column = column.cast(field.type)
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=wanted)
