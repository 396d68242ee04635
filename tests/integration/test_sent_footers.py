"""Footers sent with the paths (PreCommit's DataFile.parquet_footer): the same entries as footers read from storage,
one metadata request instead of a read, refusals that name the file and change nothing, and old writers unchanged."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import REGISTRY
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorClient, PreCommitFile
from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.rpc import sink_coordinator_pb2_grpc as pb_grpc
from coordinator_service.contract.views import PreCommitOutcome, Registration
from coordinator_service.log import precommit_metadata
from coordinator_service.log.precommit_metadata import PreCommitMetadata
from coordinator_service.tables.iceberg import IcebergGateway
from coordinator_service.tables.precommit_files import FileFacts
from spark_writer.sink.parquet_writer import DataFileTarget, WrittenFile, task_writer
from spark_writer.sink.partitioning import parse_partition_fields
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, table_order_ids, write_parquet
from tests.fixtures.refusals import refused

# Every kind of column the statistics cover, nulls and NaNs included.
WIDE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("small", pa.int32()),
        pa.field("ratio", pa.float32()),
        pa.field("amount", pa.float64()),
        pa.field("price", pa.decimal128(12, 3)),
        pa.field("region", pa.string()),
        pa.field("blob", pa.binary()),
        pa.field("flag", pa.bool_()),
        pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("point", pa.struct([pa.field("x", pa.float64()), pa.field("y", pa.float64())])),
    ]
)


def wide_rows(count: int) -> pa.RecordBatch:
    start = datetime(2025, 3, 1, tzinfo=UTC)
    return pa.RecordBatch.from_pylist(
        [
            {
                "id": i,
                "small": None if i % 11 == 0 else i % 1000,
                "ratio": float("nan") if i % 13 == 0 else i / 7,
                "amount": i * 1.5,
                "price": Decimal(i) / 1000,
                "region": ("eu-west", "eu-north", "us-east", None)[i % 4],
                "blob": bytes([i % 256]) * (i % 5),
                "flag": i % 2 == 0,
                "day": (start + timedelta(hours=i)).date(),
                "ts": start + timedelta(hours=i),
                "tags": [f"t{i % 3}"] * (i % 3),
                "point": {"x": i / 3, "y": -i / 3},
            }
            for i in range(count)
        ],
        schema=WIDE,
    )


def written_files(location: str, *partition_by: str) -> list[WrittenFile]:
    """The files the Spark writer's task writes for one micro-batch: several partitions, several row groups."""
    target = DataFileTarget(location, 3, WIDE, parse_partition_fields(partition_by, WIDE), 32 * 1024)
    batches = [wide_rows(4000).slice(offset, 500) for offset in range(0, 4000, 500)]
    (result,) = task_writer(target)(iter(batches))
    rows = result.to_pylist()
    # One row per file, and nothing else: no record decoded (the rows are the table's), no route.
    assert all(row["path"] is not None and row["bad_records"] == 0 and row["topic"] is None for row in rows)
    return [WrittenFile(**{field.name: row[field.name] for field in dataclasses.fields(WrittenFile)}) for row in rows]


def sent(files: list[WrittenFile]) -> dict[str, FileFacts]:
    return {file.path: FileFacts(file.parquet_footer, file.size_bytes) for file in files}


def footers_counted(source: str) -> float:
    return REGISTRY.get_sample_value("sink_coordinator_precommit_footers_total", {"source": source}) or 0.0


@pytest.fixture
def tables(catalog: Catalog) -> IcebergGateway:
    return IcebergGateway(catalog, orphan_grace_seconds=3600)


