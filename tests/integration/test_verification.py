"""The verifier on real sinks (PostgreSQL log, SQL catalog): a correct sink verifies, each kind of fault is found and
named (table, epoch, first offsets or keys), and an incremental verification reads only what came after."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator_service.contract.errors import InvalidArgument, NotFound
from coordinator_service.contract.source_positions import END_OFFSETS
from coordinator_service.engine.verification.findings import FaultKind, Verification
from coordinator_service.engine.verification.ranges import BAD_RECORDS, ON_BAD_RECORD, RECORDS_READ
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.engine.verification.verifier import VerifiedTable, Verifier
from coordinator_service.engine.writer_requests import PreCommitRequest
from coordinator_service.failpoints import Failpoint
from tests.fixtures.admin import AdminApp, AdminFactory, Gate
from tests.fixtures.coordinator import write_parquet
from tests.fixtures.kafka_broker import produce_keyed
from tests.fixtures.keyed_tables import KEYED, Upsert, epoch_files

POSITIONED = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
    ]
)
TOPIC = "orders"


def rows(topic: str, offsets: Sequence[int]) -> list[dict[str, object]]:
    return [{"order_id": o, "kafka_topic": topic, "kafka_partition": 0, "kafka_offset": o} for o in offsets]


@dataclass
class PositionedSink:
    """A sink whose table has the writer's Kafka position columns, its epochs' ranges in their properties."""

    admin: AdminApp
    name: str
    topic: str = TOPIC
    epoch: int = -1
    end: int = 0

    @property
    def table(self) -> str:
        return f"db.{self.name}"

    async def register(self) -> None:
        self.registration = await self.admin.runtime.coordinator.register_writer(
            self.name, self.table, -1, arrow_schema=POSITIONED.serialize().to_pybytes()
        )

    async def epoch_of(
        self,
        count: int,
        start: int | None = None,
        offsets: Sequence[int] | None = None,
        properties: Mapping[str, str] | None = None,
        checkpoint: bool = True,
    ) -> str:
        """Commit the next epoch, reading `count` offsets from `start` (its declared start; by default where the
        previous one ended), its rows at `offsets` (by default each offset of its range once); its file's URI."""
        self.epoch += 1
        first = self.end if start is None else start
        end = first + count
        written = rows(self.topic, range(first, end) if offsets is None else offsets)
        path = write_parquet(self.registration.table_location, written, POSITIONED) if written else ""
        properties = {**(properties or {}), END_OFFSETS: json.dumps({self.topic: {"0": end}})}
        if self.epoch == 0 or start is not None:
            spark = [{"$start": {self.topic: {"0": first}}, self.topic: {"0": end}}]
            properties["spark.end_offsets"] = json.dumps(spark)
        await self.admin.runtime.coordinator.pre_commit(
            PreCommitRequest(
                sink=self.name,
                epoch=self.epoch,
                writer_term=self.registration.writer_term,
                paths=(path,) if path else (),
                properties=properties,
            )
        )
        if checkpoint:
            await self.admin.checkpoint(self.name, self.registration, self.epoch)
        self.end = end
        return path

    async def verify(self, **kwargs: object) -> Verification:
        verifier = Verifier(self.admin.runtime.database, self.admin.runtime.iceberg)
        return await verifier.verify(self.name, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def positioned(admin: AdminApp) -> Callable[..., PositionedSink]:
    def make(name: str = "verified", topic: str = TOPIC) -> PositionedSink:
        return PositionedSink(admin, name, topic)

    return make


def kinds(verification: Verification) -> list[tuple[FaultKind, int | None]]:
    return [(fault.kind, fault.epoch) for fault in verification.faults]


async def test_a_correct_sink_verifies(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    for _ in range(3):
        await sink.epoch_of(10)
    verification = await sink.verify()
    assert verification.ok, verification.faults
    [table] = verification.tables
    assert table.deep and table.verified_epoch == 2 and table.rows_read == 30
    assert verification.end_offsets == {(TOPIC, 0): 30}


async def test_an_epoch_overlapping_the_one_before_is_named(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10, start=5)
    verification = await sink.verify()
    assert (FaultKind.OVERLAP, 1) in kinds(verification)
    overlap = next(fault for fault in verification.faults if fault.kind is FaultKind.OVERLAP)
    assert overlap.table == "db.verified" and "offsets 5 to 9 read twice" in overlap.detail
    duplicate = next(fault for fault in verification.faults if fault.kind is FaultKind.DUPLICATE_POSITION)
    assert f"{TOPIC}-0@5 is in 2 live rows" in duplicate.detail


async def test_a_gap_between_epochs_is_named(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10, start=12)
    verification = await sink.verify()
    assert kinds(verification) == [(FaultKind.GAP, 1)]
    assert "offsets 10 to 11 never read" in verification.faults[0].detail


async def test_a_file_added_twice_by_hand_is_found(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    path = await sink.epoch_of(10)
    await sink.epoch_of(10)
    table = sink.admin.runtime.iceberg.load(sink.table)
    table.add_files([path], check_duplicate_files=False)
    verification = await sink.verify()
    found = kinds(verification)
    assert (FaultKind.FOREIGN_CHANGE, None) in found and (FaultKind.DUPLICATE_POSITION, 0) in found
    foreign = next(fault for fault in verification.faults if fault.kind is FaultKind.FOREIGN_CHANGE)
    assert path in foreign.detail and "added 1 files (10 rows)" in foreign.detail


async def test_a_row_appended_outside_the_coordinator_is_found(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    table = sink.admin.runtime.iceberg.load(sink.table)
    table.append(pa.Table.from_pylist(rows(TOPIC, [3]), schema=POSITIONED))
    verification = await sink.verify()
    duplicate = next(fault for fault in verification.faults if fault.kind is FaultKind.DUPLICATE_POSITION)
    assert duplicate.epoch == 0 and f"{TOPIC}-0@3 is in 2 live rows" in duplicate.detail
    assert (FaultKind.FOREIGN_CHANGE, None) in kinds(verification)


async def test_rows_from_outside_the_committed_range_are_found(positioned: Callable[..., PositionedSink]) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10, offsets=[*range(9), 12])
    verification = await sink.verify()
    outside = next(fault for fault in verification.faults if fault.kind is FaultKind.OUTSIDE_RANGE)
    assert outside.detail == f"1 live rows from offsets outside the committed range: {TOPIC}-0@12"


async def test_a_key_twice_in_an_upsert_table_is_found(admin: AdminApp) -> None:
    keyed = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("value", pa.string())])
    await admin.runtime.coordinator.register_writer(
        "keyed", "db.keyed", -1, arrow_schema=keyed.serialize().to_pybytes(), key_columns=("id",)
    )
    table = admin.runtime.iceberg.load("db.keyed")
    table.append(pa.Table.from_pylist([{"id": 1, "value": "a"}, {"id": 2, "value": "b"}], schema=keyed))
    table.append(pa.Table.from_pylist([{"id": 2, "value": "c"}], schema=keyed))
    verification = await Verifier(admin.runtime.database, admin.runtime.iceberg).verify("keyed")
    duplicate = next(fault for fault in verification.faults if fault.kind is FaultKind.DUPLICATE_KEY)
    assert duplicate.table == "db.keyed" and "{'id': 2}" in duplicate.detail


async def test_a_record_missing_from_the_table_against_the_topic(
    positioned: Callable[..., PositionedSink], kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, [(0, b"k%d" % i) for i in range(30)])
    sink = positioned(topic=topic)
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10, offsets=[o for o in range(10, 20) if o != 17])
    await sink.epoch_of(10)
    access = KafkaAccess(kafka_bootstrap)
    assert (await sink.verify()).ok, "without Kafka access the shallow and deep checks cannot see it"
    verification = await sink.verify(kafka=access)
    [missing] = verification.faults
    assert missing.kind is FaultKind.MISSING_RECORD and missing.epoch == 1
    assert f"{topic}-0@17" in missing.detail and verification.tables[0].kafka


