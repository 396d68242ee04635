import json

import pytest

from coordinator_service.log.precommit_metadata import (
    DataFileEntry,
    MetadataDecodeError,
    PreCommitMetadata,
    decode,
    encode,
)

ENTRY = DataFileEntry(
    path="file:///w/t/data/a.parquet",
    writer_id=1,
    record_count=3,
    file_size_in_bytes=1234,
    spec_id=0,
    partition=(b"\x01\x00\x00\x00", None),
    column_sizes={1: 10},
    value_counts={1: 3},
    null_value_counts={1: 0},
    nan_value_counts={},
    lower_bounds={1: b"\x00\xff"},
    upper_bounds={1: b"\x7f"},
    split_offsets=(4,),
)

# A version-1 record as an earlier release wrote it: later releases must keep reading it.
VERSION_1 = (
    b'{"encoding":"sink-coordinator/precommit","properties":{"offsets":"{}"},"tables":[{"data_files":'
    b'[{"column_sizes":{"1":10},"file_format":"PARQUET","file_size_in_bytes":1234,"lower_bounds":{"1":"AP8="},'
    b'"nan_value_counts":{},"null_value_counts":{"1":0},"partition":["AQAAAA==",null],'
    b'"path":"file:///w/t/data/a.parquet","record_count":3,"spec_id":0,"split_offsets":[4],'
    b'"upper_bounds":{"1":"fw=="},"value_counts":{"1":3},"writer_id":1}],"table":"db.t"}],"version":1}'
)


def test_round_trip_keeps_every_byte() -> None:
    metadata = PreCommitMetadata(table="db.t", data_files=(ENTRY,), properties={"offsets": "{}"})
    assert decode(encode(metadata)) == metadata


def test_reads_the_documented_version_1_form() -> None:
    assert encode(decode(VERSION_1)) == VERSION_1
    assert decode(VERSION_1).data_files == (ENTRY,)


def test_paths_and_counts() -> None:
    other = DataFileEntry(
        path="file:///w/t/data/b.parquet", writer_id=0, record_count=2, file_size_in_bytes=1, spec_id=0
    )
    metadata = PreCommitMetadata(table="db.t", data_files=(ENTRY, other))
    assert metadata.record_count == 5
    assert metadata.paths_of_writer(0) == {"file:///w/t/data/b.parquet"}
    assert metadata.paths == {ENTRY.path, other.path}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"version": 1}', "encoding marker"),
        (VERSION_1.replace(b'"version":1', b'"version":2'), "version 2 is unknown"),
        (VERSION_1.replace(b'"PARQUET"', b'"ORC"'), "not PARQUET"),
    ],
)
def test_refuses_what_it_cannot_read(raw: bytes, message: str) -> None:
    with pytest.raises(MetadataDecodeError, match=message):
        decode(raw)


def test_an_epoch_of_several_tables_lists_the_sinks_own_first_then_the_others_by_name() -> None:
    routed = [
        DataFileEntry(
            path=f"file:///w/{name}/data/a.parquet",
            writer_id=0,
            record_count=1,
            file_size_in_bytes=1,
            spec_id=0,
            table=f"db.{name}",
        )
        for name in ("us", "eu")
    ]
    metadata = PreCommitMetadata(table="db.t", data_files=(*routed, ENTRY))
    encoded = encode(metadata)
    assert [table["table"] for table in json.loads(encoded)["tables"]] == ["db.t", "db.eu", "db.us"]
    decoded = decode(encoded)
    assert decoded.data_files == (ENTRY, routed[1], routed[0])
    assert {table: [entry.path for entry in entries] for table, entries in decoded.by_table().items()} == {
        "db.t": [ENTRY.path],
        "db.eu": [routed[1].path],
        "db.us": [routed[0].path],
    }


def test_the_sinks_own_table_is_listed_without_files() -> None:
    routed = DataFileEntry(
        path="file:///w/eu/a.parquet", writer_id=0, record_count=1, file_size_in_bytes=1, spec_id=0, table="db.eu"
    )
    decoded = decode(encode(PreCommitMetadata(table="db.t", data_files=(routed,))))
    assert (decoded.table, decoded.data_files) == ("db.t", (routed,))
    assert decoded.by_table() == {"db.t": [], "db.eu": [routed]}