@pytest.mark.parametrize("partition_by", [(), ("region", "day(ts)"), ("truncate(2, region)", "month(day)")])
def test_a_sent_footer_describes_a_file_exactly_as_the_read_one(
    tables: IcebergGateway, partition_by: tuple[str, ...]
) -> None:
    location = tables.ensure_table("shop.wide", WIDE, partition_by)
    files = written_files(location, *partition_by)
    assert len(files) > 1
    row_groups = [pq.read_metadata(f.path.removeprefix("file://")).num_row_groups for f in files]
    assert max(row_groups) > 1 or partition_by, "several row groups (split offsets) in a file"
    paths = [file.path for file in files]
    sent_before = footers_counted("sent")

    read = tables.read_data_files("shop.wide", paths, 0, False).entries
    from_sent = tables.read_data_files("shop.wide", paths, 0, False, sent(files)).entries

    assert footers_counted("sent") - sent_before == len(files)
    assert from_sent == read
    stored = [
        precommit_metadata.encode(PreCommitMetadata("shop.wide", tuple(entries))) for entries in (read, from_sent)
    ]
    assert stored[0] == stored[1]


def test_with_a_sent_footer_the_file_is_not_read(tables: IcebergGateway) -> None:
    """One metadata request (existence, size, age) and no read: a file whose bytes are not Parquet at all, of
    the size sent, is taken as the footer describes it; without the footer it is read and refused."""
    location = tables.ensure_table("shop.wide", WIDE, ())
    (file, *_) = written_files(location)
    Path(file.path.removeprefix("file://")).write_bytes(b"x" * file.size_bytes)
    (entry,) = tables.read_data_files("shop.wide", [file.path], 0, False, sent([file])).entries
    assert entry.record_count == pq.read_metadata(pa.BufferReader(file.parquet_footer)).num_rows
    with pytest.raises(InvalidArgument, match="not a readable Parquet file"):
        tables.read_data_files("shop.wide", [file.path], 0, False)


def test_a_file_with_a_sent_footer_older_than_the_orphan_grace_is_refused(tables: IcebergGateway) -> None:
    location = tables.ensure_table("shop.wide", WIDE, ())
    (file, *_) = written_files(location)
    day_ago = time.time() - 86400
    os.utime(file.path.removeprefix("file://"), (day_ago, day_ago))
    with pytest.raises(InvalidArgument, match="ORPHAN_GRACE_SECONDS") as raised:
        tables.read_data_files("shop.wide", [file.path], 0, False, sent([file]))
    assert file.path in raised.value.message


def test_sent_footers_of_many_files_evolve_the_schema(tables: IcebergGateway) -> None:
    location = tables.ensure_table("shop.narrow", pa.schema(list(WIDE)[:4]), ())
    files = written_files(location)
    entries = tables.read_data_files("shop.narrow", [f.path for f in files], 0, True, sent(files)).entries
    assert sum(entry.record_count for entry in entries) == 4000
    assert "point" in tables.load("shop.narrow").schema().column_names