async def test_an_incremental_verification_against_the_topic_finds_a_record_the_new_epochs_lack(
    positioned: Callable[..., PositionedSink], kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    """The new epochs' rows, read as written (the topic a dictionary array), are checked against the topic's offsets
    from where the last verification stood, as a whole verification's are."""
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, [(0, b"k%d" % i) for i in range(30)])
    sink = positioned(topic=topic)
    await sink.register()
    await sink.epoch_of(10)
    access = KafkaAccess(kafka_bootstrap)
    whole = await sink.verify(kafka=access)
    assert whole.ok, whole.faults
    [table] = whole.tables
    since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, whole.end_offsets)}
    await sink.epoch_of(10, offsets=[o for o in range(10, 20) if o != 13])
    await sink.epoch_of(10)

    later = await sink.verify(kafka=access, since=since)

    [missing] = later.faults
    assert missing.kind is FaultKind.MISSING_RECORD and missing.epoch == 1
    assert f"{topic}-0@13" in missing.detail
    [newer] = later.tables
    assert newer.kafka and newer.rows_read == 19


async def test_an_upsert_tables_superseded_records_are_no_missing_records_against_the_topic(
    admin: AdminApp, kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    """An upsert or change stream's live rows carry the position of each key's last record only (--kafka-metadata):
    a record a later one of its key replaced, or a delete, is in no live row by design. The old code held them to
    the append stream's rule and named every superseded record a missing-record (the e2e op-field change stream's
    table, which its own check found right)."""
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, [(0, b"k%d" % i) for i in range(4)])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), *POSITIONED.remove(0)])
    registration = await admin.runtime.coordinator.register_writer(
        "keyed", "db.keyed", -1, arrow_schema=schema.serialize().to_pybytes(), key_columns=("id",)
    )
    # Offsets 0..2 are keys 1, 2, 1 (epoch 0 leaves 1@2 and 2@1); offset 3 is key 2 again (epoch 1 leaves 2@3).
    for epoch, (first, end, last_records) in enumerate([(0, 3, {1: 2, 2: 1}), (3, 4, {2: 3})]):
        rows = [
            {"id": key, "kafka_topic": topic, "kafka_partition": 0, "kafka_offset": offset}
            for key, offset in last_records.items()
        ]
        location = registration.table_location
        data = write_parquet(location, rows, schema)
        keys = write_parquet(location, [{"id": key} for key in last_records], pa.schema([schema.field("id")]))
        properties = {END_OFFSETS: json.dumps({topic: {"0": end}}), RECORDS_READ: str(end - first)}
        if epoch == 0:
            properties["spark.end_offsets"] = json.dumps([{"$start": {topic: {"0": first}}, topic: {"0": end}}])
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(
                "keyed", epoch, registration.writer_term, (data,), key_paths=(keys,), properties=properties
            )
        )
        await admin.checkpoint("keyed", registration, epoch)
    verifier = Verifier(admin.runtime.database, admin.runtime.iceberg)
    verification = await verifier.verify("keyed", KafkaAccess(kafka_bootstrap))
    assert verification.ok, verification.faults
    [table] = verification.tables
    assert table.deep and not table.kafka
    assert any("each key's last record" in note for note in table.notes), table.notes


