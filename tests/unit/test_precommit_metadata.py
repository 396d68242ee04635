import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator_service.log.precommit_metadata import (
    KEYED_VERSION,
    VERSION,
    DataFileEntry,
    KeyFileEntry,
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


KEY_FILE = KeyFileEntry(path="file:///w/t/data/a-keys.parquet", writer_id=1, key_count=2, file_size_in_bytes=99)

# The documented version-2 form: version 1 with each table's key files.
VERSION_2 = (
    b'{"encoding":"sink-coordinator/precommit","properties":{},"tables":[{"data_files":[],"key_files":'
    b'[{"file_size_in_bytes":99,"key_count":2,"path":"file:///w/t/data/a-keys.parquet","writer_id":1}],'
    b'"table":"db.t"},{"data_files":[],"key_files":[{"file_size_in_bytes":5,"key_count":1,'
    b'"path":"file:///w/eu/data/k.parquet","writer_id":0}],"table":"db.eu"}],"version":2}'
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
        (VERSION_1.replace(b'"version":1', b'"version":3'), "version 3 is unknown"),
        (VERSION_1.replace(b'"version":1', b'"version":2'), "version 2 is malformed: KeyError.'key_files'"),
        (
            encode(PreCommitMetadata("db.t", ()))
            .replace(b'"version":1', b'"version":2')
            .replace(b'"data_files":[]', b'"data_files":[],"key_files":[]'),
            "version 2 holds no key file",
        ),
        (VERSION_2.replace(b'"key_count":2,', b""), "key_count"),
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


def test_reads_the_documented_version_2_form() -> None:
    decoded = decode(VERSION_2)
    assert decoded.data_files == ()
    assert decoded.key_files == (
        KEY_FILE,
        KeyFileEntry(path="file:///w/eu/data/k.parquet", writer_id=0, key_count=1, file_size_in_bytes=5, table="db.eu"),
    )
    assert encode(decoded) == VERSION_2


def test_version_2_only_for_an_epoch_with_key_files() -> None:
    plain = PreCommitMetadata(table="db.t", data_files=(ENTRY,))
    keyed = PreCommitMetadata(table="db.t", data_files=(ENTRY,), key_files=(KEY_FILE,))
    assert json.loads(encode(plain))["version"] == VERSION
    assert "key_files" not in json.loads(encode(plain))["tables"][0]
    assert json.loads(encode(keyed))["version"] == KEYED_VERSION
    assert keyed.paths == {ENTRY.path, KEY_FILE.path}
    assert keyed.paths_of_writer(1) == {ENTRY.path, KEY_FILE.path}
    assert keyed.record_count == ENTRY.record_count


_TABLES = st.sampled_from(["", "db.eu", "db.us", "lake.shop.orders"])
_PATHS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
_COUNTS = st.integers(min_value=0, max_value=2**62)
_BYTES = st.binary(max_size=12)
_STATS = st.dictionaries(st.integers(min_value=1, max_value=2**31 - 1), _COUNTS, max_size=3)
_DATA_FILES = st.builds(
    DataFileEntry,
    path=_PATHS,
    writer_id=st.integers(min_value=0, max_value=2**31 - 1),
    record_count=_COUNTS,
    file_size_in_bytes=_COUNTS,
    spec_id=st.integers(min_value=0, max_value=2**31 - 1),
    partition=st.lists(st.none() | _BYTES, max_size=3).map(tuple),
    column_sizes=_STATS,
    value_counts=_STATS,
    null_value_counts=_STATS,
    nan_value_counts=_STATS,
    lower_bounds=st.dictionaries(st.integers(min_value=1, max_value=2**31 - 1), _BYTES, max_size=3),
    upper_bounds=st.dictionaries(st.integers(min_value=1, max_value=2**31 - 1), _BYTES, max_size=3),
    split_offsets=st.none() | st.lists(_COUNTS, max_size=3).map(tuple),
    table=_TABLES,
)
_KEY_FILES = st.builds(
    KeyFileEntry,
    path=_PATHS,
    writer_id=st.integers(min_value=0, max_value=2**31 - 1),
    key_count=_COUNTS,
    file_size_in_bytes=_COUNTS,
    table=_TABLES,
)


@given(
    data_files=st.lists(_DATA_FILES, max_size=5),
    key_files=st.lists(_KEY_FILES, max_size=5),
    properties=st.dictionaries(_PATHS, _PATHS, max_size=3),
)
def test_every_record_round_trips_in_the_version_its_key_files_call_for(
    data_files: list[DataFileEntry], key_files: list[KeyFileEntry], properties: dict[str, str]
) -> None:
    metadata = PreCommitMetadata(
        table="db.t", data_files=tuple(data_files), properties=properties, key_files=tuple(key_files)
    )
    encoded = encode(metadata)
    decoded = decode(encoded)
    assert json.loads(encoded)["version"] == (KEYED_VERSION if key_files else VERSION)
    assert decoded.by_table() == metadata.by_table()
    assert decoded.key_files_by_table() == metadata.key_files_by_table()
    assert decoded.properties == properties
    assert encode(decoded) == encoded
    if not key_files:  # an append stream's record is the version 1 an older release reads: no key files field
        record = json.loads(encoded)
        assert "key_files" not in record and all("key_files" not in table for table in record["tables"])