@pytest.fixture
def client(coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with coordinator.client(retry_seconds=0) as client:
        yield client


@pytest.fixture
def writer(client: CoordinatorClient) -> Registration:
    return client.register_writer("orders-sink", "shop.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())


def footer_of(uri: str) -> PreCommitFile:
    """The file as a writer that wrote it sends it."""
    path = uri.removeprefix("file://")
    buffer = pa.BufferOutputStream()
    pq.read_metadata(path).write_metadata_file(buffer)
    return PreCommitFile(uri, buffer.getvalue().to_pybytes(), os.path.getsize(path))


def test_sent_footers_that_do_not_fit_are_refused(
    client: CoordinatorClient, writer: Registration, database_url: str
) -> None:
    term, invalid = writer.writer_term, grpc.StatusCode.INVALID_ARGUMENT
    good = footer_of(write_parquet(writer.table_location, orders(0, 3)))
    name = good.path.rsplit("/", 1)[1]

    def pre_commit(*files: PreCommitFile) -> None:
        client.pre_commit("orders-sink", 0, term, files)

    refused(
        database_url,
        lambda: pre_commit(PreCommitFile(good.path, b"PAR1 not a footer PAR1", good.file_size_in_bytes)),
        invalid,
        name,
        "parquet_footer is not a serialized Parquet footer",
    )
    refused(
        database_url,
        lambda: pre_commit(PreCommitFile(good.path, good.parquet_footer, good.file_size_in_bytes + 1)),
        invalid,
        name,
        f"is not {good.file_size_in_bytes + 1} bytes, the size the writer sent",
    )
    # The size on storage is not echoed: a writer learns nothing of a file it did not write.
    echoed = refused(database_url, lambda: pre_commit(PreCommitFile(good.path, good.parquet_footer, 7)), invalid, name)
    assert str(good.file_size_in_bytes) not in echoed.message.replace(name, "")
    refused(database_url, lambda: pre_commit(PreCommitFile(good.path, good.parquet_footer)), invalid, name, "size")
    refused(database_url, lambda: pre_commit(PreCommitFile(good.path, b"", -5)), invalid, name, "negative")
    missing = PreCommitFile(
        writer.table_location + "/data/missing.parquet", good.parquet_footer, good.file_size_in_bytes
    )
    refused(database_url, lambda: pre_commit(good, missing), invalid, "missing.parquet", "does not exist")
    # A size sent without a footer is checked against storage too.
    refused(
        database_url,
        lambda: pre_commit(PreCommitFile(good.path, b"", good.file_size_in_bytes - 1)),
        invalid,
        name,
        "the size the writer sent",
    )


def test_a_files_directory_is_listed_and_must_hold_the_files_inside_the_table(
    client: CoordinatorClient, writer: Registration, database_url: str, catalog: Catalog
) -> None:
    term, invalid = writer.writer_term, grpc.StatusCode.INVALID_ARGUMENT
    batch = f"{writer.table_location}/data/00000000"  # write_parquet puts the files in its data/
    files = [footer_of(write_parquet(batch, orders(i * 10, 10))) for i in range(3)]
    outside = footer_of(write_parquet(writer.table_location, orders(100, 1)))

    refused(
        database_url,
        lambda: client.pre_commit("orders-sink", 0, term, [*files, outside], files_directory=batch),
        invalid,
        outside.path,
        f"lies outside files_directory {batch}",
    )
    refused(
        database_url,
        lambda: client.pre_commit(
            "orders-sink", 0, term, files, files_directory=writer.table_location.rsplit("/", 1)[0]
        ),
        invalid,
        "files_directory",
        "lies outside the table location",
    )
    answer = client.pre_commit("orders-sink", 0, term, files, files_directory=batch)
    assert answer.outcome is PreCommitOutcome.PERSISTED and answer.record_count == 30
    client.commit_checkpoint("orders-sink", 0, term, wait=True)
    assert table_order_ids(catalog.load_table("shop.orders")) == list(range(30))


def test_old_writers_without_footers_and_new_ones_with_them_pre_commit_alike(
    coordinator: CoordinatorProcess, writer: Registration, catalog: Catalog
) -> None:
    term = writer.writer_term
    with grpc.insecure_channel(coordinator.target) as channel:
        stub = pb_grpc.SinkCoordinatorStub(channel)
        # A writer from before footers: DataFile has a path only.
        old = [write_parquet(writer.table_location, orders(i * 10, 10)) for i in range(3)]
        answer = stub.PreCommit(
            pb.PreCommitRequest(
                sink="orders-sink", epoch=0, writer_term=term, data_files=[pb.DataFile(path=p) for p in old]
            )
        )
        assert answer.outcome == pb.PreCommitResponse.PERSISTED
        assert answer.record_count == 30
        new = [footer_of(write_parquet(writer.table_location, orders(30 + i * 10, 10))) for i in range(3)]
        answer = stub.PreCommit(
            pb.PreCommitRequest(
                sink="orders-sink",
                epoch=1,
                writer_term=term,
                data_files=[
                    pb.DataFile(path=f.path, parquet_footer=f.parquet_footer, file_size_in_bytes=f.file_size_in_bytes)
                    for f in new
                ],
            )
        )
        assert answer.outcome == pb.PreCommitResponse.PERSISTED
        assert answer.record_count == 30
    with coordinator.client() as client:
        client.commit_checkpoint("orders-sink", 1, term, wait=True)
    assert table_order_ids(catalog.load_table("shop.orders")) == list(range(60))