async def test_an_incremental_verification_reads_only_the_new_snapshots(
    positioned: Callable[..., PositionedSink],
) -> None:
    sink = positioned()
    await sink.register()
    for _ in range(3):
        await sink.epoch_of(10)
    whole = await sink.verify()
    [table] = whole.tables
    assert table.files_read == 3
    since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, whole.end_offsets)}
    await sink.epoch_of(10)
    await sink.epoch_of(10)
    later = await sink.verify(since=since)
    [newer] = later.tables
    assert later.ok, later.faults
    assert (newer.files_read, newer.manifests_read, newer.rows_read) == (2, 2, 20)
    assert newer.verified_epoch == 4 and later.end_offsets == {(TOPIC, 0): 50}
    # A duplicate of a verified record in a new epoch is still found: it lies below where verification stood.
    await sink.epoch_of(10, start=45)
    since = {newer.table: VerifiedTable(newer.snapshot_id, newer.verified_epoch, later.end_offsets)}
    assert (FaultKind.OVERLAP, 5) in kinds(await sink.verify(since=since))


async def test_hostile_input_is_refused(admin: AdminApp) -> None:
    verifier = Verifier(admin.runtime.database, admin.runtime.iceberg)
    for name in ("", "no such sink", "x" * 5000, "a\x00b"):
        with pytest.raises(NotFound):
            await verifier.verify(name)
    for servers, options in [
        ("", {}),
        ("host:9092\nother", {}),
        ("host:9092", {"group.id": "mine"}),
        ("host:9092", {"Bad Name": "x"}),
        ("host:9092", {"security.protocol": "a\x00"}),
    ]:
        with pytest.raises(InvalidArgument):
            KafkaAccess(servers, options)


