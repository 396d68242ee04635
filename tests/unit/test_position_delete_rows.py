"""A position delete file's rows (coordinator_service.tables.position_deletes): sorted by path, then position, each
(path, position) once, whatever the order, repeats and form (Python ints, a commit's; NumPy arrays, a merge's) of the
positions given; compared with the same rows built the plain way."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.tables.position_deletes import POSITION_DELETE_ARROW, position_delete_rows

PATHS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
POSITIONS = st.dictionaries(PATHS, st.lists(st.integers(0, 2**40), max_size=30), max_size=8)


@given(positions=POSITIONS, as_arrays=st.booleans())
def test_rows_are_each_path_and_position_once_in_order(positions: dict[str, list[int]], as_arrays: bool) -> None:
    arrays = {path: np.array(rows, dtype=np.int64) for path, rows in positions.items()}

    rows = position_delete_rows(arrays if as_arrays else positions)

    expected = sorted({(path, pos) for path, values in positions.items() for pos in values})
    assert rows.schema == POSITION_DELETE_ARROW
    assert list(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True)) == expected
