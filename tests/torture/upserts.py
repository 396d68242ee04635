"""The torture runs' upsert mode (issue 29): the run's stream is an upsert stream, checked against its model.

`python -m tests.torture --mode upsert` runs the Spark job as `sink-writer --mode upsert --key id` over random
inserts, updates and deletes (tombstones) of overlapping keys (tests/fixtures/upsert_streams.py), every record of a
key in one partition, under the same fault kinds as the plain runs. Every record the run produces (its stream, and
what a fault produces: a load at `latest`, a topic's second life, the good records around bad ones) is the stream's
next change, known to the harness by a label (its id, where the plain runs use the order's id), so that what the
faults and the checks account for by position (retention, forced aborts, a deleted topic, a broker's losses) is
accounted for the same way here.

The check (`UpsertStream.check_rows`, in place of the plain runs' "every record once"): every record that had to be
read lies in the committed batches' ranges, and the table, read by pyiceberg and by DuckDB's Iceberg extension, is
the model: the last value of each key among the records of those ranges the topic still held (in the order they were
produced, which is Kafka's within the key's partition), a deleted key absent; no key twice; no equality delete file
in any snapshot or metadata file the table still has. The run's other checks (the log's invariants, the files, the
verifier) are the plain runs'.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pyiceberg.table import Table

from tests.fixtures.kafka_broker import ProducedRecord, produce_records
from tests.fixtures.upsert_streams import (
    ROW_DDL,
    Change,
    ChangeStream,
    Row,
    as_record,
    delete_file_kinds,
    duckdb_table_rows,
    model,
    pyiceberg_table_rows,
    upsert_record,
)
from tests.torture.checks import Expected, Findings

KEY: Final = ("id",)
REGIONS: Final = ("eu", "us")
# The row's region changes from record to record: in a table partitioned by it, a key's old row is in another
# partition than its new one.
UPSERT_DDL: Final = f"{ROW_DDL}, region STRING"
SHOWN: Final = 10
EQUALITY_SUMMARY_FIELDS: Final = ("added-equality-delete-files", "added-equality-deletes")

Position = tuple[int, int]
Identity = tuple[bytes, bytes | None]  # a record as Kafka holds it: message key and value


def with_region(row: Row) -> dict[str, Any]:
    return {**as_record(row), "region": REGIONS[row[2] % len(REGIONS)]}


def partition_column(drawn: tuple[str, ...]) -> tuple[str, ...]:
    """The plain runs partition by country or not at all; an upsert table by region then (keys move across it)."""
    return ("region",) if drawn else ()


@dataclass
class UpsertStream:
    """The run's upsert stream: each produced record's label (an id of the run's) and its change, in the order they
    were produced."""

    stream: ChangeStream
    changes: dict[int, Change] = field(default_factory=dict)
    order: dict[int, int] = field(default_factory=dict)  # label -> rank in production order
    positions: dict[int, Position] = field(default_factory=dict)
    identities: dict[Identity, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: int, seed: int, delete_share: float) -> UpsertStream:
        return cls(ChangeStream(keys, seed, delete_share))

    @classmethod
    def drawn(cls, rng: random.Random, records: int) -> UpsertStream:
        """A run's stream of about `records` records: its keys (each written about 3 to 20 times) and the share of
        deletes drawn from the run's generator."""
        return cls.of(rng.randint(records // 20, records // 3), rng.randrange(2**31), round(rng.uniform(0.05, 0.35), 3))

    def produce(self, bootstrap: str, topic: str, labels: Sequence[int], partitions: int) -> list[ProducedRecord]:
        """The stream's next changes, one for each label, into the topic; where each landed, under its label (a
        ProducedRecord whose key is the label, as the plain runs' are the order's id)."""
        changes = self.stream.take(len(labels))
        records = [upsert_record(change, partitions, with_region) for change in changes]
        landed = produce_records(bootstrap, topic, records)
        by_partition: dict[int, list[ProducedRecord]] = {}
        for record in landed:  # sorted by (partition, offset)
            by_partition.setdefault(record.partition, []).append(record)
        labelled = []
        for label, change, (partition, key, value) in zip(labels, changes, records, strict=True):
            record = by_partition[partition].pop(0)
            if record.key != key:
                raise AssertionError(f"the producer reordered partition {partition}: {record} is not {key!r}")
            self.record(label, change, (record.partition, record.offset), (key, value))
            labelled.append(ProducedRecord(record.partition, record.offset, str(label).encode()))
        return sorted(labelled)

    def record(self, label: int, change: Change, position: Position, identity: Identity) -> None:
        """A change of the stream landed at `position` (the next in production order), as Kafka holds it."""
        self.changes[label], self.order[label] = change, len(self.order)
        self.positions[label] = position
        self.identities.setdefault(identity, []).append(label)

    def labels(self, held: dict[Position, Identity]) -> dict[Position, bytes | None]:
        """What the broker holds (position -> message key and value) by label; None for a record the stream never
        produced. Tombstones of one key are alike: the one produced at that position, else the first of them."""
        found: dict[Position, bytes | None] = {}
        for position, identity in held.items():
            candidates = self.identities.get(identity, [])
            at = [label for label in candidates if self.positions[label] == position]
            found[position] = str((at or candidates)[0]).encode() if candidates else None
        return found

    def check_rows(self, found: Findings, table: Table, expected: Expected) -> None:
        """The table is the model of what the committed batches read (module docstring), read by both readers."""
        unread = expected.must - expected.read
        if unread:
            found.anomaly(
                f"{len(unread)} records that had to be read are in no committed batch's range: "
                + ", ".join(self._describe(label) for label in sorted(unread)[:SHOWN])
            )
        table_rows = pyiceberg_table_rows(table)
        read = self._read(expected, table_rows, found)
        wanted = model([self.changes[label] for label in read])
        kinds = Counter("delete" if change.row is None else "upsert" for change in self.changes.values())
        found.facts.update(
            upsert_records=len(self.changes),
            upsert_deletes=kinds["delete"],
            upsert_keys=self.stream.keys,
            read=len(read),
            model_keys=len(wanted),
        )
        for reader, rows in (("pyiceberg", table_rows), ("DuckDB", duckdb_table_rows(table))):
            self._compare(found, reader, rows, wanted, read)
        live = delete_file_kinds(table)
        found.facts.update(rows=len(wanted), position_delete_files=live.get("POSITION_DELETES", 0))
        if set(live) - {"POSITION_DELETES"}:
            found.anomaly(f"the table holds delete files other than position deletes: {dict(live)}")
        equality = equality_deletes_written(table)
        if equality:
            found.anomaly(f"equality deletes were written: {'; '.join(equality[:SHOWN])}")

    def _read(self, expected: Expected, rows: list[Row], found: Findings) -> list[int]:
        """The records read, in the order they were produced. Of a deleted topic's records a batch may have read
        (`expected.maybe`), each partition's were read up to some offset: the first whose model the table's rows of
        that partition's keys match is taken (else the closest), and the offsets that fit are noted."""
        certain = expected.read - expected.maybe
        maybe: dict[int, list[int]] = {}
        for label in sorted(expected.maybe, key=self.positions.__getitem__):
            maybe.setdefault(self.positions[label][0], []).append(label)
        held = {row[0]: row for row in rows}
        cuts = {}
        for partition, labels in maybe.items():
            keys = {self.changes[label].key for label in labels}
            of_keys = [label for label in certain if self.changes[label].key in keys]
            counted = [self._mismatches([*of_keys, *labels[:cut]], keys, held) for cut in range(len(labels) + 1)]
            fewest = [cut for cut, mismatches in enumerate(counted) if mismatches == min(counted)]
            certain |= set(labels[: fewest[0]])
            # Several cuts fit when the records between them were overwritten by later ones (or by the second life).
            span = f"{fewest[0]}" if len(fewest) == 1 else f"{fewest[0]}-{fewest[-1]}"
            cuts[partition] = f"{span} of {len(labels)}" + (f" ({min(counted)} keys off)" if min(counted) else "")
        if cuts:
            found.notes.append(f"records of the deleted topic read (of those a batch may have read): {cuts}")
            found.facts["deleted_topic_read"] = cuts
        return sorted(certain, key=self.order.__getitem__)

    def _mismatches(self, labels: list[int], keys: set[int], held: dict[int, Row]) -> int:
        """How many of `keys` the table holds otherwise than the model of these records."""
        last = {row[0]: row for row in model([self.changes[label] for label in sorted(labels, key=self.order.get)])}
        return sum(1 for key in keys if last.get(key) != held.get(key))

    def _compare(self, found: Findings, reader: str, rows: list[Row], wanted: list[Row], read: list[int]) -> None:
        counted = Counter(row[0] for row in rows)
        twice = sorted(key for key, count in counted.items() if count > 1)
        if twice:
            found.anomaly(f"{reader}: {len(twice)} keys in more than one live row: {twice[:SHOWN]}")
        if rows == wanted:
            return
        last = {row[0]: row for row in wanted}
        held = {row[0]: row for row in rows}
        last_record = {self.changes[label].key: label for label in read}  # the key's last record read
        missing = sorted(set(last) - set(held))
        extra = sorted(set(held) - set(last))
        wrong = sorted(key for key in set(last) & set(held) if last[key] != held[key])
        problems = []
        if missing:
            problems.append(
                f"{len(missing)} keys missing (last written by "
                + ", ".join(self._describe(last_record[key]) for key in missing[:SHOWN])
                + ")"
            )
        if extra:
            problems.append(
                f"{len(extra)} keys present that the model has not ("
                + ", ".join(
                    f"{key}: holds {held[key]}, "
                    + (f"last read {self._describe(last_record[key])}" if key in last_record else "never read")
                    for key in extra[:SHOWN]
                )
                + ")"
            )
        if wrong:
            problems.append(
                f"{len(wrong)} keys with another value than their last ("
                + ", ".join(
                    f"{key}: holds seq {held[key][2]}, the model {self._describe(last_record[key])}"
                    for key in wrong[:SHOWN]
                )
                + ")"
            )
        found.anomaly(f"{reader} reads {len(rows)} rows, the model has {len(wanted)}: " + "; ".join(problems))

    def _describe(self, label: int) -> str:
        change = self.changes[label]
        partition, offset = self.positions[label]
        what = "delete" if change.row is None else f"seq {change.row[2]}"
        return f"record {label} (key {change.key}, {what}, at {partition}/{offset})"


def equality_deletes_written(table: Table) -> list[str]:
    """Snapshots that added equality deletes, in the table's metadata and in every earlier metadata file still on
    storage (expired snapshots stay in those), and live equality delete files."""
    found = []
    documents = [json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())]
    for entry in table.metadata.metadata_log:
        path = Path(entry.metadata_file.removeprefix("file://"))
        if path.exists():
            documents.append(json.loads(path.read_text()))
    seen: set[int] = set()
    for document in documents:
        for snapshot in document.get("snapshots", []):
            summary = snapshot.get("summary", {})
            if snapshot["snapshot-id"] in seen:
                continue
            seen.add(snapshot["snapshot-id"])
            if any(int(summary.get(name, 0)) for name in EQUALITY_SUMMARY_FIELDS):
                found.append(f"snapshot {snapshot['snapshot-id']}: {summary}")
    return found


__all__ = ["KEY", "UPSERT_DDL", "UpsertStream", "partition_column"]