def verify_command(database_url: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", "verify", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "SINK_COORDINATOR_DATABASE_URL": database_url,
            "SINK_COORDINATOR_DATA_DIR": str(data_dir),
        },
    )


async def test_the_command_line_and_the_api_answer_alike(
    positioned: Callable[..., PositionedSink], database_url: str, tmp_path: Path
) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10)
    api = await sink.admin.post("/api/v1/sinks/verified/verify", json={})
    assert api.status_code == 200 and api.json()["ok"], api.text
    cli = await asyncio.to_thread(verify_command, database_url, tmp_path / "coordinator", "verified", "--json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == api.json()

    await sink.epoch_of(10, start=25)
    api = await sink.admin.post("/api/v1/sinks/verified/verify", json={"incremental": True})
    cli = await asyncio.to_thread(
        verify_command, database_url, tmp_path / "coordinator", "verified", "--incremental", "--json"
    )
    assert cli.returncode == 1 and json.loads(cli.stdout) == api.json()
    [fault] = api.json()["tables"][0]["faults"]
    assert (fault["kind"], fault["epoch"], fault["table"]) == ("gap", 2, "db.verified")
    plain = await asyncio.to_thread(verify_command, database_url, tmp_path / "coordinator", "verified")
    assert plain.returncode == 1 and "gap epoch 2: starts at orders-0@25" in plain.stdout

    state = (await sink.admin.get("/api/v1/sinks/verified/verification")).json()
    [table] = state["tables"]
    # The failed verification keeps where the proof stood: epoch 1, so the next one finds the gap again.
    assert (table["outcome"], table["verified_epoch"], table["faults"][0]["kind"]) == ("failed", 1, "gap")
    assert table["end_offsets"] == {TOPIC: {"0": 20}}


async def test_hostile_verify_requests_are_refused_with_nothing_recorded(
    positioned: Callable[..., PositionedSink], database_url: str, tmp_path: Path
) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    for body in [
        {"incremental": "yes"},
        {"unknown": 1},
        {"bootstrap_servers": ""},
        {"bootstrap_servers": "a:1\nb:2"},
        {"kafka_options": {"security.protocol": "SSL"}},
        {"bootstrap_servers": "a:1", "kafka_options": {"group.id": "theirs"}},
        {"bootstrap_servers": "a:1", "kafka_options": {"x" * 3000: "y"}},
        {"bootstrap_servers": "a:1", "kafka_options": {f"k{i}": "v" for i in range(51)}},
    ]:
        answer = await sink.admin.post("/api/v1/sinks/verified/verify", json=body)
        assert answer.status_code == 422, (body, answer.text)
    assert (await sink.admin.post("/api/v1/sinks/nope/verify", json={})).status_code == 404
    assert (await sink.admin.get("/api/v1/sinks/verified/verification")).json()["tables"] == []
    for args in [
        ("verified", "--kafka-option", "security.protocol=SSL"),
        ("verified", "--bootstrap-servers", "a:1", "--kafka-option", "group.id=x"),
        ("verified", "--bootstrap-servers", "a:1", "--kafka-option", "novalue"),
    ]:
        refused = await asyncio.to_thread(verify_command, database_url, tmp_path / "coordinator", *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stderr.strip(), args
    unknown = await asyncio.to_thread(verify_command, database_url, tmp_path / "coordinator", "no such sink")
    assert unknown.returncode == 1 and "cannot verify: sink 'no such sink' is not registered" in unknown.stderr
    assert (await sink.admin.get("/api/v1/sinks/verified/verification")).json()["tables"] == []


def gauge(exposition: str, name: str, sink: str) -> float | None:
    found = re.search(rf'^{name}\{{sink="{sink}"\}} (\S+)$', exposition, flags=re.MULTILINE)
    return None if found is None else float(found.group(1))


async def test_the_maintenance_step_verifies_from_where_it_stood_and_the_gauges_say_how_far(
    admin_factory: AdminFactory,
) -> None:
    # Its own name: the counter is the process's, which other tests' sinks of another name leave alone.
    admin = await admin_factory(metrics_cache_seconds=0)
    sink = PositionedSink(admin, "continuous")
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10)
    run = await admin.post("/api/v1/sinks/continuous/maintenance/run")
    assert run.json()["outcome"] == "ok"
    assert (await admin.get("/api/v1/sinks/continuous/verification")).json()["tables"] == [], "off by default"

    overrides = {"overrides": {"verification_enabled": True, "verification_interval_seconds": 3600}}
    assert (await admin.put("/api/v1/sinks/continuous/maintenance", json=overrides)).status_code == 200
    assert (await admin.post("/api/v1/sinks/continuous/maintenance/run")).json()["outcome"] == "ok"
    [table] = (await admin.get("/api/v1/sinks/continuous/verification")).json()["tables"]
    assert (table["outcome"], table["verified_epoch"], table["deep"]) == ("ok", 1, True)
    metrics = (await admin.get("/metrics")).text
    assert gauge(metrics, "sink_coordinator_verified_epoch", "continuous") == 1
    assert gauge(metrics, "sink_coordinator_verification_failed", "continuous") == 0
    assert gauge(metrics, "sink_coordinator_verification_failures_total", "continuous") == 0

    await sink.epoch_of(10)
    await sink.epoch_of(10, start=35)
    assert (await admin.post("/api/v1/sinks/continuous/maintenance/run")).json()["outcome"] == "ok"
    [table] = (await admin.get("/api/v1/sinks/continuous/verification")).json()["tables"]
    assert (table["outcome"], table["verified_epoch"]) == ("failed", 1)
    assert [(fault["kind"], fault["epoch"]) for fault in table["faults"]] == [("gap", 3)]
    metrics = (await admin.get("/metrics")).text
    assert gauge(metrics, "sink_coordinator_verified_epoch", "continuous") == 1
    assert gauge(metrics, "sink_coordinator_verification_failed", "continuous") == 1
    assert gauge(metrics, "sink_coordinator_verification_failures_total", "continuous") == 1


async def test_the_consoles_sink_page_shows_the_verification_badge_and_report(
    positioned: Callable[..., PositionedSink],
) -> None:
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10)
    page = (await sink.admin.get("/console/sinks/verified")).text
    assert '<span class="badge">never verified</span>' in page and "verification-report" not in page

    await sink.admin.post("/api/v1/sinks/verified/verify", json={})
    page = (await sink.admin.get("/console/sinks/verified")).text
    assert re.search(r'<span class="badge healthy">verified</span>\s*up to epoch 1', page)
    assert re.search(r'data-table="db.verified"><td>db.verified</td>\s*<td><span class="badge healthy">ok', page)

    await sink.epoch_of(10, start=25)
    await sink.admin.post("/api/v1/sinks/verified/verify", json={"incremental": True})
    page = (await sink.admin.get("/console/sinks/verified")).text
    assert re.search(r'<span class="badge stuck">fault found</span>\s*up to epoch 1', page)
    assert "gap in epoch 2: starts at orders-0@25, the previous epoch ended at 20: offsets 20 to 24 never read" in page


