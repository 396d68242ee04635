"""The executor-side file writer, without Spark: rolling at the target size, one partition per file, cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_writer.sink.parquet_writer import DataFileTarget, task_writer
from spark_writer.sink.partitioning import parse_partition_fields

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string()), pa.field("note", pa.string())])


def batches(count: int, size: int) -> list[pa.RecordBatch]:
    """Rows of ~80 bytes that do not compress, so that file sizes follow row counts."""
    return [
        pa.RecordBatch.from_pylist(
            [
                {"id": i, "region": ("eu", "us")[i % 2], "note": os.urandom(32).hex()}
                for i in range(start, start + size)
            ],
            schema=SCHEMA,
        )
        for start in range(0, count * size, size)
    ]


def target(location: Path, *partition_by: str, size: int = 128 * 1024 * 1024) -> DataFileTarget:
    return DataFileTarget(
        table_location=location.as_uri(),
        batch_id=7,
        schema=SCHEMA,
        partition_fields=parse_partition_fields(partition_by, SCHEMA),
        target_file_size_bytes=size,
    )


def written(location: Path, data: list[pa.RecordBatch], spec: DataFileTarget) -> list[dict[str, object]]:
    (result,) = list(task_writer(spec)(iter(data)))
    return list(result.to_pylist())


def test_files_roll_at_the_target_size_and_hold_every_row_once(tmp_path: Path) -> None:
    files = written(tmp_path, batches(20, 500), target(tmp_path, size=64 * 1024))
    assert len(files) > 3
    ids = []
    for entry in files:
        path = str(entry["path"]).removeprefix("file://")
        assert path.startswith(f"{tmp_path}/data/00000007-")
        table = pq.read_table(path)
        assert table.num_rows == entry["record_count"]
        assert Path(path).stat().st_size == entry["size_bytes"]
        # The footer the task ships to the driver (and the driver to the coordinator) is the file's.
        shipped = pq.read_metadata(pa.BufferReader(entry["parquet_footer"]))
        assert shipped.equals(pq.read_metadata(path)) and shipped.to_dict() == pq.read_metadata(path).to_dict()
        ids.extend(table.column("id").to_pylist())
    assert sorted(ids) == list(range(10_000))
    # A file is closed at the first row group that takes it past the target.
    assert all(int(str(entry["size_bytes"])) < 3 * 64 * 1024 for entry in files)


def test_one_file_per_partition(tmp_path: Path) -> None:
    files = written(tmp_path, batches(3, 100), target(tmp_path, "region"))
    regions = [set(pq.read_table(str(f["path"]).removeprefix("file://")).column("region").to_pylist()) for f in files]
    assert sorted(map(sorted, regions)) == [["eu"], ["us"]]


def test_a_failing_task_deletes_its_files(tmp_path: Path) -> None:
    def failing() -> object:
        yield from batches(2, 100)
        raise RuntimeError("task failed")

    with pytest.raises(RuntimeError, match="task failed"):
        written(tmp_path, failing(), target(tmp_path, "region", size=1024))  # type: ignore[arg-type]
    assert list((tmp_path / "data").iterdir()) == []
