"""Keyed sinks at the coordinator (issue 29's contract): a sink's key is recorded when it is created and never
changes, its tables are keyed by it, an epoch's key files are checked, recorded (pre-commit metadata version 2) and
claimed like its data files. Their commit as row deltas is tests/integration/test_keyed_commit.py's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorRpcError, PreCommitFile
from coordinator_service.contract.errors import FailedPrecondition, InvalidArgument
from coordinator_service.contract.views import PreCommitOutcome, Registration
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from coordinator_service.log.precommit_metadata import KEYED_VERSION, VERSION, KeyFileEntry
from spark_writer.sink.parquet_writer import serialize_footer
from tests.fixtures.admin import AdminApp, epoch_metadata, eventually
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, write_parquet
from tests.fixtures.keyed_tables import KEY_SCHEMA, KEYED
from tests.fixtures.postgres import query

SINK = "orders"
TABLE = "db.orders"
KEY = ("id",)


async def keyed_sink(admin: AdminApp, key: tuple[str, ...] = KEY, sink: str = SINK) -> Registration:
    return await admin.runtime.coordinator.register_writer(
        sink, TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=key
    )


def rows(ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "region": "eu", "value": f"v{i}"} for i in ids]


def write_keys(location: str, ids: list[int], schema: pa.Schema = KEY_SCHEMA) -> str:
    return write_parquet(location, [{name: i for name in schema.names} for i in ids], schema)


def file_size(uri: str) -> int:
    return Path(uri.removeprefix("file://")).stat().st_size


def raw_metadata(database_url: str, epoch: int) -> dict[str, Any]:
    [(metadata,)] = query(database_url, "SELECT metadata FROM pending_sink_state WHERE epoch = %s", epoch)
    assert isinstance(metadata, bytes)
    document = json.loads(metadata)
    assert isinstance(document, dict)
    return document


def claims(database_url: str) -> dict[str, tuple[object, ...]]:
    return {
        str(path): (epoch, attempt)
        for path, epoch, attempt in query(database_url, "SELECT path, epoch, attempt FROM epoch_files")
    }


async def test_a_keyed_sink_records_its_key_and_creates_its_table_keyed(
    admin: AdminApp, catalog: Catalog, database_url: str
) -> None:
    registration = await keyed_sink(admin)
    assert registration.key_columns == KEY
    table = catalog.load_table(TABLE)
    assert table.format_version == 2
    assert [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids] == ["id"]
    assert query(database_url, "SELECT key_columns FROM sinks") == [(["id"],)]
    again = await keyed_sink(admin)  # the same key: a new term, as ever
    assert (again.writer_term, again.key_columns) == (registration.writer_term + 1, KEY)


@pytest.mark.parametrize("key", [(), ("id", "region"), ("region",)], ids=["none", "wider", "other"])
async def test_a_sinks_key_never_changes(admin: AdminApp, catalog: Catalog, key: tuple[str, ...]) -> None:
    registration = await keyed_sink(admin)
    with pytest.raises(FailedPrecondition, match="a sink's key is fixed when it is created"):
        await keyed_sink(admin, key)
    assert catalog.load_table(TABLE).schema().identifier_field_ids == [1]
    state = await admin.runtime.coordinator.sink_state(SINK)
    assert state.writer_term == registration.writer_term  # nothing changed


async def test_an_append_sink_does_not_become_keyed(admin: AdminApp) -> None:
    await admin.register("plain", table="db.plain")
    with pytest.raises(FailedPrecondition, match=r"has no key \(an append stream\), but its writer names the key 'id'"):
        await admin.runtime.coordinator.register_writer(
            "plain", "db.plain", -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY
        )


@pytest.mark.parametrize("key", [("id", "id"), ("",), ("i\x00d",), tuple(f"c{i}" for i in range(33))])
async def test_a_key_no_table_could_have_is_refused_before_anything_exists(
    admin: AdminApp, catalog: Catalog, key: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidArgument):
        await keyed_sink(admin, key)
    assert not catalog.table_exists(TABLE)
    assert query(admin.runtime.settings.database_url.get_secret_value(), "SELECT count(*) FROM sinks") == [(0,)]


async def test_every_table_of_a_keyed_sink_is_keyed_by_its_key(admin: AdminApp, catalog: Catalog) -> None:
    registration = await keyed_sink(admin)
    schema = KEYED.serialize().to_pybytes()
    coordinator = admin.runtime.coordinator
    ensured = await coordinator.ensure_tables(SINK, registration.writer_term, [TableRequest("db.eu", schema, (), KEY)])
    assert [(each.table, each.key_columns) for each in ensured.tables] == [("db.eu", KEY)]
    assert catalog.load_table("db.eu").schema().identifier_field_ids == [1]
    for key in [(), ("id", "region")]:
        with pytest.raises(FailedPrecondition, match="a sink's key is fixed"):
            await coordinator.ensure_tables(SINK, registration.writer_term, [TableRequest("db.us", schema, (), key)])
    assert not catalog.table_exists("db.us")


async def test_an_epochs_key_files_are_checked_recorded_and_claimed(admin: AdminApp, database_url: str) -> None:
    registration = await keyed_sink(admin)
    data = write_parquet(registration.table_location, rows([1, 2]), KEYED)
    keys = write_keys(registration.table_location, [1, 2, 3])
    request = PreCommitRequest(SINK, 0, registration.writer_term, (data,), key_paths=(keys,))
    result = await admin.runtime.coordinator.pre_commit(request)
    assert (result.outcome, result.record_count) == (PreCommitOutcome.PERSISTED, 2)

    document = raw_metadata(database_url, 0)
    assert document["version"] == KEYED_VERSION
    [own] = document["tables"]
    size = file_size(keys)
    assert own["key_files"] == [{"path": keys, "writer_id": 0, "file_size_in_bytes": size, "key_count": 3}]
    assert epoch_metadata(database_url, 0).key_files == (KeyFileEntry(keys, 0, 3, size),)
    assert claims(database_url) == {data: (0, 1), keys: (0, 1)}
    # The same pre-commit again is the same answer; other key files in the same term are a conflict.
    assert (await admin.runtime.coordinator.pre_commit(request)).attempt == 1
    other = write_keys(registration.table_location, [1, 2])
    with pytest.raises(FailedPrecondition, match="already pre-committed with other data files"):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(SINK, 0, registration.writer_term, (data,), key_paths=(other,))
        )


async def test_an_epoch_that_only_deletes_is_recorded_with_its_key_files(admin: AdminApp, database_url: str) -> None:
    registration = await keyed_sink(admin)
    keys = write_keys(registration.table_location, [7])
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(SINK, 0, registration.writer_term, (), key_paths=(keys,))
    )
    assert raw_metadata(database_url, 0)["version"] == KEYED_VERSION
    assert [entry.path for entry in epoch_metadata(database_url, 0).key_files] == [keys]


async def test_an_empty_epoch_of_a_keyed_sink_is_a_version_1_record(admin: AdminApp, database_url: str) -> None:
    registration = await keyed_sink(admin)
    await admin.runtime.coordinator.pre_commit(PreCommitRequest(SINK, 0, registration.writer_term, ()))
    assert raw_metadata(database_url, 0)["version"] == VERSION
    assert await admin.checkpoint(SINK, registration, 0) == 0  # an empty epoch changes no row: committed as ever


BAD_KEY_FILES: list[tuple[str, str]] = [
    ("extra column", "holds the columns 'id, region, value': a key file of table 'db.orders' holds exactly its key's"),
    ("other column", "holds the columns 'key'"),
    ("nullable key", "does not fit the key of table 'db.orders'"),
    ("outside the data directory", "key file 'file://"),
    ("missing", "does not exist"),
    ("not parquet", "is not a readable Parquet file"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_KEY_FILES, ids=[bad for bad, _ in BAD_KEY_FILES])
async def test_a_bad_key_file_is_refused_and_changes_nothing(
    admin: AdminApp, database_url: str, bad: str, message: str
) -> None:
    registration = await keyed_sink(admin)
    location = registration.table_location
    data = write_parquet(location, rows([1]), KEYED)
    if bad == "extra column":
        keys = write_parquet(location, rows([1]), KEYED)
    elif bad == "other column":
        keys = write_keys(location, [1], pa.schema([pa.field("key", pa.int64(), nullable=False)]))
    elif bad == "nullable key":
        keys = write_keys(location, [1], pa.schema([pa.field("id", pa.int64())]))
    elif bad == "outside the data directory":
        path = Path(location.removeprefix("file://")) / "keys.parquet"
        pq.write_table(pa.Table.from_pylist([{"id": 1}], KEY_SCHEMA), path)
        keys = path.as_uri()
    elif bad == "missing":
        keys = f"{location}/data/missing.parquet"
    else:
        path = Path(location.removeprefix("file://")) / "data" / "text.parquet"
        path.write_text("not parquet")
        keys = path.as_uri()
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(SINK, 0, registration.writer_term, (data,), key_paths=(keys,))
        )
    assert query(database_url, "SELECT count(*) FROM pending_sink_state") == [(0,)]
    assert claims(database_url) == {}


async def test_key_files_are_refused_for_a_sink_without_a_key(admin: AdminApp, database_url: str) -> None:
    registration = await admin.register(SINK)
    keys = write_keys(registration.table_location, [1], pa.schema([pa.field("order_id", pa.int64(), nullable=False)]))
    with pytest.raises(InvalidArgument, match="the sink has no key"):
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(SINK, 0, registration.writer_term, (), key_paths=(keys,))
        )
    assert claims(database_url) == {}


async def test_an_aborted_keyed_epochs_key_files_are_deleted_by_the_cleaner(admin: AdminApp) -> None:
    registration = await keyed_sink(admin)
    data = write_parquet(registration.table_location, rows([1]), KEYED)
    keys = write_keys(registration.table_location, [1])
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest(SINK, 0, registration.writer_term, (data,), key_paths=(keys,))
    )
    aborted = await admin.post(f"/api/v1/sinks/{SINK}/epochs/0/abort", json={"reason": "test", "force": True})
    assert aborted.status_code == 200, aborted.text
    files = [Path(path.removeprefix("file://")) for path in (data, keys)]

    async def deleted() -> bool:
        return not any(file.exists() for file in files)

    await eventually(deleted, "the aborted epoch's data and key files deleted")


def test_key_files_cross_the_wire(coordinator: CoordinatorProcess, database_url: str, tmp_path: Path) -> None:
    with coordinator.client() as client:
        registration = client.register_writer(
            SINK, TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY
        )
        assert registration.key_columns == KEY
        keys = write_keys(registration.table_location, [1, 2])
        footer = serialize_footer(pq.read_metadata(keys.removeprefix("file://")))
        size = file_size(keys)
        result = client.pre_commit(SINK, 0, registration.writer_term, [], key_files=[PreCommitFile(keys, footer, size)])
        assert result.outcome is PreCommitOutcome.PERSISTED
        assert epoch_metadata(database_url, 0).key_files == (KeyFileEntry(keys, 0, 2, size),)
        wrong = PreCommitFile(keys, footer, size + 1)
        with pytest.raises(CoordinatorRpcError, match=r"is not \d+ bytes") as refused:
            client.pre_commit(SINK, 1, registration.writer_term, [], key_files=[wrong])
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_the_parts_of_a_multi_writer_keyed_epoch_keep_their_key_files(admin: AdminApp, database_url: str) -> None:
    registration = await admin.runtime.coordinator.register_writer(
        SINK, TABLE, -1, writer_count=2, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY
    )
    location = registration.table_location
    parts = [
        (write_parquet(location, rows([writer * 10]), KEYED), write_keys(location, [writer * 10, writer * 10 + 1]))
        for writer in (0, 1)
    ]
    answers = await asyncio.gather(
        *(
            admin.runtime.coordinator.pre_commit(
                PreCommitRequest(SINK, 0, registration.writer_term, (data,), writer_id=writer, key_paths=(keys,))
            )
            for writer, (data, keys) in enumerate(parts)
        )
    )
    assert [answer.outcome for answer in answers] == [PreCommitOutcome.PERSISTED] * 2
    recorded = epoch_metadata(database_url, 0)
    assert sorted((entry.writer_id, entry.path, entry.key_count) for entry in recorded.key_files) == [
        (writer, keys, 2) for writer, (_, keys) in enumerate(parts)
    ]
    assert set(claims(database_url)) == {path for part in parts for path in part}


async def test_a_removed_table_takes_its_key_files_out_of_the_epochs_not_committed(
    admin: AdminApp, database_url: str
) -> None:
    registration = await keyed_sink(admin)
    schema = KEYED.serialize().to_pybytes()
    coordinator = admin.runtime.coordinator
    [eu] = (
        await coordinator.ensure_tables(SINK, registration.writer_term, [TableRequest("db.eu", schema, (), KEY)])
    ).tables
    own_keys = write_keys(registration.table_location, [1])
    eu_keys = write_keys(eu.location, [2])
    await coordinator.pre_commit(
        PreCommitRequest(
            SINK, 0, registration.writer_term, (), key_paths=(own_keys, eu_keys), file_tables={eu_keys: "db.eu"}
        )
    )
    assert set(epoch_metadata(database_url, 0).key_files_by_table()) == {TABLE, "db.eu"}
    body = {"confirm": "db.eu", "reason": "test"}
    response = await admin.post(f"/api/v1/sinks/{SINK}/tables/db.eu/remove", json=body)
    assert response.status_code == 200, response.text
    assert [entry.path for entry in epoch_metadata(database_url, 0).key_files] == [own_keys]
    assert set(claims(database_url)) == {own_keys}


def test_the_sink_state_says_the_key_and_what_the_snapshots_markers_carry(
    coordinator: CoordinatorProcess, database_url: str
) -> None:
    """GetSinkState, through the real server: what a reader of the tables (spark_writer.fresh) checks its flags
    against and tells the sink's snapshots by."""
    with coordinator.client() as client:
        client.register_writer(SINK, TABLE, -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=KEY)
        client.register_writer("plain", "db.plain", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        keyed, plain = client.sink_state(SINK), client.sink_state("plain")
    incarnations = dict(query(database_url, "SELECT name, incarnation::text FROM sinks"))
    assert (keyed.key_columns, keyed.incarnation, keyed.generation) == (KEY, incarnations[SINK], 0)
    assert (plain.key_columns, plain.incarnation, plain.generation) == ((), incarnations["plain"], 0)