async def test_epochs_without_files_in_the_table_verify_whole_and_incrementally(
    positioned: Callable[..., PositionedSink],
) -> None:
    """An epoch whose records all went elsewhere (a dead-letter topic) commits no snapshot: the newest snapshot's end
    offsets are its epoch's, not the newest epoch's, and the incremental verification goes on from the newest."""
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10, offsets=[], properties={"sink-coordinator.bad-records": "10"})
    whole = await sink.verify()
    assert whole.ok, whole.faults
    [table] = whole.tables
    assert table.verified_epoch == 1 and whole.end_offsets == {(TOPIC, 0): 20}
    since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, whole.end_offsets)}
    await sink.epoch_of(10)
    later = await sink.verify(since=since)
    assert later.ok and later.tables[0].verified_epoch == 2, later.faults


async def test_a_table_that_holds_no_row_yet_is_verified_deep(positioned: Callable[..., PositionedSink]) -> None:
    """A table without a snapshot as of the committed epoch (its epochs' records all went elsewhere: other tables of a
    fan-out, the dead-letter topic) holds no row, so no row of it is at fault: with the position columns its deep
    checks hold, and the report says deep (it said shallow, as of a table without the columns)."""
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10, offsets=[], properties={"sink-coordinator.bad-records": "10"})
    verification = await sink.verify()
    assert verification.ok, verification.faults
    [table] = verification.tables
    assert table.snapshot_id is None and table.rows_read == 0
    assert table.deep, "a table without rows, with the position columns, reported shallow"


