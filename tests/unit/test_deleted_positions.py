"""Reading a position delete file back (coordinator_service.tables.position_deletes.deleted_positions, deleted_rows)
against pyiceberg's own reading of it (the one its scans apply), whatever its rows (any paths, positions, order,
repeats), its row groups and its encoding; and the coordinator's own files (position_delete_rows) read back to what
was written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

from coordinator_service.tables.position_deletes import (
    POSITION_DELETE_ARROW,
    RowPositions,
    deleted_positions,
    deleted_rows,
    position_delete_rows,
)
from coordinator_service.tables.pyiceberg_internals import pyiceberg_deleted_positions

PATHS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
ROWS = st.lists(st.tuples(PATHS, st.integers(0, 2**40)), max_size=60)
IO = PyArrowFileIO()


def delete_file(path: Path, rows: pa.Table, **parquet: object) -> DataFile:
    pq.write_table(rows, path, **parquet)
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path.as_uri(),
        file_format=FileFormat.PARQUET,
        record_count=rows.num_rows,
        file_size_in_bytes=path.stat().st_size,
    )


def as_lists(positions: dict[str, np.ndarray]) -> dict[str, list[int]]:
    return {path: rows.tolist() for path, rows in positions.items()}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=ROWS,
    spec_order=st.booleans(),
    row_group_size=st.sampled_from([None, 1, 7]),
    use_dictionary=st.booleans(),
)
def test_a_delete_files_positions_are_what_pyiceberg_reads(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, int]],
    spec_order: bool,
    row_group_size: int | None,
    use_dictionary: bool,
) -> None:
    if spec_order:
        rows = sorted(rows)
    table = pa.table(
        {"file_path": [path for path, _ in rows], "pos": [pos for _, pos in rows]}, schema=POSITION_DELETE_ARROW
    )
    written = delete_file(
        tmp_path_factory.mktemp("deletes") / "deletes.parquet",
        table,
        row_group_size=row_group_size,
        use_dictionary=use_dictionary,
    )

    ours = deleted_positions(IO, written)

    theirs = {path: positions.to_pylist() for path, positions in pyiceberg_deleted_positions(IO, written).items()}
    assert as_lists(ours) == theirs
    assert all(positions.dtype == np.int64 for positions in ours.values())
    together = deleted_rows(IO, [written, written])  # one file named twice: read once
    assert as_lists(together) == {path: sorted(set(positions)) for path, positions in theirs.items()}


def test_the_coordinators_own_delete_files_read_back_to_what_was_written(tmp_path: Path) -> None:
    positions: dict[str, RowPositions] = {"file:///a": [7, 3, 3], "file:///b": np.array([0, 2**40], dtype=np.int64)}
    written = delete_file(tmp_path / "deletes.parquet", position_delete_rows(positions))

    assert as_lists(deleted_positions(IO, written)) == {"file:///a": [3, 7], "file:///b": [0, 2**40]}


def test_a_row_without_a_path_or_a_position_is_refused_by_name(tmp_path: Path) -> None:
    rows = pa.table({"file_path": ["file:///a", None], "pos": [1, 2]})
    written = delete_file(tmp_path / "nulls.parquet", rows)

    with pytest.raises(ValueError, match=r"nulls\.parquet has rows without a file_path or a pos"):
        deleted_positions(IO, written)