async def test_a_commit_landing_between_the_log_and_the_table_reads_is_not_a_fault(
    positioned: Callable[..., PositionedSink], gates: Callable[[Failpoint], Gate]
) -> None:
    """The committer appends before the log says COMMITTED: a verification then reads the table as of the newest
    snapshot at or below the log's committed epoch, not the newer append's rows as outside the range."""
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10)
    appended = gates(Failpoint.COMMIT_AFTER_APPEND)
    path = write_parquet(sink.registration.table_location, rows(TOPIC, range(20, 30)), POSITIONED)
    await sink.admin.runtime.coordinator.pre_commit(
        PreCommitRequest(
            sink=sink.name,
            epoch=2,
            writer_term=sink.registration.writer_term,
            paths=(path,),
            properties={END_OFFSETS: json.dumps({TOPIC: {"0": 30}})},
        )
    )
    await sink.admin.checkpoint(sink.name, sink.registration, 2, wait=False)
    await appended.wait_reached()
    try:
        verification = await sink.verify()
    finally:
        appended.open()
    assert verification.ok, verification.faults
    [table] = verification.tables
    assert (table.verified_epoch, table.rows_read) == (1, 20)
    assert verification.end_offsets == {(TOPIC, 0): 20}


async def test_an_incremental_verification_after_a_compaction_reads_only_the_new_rows(
    admin_factory: AdminFactory,
) -> None:
    """A rewrite of the same rows (compaction) between two verifications is no fault, and the rows it rewrote are not
    read again: the new snapshots are not all appends, so the new files are found by a scan of the live ones."""
    admin = await admin_factory(compaction_min_files=2)
    admin.runtime.committer.after_append = lambda sink, table: None  # no maintenance run but the test's
    sink = PositionedSink(admin, "compacted")
    await sink.register()
    for _ in range(3):
        await sink.epoch_of(10)
    whole = await sink.verify()
    [table] = whole.tables
    since = {table.table: VerifiedTable(table.snapshot_id, table.verified_epoch, whole.end_offsets)}
    run = (await admin.post("/api/v1/sinks/compacted/maintenance/run")).json()
    assert run["outcome"] == "ok" and run["files_compacted"] == 3, run
    await sink.epoch_of(10)
    later = await sink.verify(since=since)
    assert later.ok, later.faults
    [newer] = later.tables
    assert (newer.rows_read, newer.files_read, newer.verified_epoch) == (10, 1, 3)


async def test_an_epoch_an_operator_aborted_is_lost_by_design_not_a_fault(
    positioned: Callable[..., PositionedSink], kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    """Its records are in no table on purpose (docs/operations.md, "Abort an epoch"): a note names its range, the
    next epoch starts where it ended, and the topic's records of it are not missing records of another epoch."""
    topic = kafka_topic(partitions=1)
    produce_keyed(kafka_bootstrap, topic, [(0, b"k%d" % i) for i in range(30)])
    sink = positioned(topic=topic)
    await sink.register()
    await sink.epoch_of(10)
    await sink.epoch_of(10, checkpoint=False)
    aborted = await sink.admin.post(
        "/api/v1/sinks/verified/epochs/1/abort", json={"reason": "a poison batch", "force": True}
    )
    assert aborted.status_code == 200, aborted.text
    await sink.epoch_of(10)
    verification = await sink.verify(kafka=KafkaAccess(kafka_bootstrap))
    assert verification.ok, verification.faults
    [table] = verification.tables
    assert table.kafka and table.verified_epoch == 2
    assert any(f"epoch 1 was aborted by an operator: its range {topic}-0@10 to {topic}-0@20" in n for n in table.notes)
    assert any("10 records of epochs an operator aborted are in no row" in note for note in table.notes)


async def test_an_epoch_whose_files_hold_other_rows_than_its_writer_read_is_named(
    positioned: Callable[..., PositionedSink],
) -> None:
    """The writer says how many Kafka records each batch read: an epoch whose files hold fewer rows (a task's file
    lost before the pre-commit, rows dropped by a decoding defect) is a fault even where the topic's offsets could
    hide it (compaction, transaction markers make fewer rows than offsets legitimate), and records sent to the
    dead-letter topic are the only ones that may be missing. On the old code the epoch with a row short verified ok
    (only noted: 'offsets of its range in no row')."""
    sink = positioned()
    await sink.register()
    await sink.epoch_of(10, properties={RECORDS_READ: "10"})
    await sink.epoch_of(10, offsets=range(10, 19), properties={RECORDS_READ: "10"})
    dead_letter = {RECORDS_READ: "10", BAD_RECORDS: "2", ON_BAD_RECORD: "dead-letter"}
    await sink.epoch_of(10, offsets=range(20, 28), properties=dead_letter)
    # Under the null policy records that did not fit are rows: the same count short is a fault.
    await sink.epoch_of(10, offsets=range(30, 38), properties={**dead_letter, ON_BAD_RECORD: "null"})
    verification = await sink.verify()
    assert kinds(verification) == [(FaultKind.ROWS_NOT_READ, 1), (FaultKind.ROWS_NOT_READ, 3)]
    assert "its files hold 9 rows, its writer read 10 records: 10 rows expected" in verification.faults[0].detail
    assert "its files hold 8 rows, its writer read 10 records: 10 rows expected" in verification.faults[1].detail


async def test_a_keyed_epoch_holds_at_most_a_row_per_record_read(admin: AdminApp) -> None:
    """An upsert stream's epoch leaves the last version of each key it touched: fewer rows than records is how it
    works, more is a fault."""
    registration = await admin.runtime.coordinator.register_writer(
        "keyed", "db.keyed", -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=("id",)
    )
    for epoch, (read, operations) in enumerate(
        [(5, [Upsert(1, "eu", "a"), Upsert(2, "eu", "b")]), (1, [Upsert(3, "eu", "c"), Upsert(4, "eu", "d")])]
    ):
        paths, keys = epoch_files(registration.table_location, operations)
        await admin.runtime.coordinator.pre_commit(
            PreCommitRequest(
                "keyed", epoch, registration.writer_term, paths, key_paths=keys, properties={RECORDS_READ: str(read)}
            )
        )
        await admin.checkpoint("keyed", registration, epoch)
    verification = await Verifier(admin.runtime.database, admin.runtime.iceberg).verify("keyed")
    assert kinds(verification) == [(FaultKind.ROWS_NOT_READ, 1)]
    assert "its files hold 2 rows, its writer read 1 records: at most 1 rows expected" in verification.faults[0].detail


async def test_a_compaction_that_applies_a_keyed_tables_position_deletes_is_no_fault(
    admin_factory: AdminFactory,
) -> None:
    """Compaction of an upsert table writes only the live rows of the files it rewrites, fewer than they held: on the
    old code every such compaction was a 'foreign-change' (the e2e upsert stream met it: 'snapshot ... (replace) was
    not written by the coordinator and added 1 files (232 rows), deleted 344 rows')."""
    admin = await admin_factory(compaction_min_files=2, compaction_delete_files_min=1)
    admin.runtime.committer.after_append = lambda sink, table: None  # no maintenance run but the test's
    registration = await admin.runtime.coordinator.register_writer(
        "keyed", "db.keyed", -1, arrow_schema=KEYED.serialize().to_pybytes(), key_columns=("id",)
    )
    epochs = [
        [Upsert(key, "eu", "a") for key in range(6)],
        [Upsert(key, "eu", "b") for key in range(0, 6, 2)],
        [Upsert(1, "eu", "c"), Upsert(7, "eu", "c")],
    ]
    for epoch, operations in enumerate(epochs):
        paths, keys = epoch_files(registration.table_location, operations)
        request = PreCommitRequest(
            "keyed", epoch, registration.writer_term, paths, key_paths=keys, properties={RECORDS_READ: "6"}
        )
        await admin.runtime.coordinator.pre_commit(request)
        await admin.checkpoint("keyed", registration, epoch)
    run = (await admin.post("/api/v1/sinks/keyed/maintenance/run")).json()
    assert run["outcome"] == "ok" and run["files_compacted"] == 3, run
    verification = await Verifier(admin.runtime.database, admin.runtime.iceberg).verify("keyed")
    assert verification.ok, verification.faults
