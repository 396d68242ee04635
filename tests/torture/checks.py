"""What a torture run must find once the system settled: exactly once, against what was produced to Kafka.

The metastore of each run carries audit triggers (tests/torture/audit.py, test-only,
installed by the harness after the migration): every version of every `pending_sink_state`
row (with the sink's checkpoint as that transaction saw it) and of every `sinks`
row is kept, and each change NOTIFYs the harness. So the files of an attempt that
was ABORTED and later overwritten by a new attempt are still known, and the
checks can see the whole history, not only its end.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from coordinator_service.contract.markers import MARKER_EPOCH, MARKER_GENERATION, MARKER_SINK, snapshot_properties
from coordinator_service.engine.verification.findings import Verification
from tests.fixtures.reachable_files import missing_reachable_files
from tests.torture.audit import read_history, sink_row_went_back


@dataclass
class Findings:
    anomalies: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def anomaly(self, text: str) -> None:
        self.anomalies.append(text)


def _sample(values: Any, limit: int = 10) -> str:
    items = sorted(values)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return f"{items[:limit]}{more}"


def settled(connection: psycopg.Connection[Any], sink: str) -> tuple[int, int] | None:
    """(checkpointed, committed) once everything checkpointed is committed and every aborted file cleaned, those of
    attempts that a later attempt replaced included (the harness's coordinators delete them without delay)."""
    row = connection.execute(
        "SELECT id, checkpointed_epoch, committed_epoch FROM sinks WHERE name = %s", (sink,)
    ).fetchone()
    if row is None:
        return None
    sink_id, checkpointed, committed = row
    busy = connection.execute(
        "SELECT (SELECT count(*) FROM pending_sink_state WHERE sink_id = %(sink)s AND ("
        "  (status = 'PENDING' AND epoch <= %(checkpointed)s) OR (status = 'ABORTED' AND NOT files_cleaned)))"
        " + (SELECT count(*) FROM epoch_files WHERE sink_id = %(sink)s AND discarded_at IS NOT NULL"
        "    AND deleted_at IS NULL)",
        {"sink": sink_id, "checkpointed": checkpointed},
    ).fetchone()
    if committed != checkpointed or (busy is not None and busy[0] > 0):
        return None
    return int(checkpointed), int(committed)


SECOND_LIFE_OFFSET = 1_000_000_000  # topic_recreated: the second life's positions, apart from the first's


@dataclass(frozen=True)
class Produced:
    """What a sink's writer was given to write: each key with its Kafka position (partition, offset)."""

    keys: dict[tuple[int, int], int]  # (partition, offset) -> key
    # Where each generation's query started reading (partition -> offset); generation 0 from the start.
    starts: dict[int, dict[int, int]] = field(default_factory=dict)
    # topic_recreated: the batch that ran without the deleted topic; the later ones read its second life, whose
    # positions are SECOND_LIFE_OFFSET above the Kafka offsets their batches name.
    second_life_after: int | None = None

    def keys_between(self, start: dict[int, int], end: dict[int, int], base: int = 0) -> set[int]:
        return {
            key
            for (partition, offset), key in self.keys.items()
            if start.get(partition, 0) + base <= offset < end.get(partition, start.get(partition, 0)) + base
        }

    def keys_of_batch(self, epoch: int, start: dict[int, int], end: dict[int, int]) -> set[int]:
        """The keys a Spark batch read, from its offsets (a batch of the topic's second life reads that)."""
        second = self.second_life_after is not None and epoch > self.second_life_after
        return self.keys_between(start, end, SECOND_LIFE_OFFSET if second else 0)


@dataclass(frozen=True)
class Expected:
    """What a sink's table must reflect (by key of Produced): every record of `must` and of `read` but `maybe`, none
    of `lost`.

    `read`: the records of the committed batches' ranges the topic still held when they were read, but for `maybe`:
    those of a deleted topic that a batch planned before the deletion may have read or found gone (each partition's
    read up to some offset); `lost`: those lost by design (an operator's forced abort, retention)."""

    must: set[int]
    read: set[int]
    lost: set[int]
    maybe: set[int]


RowsCheck = Callable[[Findings, Table, Expected], None]


def partitions_of(offsets: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for topic, parts in offsets.items() if not topic.startswith("$") for p, o in parts.items()}


def end_offsets(properties: dict[str, str]) -> dict[int, int] | None:
    """The batch's end offsets (partition -> offset) from the Spark writer's `spark.end_offsets` property."""
    raw = properties.get("spark.end_offsets")
    return None if raw is None else {p: o for source in json.loads(raw) for p, o in partitions_of(source).items()}


def start_offsets(properties: dict[str, str]) -> dict[int, int] | None:
    """Batch 0's start offsets (the source's `$start`, kept with its end offsets), None for other batches."""
    raw = properties.get("spark.end_offsets")
    starts = [source["$start"] for source in json.loads(raw) if "$start" in source] if raw is not None else []
    return {p: o for start in starts for p, o in partitions_of(start).items()} if starts else None


def check_run(
    *,
    connection: psycopg.Connection[Any],
    catalog: Catalog,
    sink: str,
    table: str,
    produced: Produced,
    spark_checkpoint: Path | None,
    zombie_paths: set[str],
    writer_checkpoint: int | None = None,
    lost_by_retention: frozenset[int] = frozenset(),
    may_be_missing: frozenset[int] = frozenset(),
    bad_rows: Counter[int | None] | None = None,
    from_first_start: bool = False,
    rows_check: RowsCheck | None = None,
) -> Findings:
    """Exactly once for one sink, from its whole log history, its table and what its writer was given.

    Records of a batch an operator aborted with `force` after its writer checkpointed it are lost by design
    (docs/operations.md), and so are those retention deleted before the writer read them
    (`lost_by_retention`, with failOnDataLoss off); those of a deleted topic the job may not have read yet
    (`may_be_missing`) are in the table once or not at all; every other produced record is in the table once (from the
    first query's resolved start with `from_first_start`: startingOffsets=latest). `bad_rows`: the rows records
    that do not fit the schema leave in the table (their order_id, or None for an all-null row).
    `spark_checkpoint` is the Spark query's current checkpoint (None: a writer without one, whose last
    checkpointed epoch is `writer_checkpoint`). `rows_check` compares the table's rows with what was produced instead
    (an upsert table's keys hold the last value of what was read: tests/torture/upserts.py).
    """
    found = Findings()
    sink_row = connection.execute(
        "SELECT id, checkpointed_epoch, committed_epoch, generation FROM sinks WHERE name = %s", (sink,)
    ).fetchone()
    if sink_row is None:
        found.anomaly("the sink does not exist")
        return found
    sink_id, checkpointed, committed, generation = (int(v) for v in sink_row)
    found.facts.update(checkpointed_epoch=checkpointed, committed_epoch=committed, generation=generation)

    # The log's whole history (the audit triggers), by generation: a reset starts epoch numbers again.
    history = read_history(
        connection.execute(
            "SELECT op, epoch, status, attempt, metadata, checkpointed_epoch, generation, abort_cause "
            "FROM torture_epoch_audit WHERE sink_id = %s ORDER BY id",
            (sink_id,),
        ).fetchall()
    )
    for problem in history.anomalies:
        found.anomaly(problem)
    latest, properties = history.latest, history.properties
    paths_by_attempt, properties_by_attempt, aborted = (
        history.paths_by_attempt,
        history.properties_by_attempt,
        history.aborted,
    )
    found.facts["aborted_attempts"] = len(aborted)

    def _start_of(gen: int, epoch: int) -> dict[int, int]:
        """Where a Spark batch started: its own `$start` (batch 0), the previous batch's end, the query's start."""
        own = start_offsets(properties.get((gen, epoch), {}))
        before = end_offsets(properties.get((gen, epoch - 1), {})) if epoch > 0 else None
        return own if own is not None else before if before is not None else produced.starts.get(gen, {})

    # Records lost by design: those of batches an operator aborted that no later batch read again.
    operator_aborted = sorted(
        key for key, (status, cause) in latest.items() if (status, cause) == ("ABORTED", "OPERATOR")
    )
    lost: set[int] = set()
    for gen, epoch in operator_aborted:
        end = end_offsets(properties.get((gen, epoch), {}))
        if end is None:  # not a Spark writer's batch: the writer knows its keys (it writes them again or not)
            continue
        lost |= produced.keys_of_batch(epoch, _start_of(gen, epoch), end)
    committed_keys: set[int] = set()
    for (gen, epoch), (status, _) in latest.items():
        end = end_offsets(properties.get((gen, epoch), {}))
        if status in ("COMMITTED", "PRUNED") and end is not None:
            committed_keys |= produced.keys_of_batch(epoch, _start_of(gen, epoch), end)
    lost -= committed_keys  # read again by a later batch (after a reset) and committed there
    found.facts["lost_by_operator_abort"] = len(lost)

    # Batch 0's start is resolved once: every attempt of it carries the same.
    for gen in {g for g, _ in latest}:
        starts = {
            json.dumps(start_offsets(decoded), sort_keys=True)
            for (g, e, _), decoded in properties_by_attempt.items()
            if (g, e) == (gen, 0)
        }
        if len(starts) > 1:
            found.anomaly(f"the attempts of batch 0 (generation {gen}) started at different offsets: {sorted(starts)}")

    # What is in the table, by key, against what was produced.
    loaded = catalog.load_table(table)
    positions = produced.keys
    if from_first_start:
        first = start_offsets(properties.get((0, 0), {}))
        if first is None:
            found.anomaly("batch 0 has no resolved start ($start) in its properties")
            first = {}
        positions = {(p, o): key for (p, o), key in positions.items() if o >= first.get(p, 0)}
        found.facts["before_start"] = len(produced.keys) - len(positions)
    expected = set(positions.values())
    lost |= set(lost_by_retention)
    found.facts.update(lost_by_retention=len(lost_by_retention), produced=len(produced.keys))
    if rows_check is not None:
        read = committed_keys - set(lost_by_retention)
        found.facts["lost_with_topic"] = len(may_be_missing - read)
        rows_check(found, loaded, Expected(expected - lost - may_be_missing, read, lost, read & may_be_missing))
    else:
        _check_rows_once(found, loaded, expected, lost, may_be_missing, bad_rows)
    table_files = set(loaded.inspect.data_files().column("file_path").to_pylist())
    # Nothing the table's metadata reaches (every snapshot kept for time travel included) is missing from storage.
    gone = missing_reachable_files(loaded)
    if gone:
        found.anomaly(f"the table's metadata reaches {len(gone)} files missing from storage: {_sample(gone, 3)}")

    # Invariant 5: an aborted attempt's files are not in the table and, once cleaned, not on storage.
    for gen, epoch, attempt in sorted(aborted):
        # An attempt's own files may be named again by a later attempt (the coordinator keeps those).
        reused = {
            path
            for (g, e, a), paths in paths_by_attempt.items()
            if (g, e) > (gen, epoch) or ((g, e) == (gen, epoch) and a > attempt)
            for path in paths
        }
        paths = paths_by_attempt[(gen, epoch, attempt)] - reused
        in_table = paths & table_files
        if in_table:
            found.anomaly(f"files of aborted epoch {epoch} attempt {attempt} are in the table: {_sample(in_table, 3)}")
        left = {path for path in paths - in_table if Path(path.removeprefix("file://")).exists()}
        if left:
            found.anomaly(
                f"files of aborted epoch {epoch} attempt {attempt} are still on storage after cleanup: "
                f"{_sample(left, 3)}"
            )

    # Invariant 4 and the settle: every epoch of this generation at or below the checkpoint COMMITTED.
    current = {epoch: status for (gen, epoch), (status, _) in latest.items() if gen == generation}
    not_committed = {
        epoch: status
        for epoch, status in current.items()
        if epoch <= checkpointed
        and status not in ("COMMITTED", "PRUNED")
        and (status, latest[(generation, epoch)][1]) != ("ABORTED", "OPERATOR")
    }
    if not_committed:
        found.anomaly(f"epochs at or below the checkpoint {checkpointed} not COMMITTED: {not_committed}")
    if committed != checkpointed:
        found.anomaly(f"committed epoch {committed} behind the recorded checkpoint {checkpointed}")
    holes = set(range(0, checkpointed + 1)) - set(current)
    if holes and current:
        lowest = min(current)
        holes = {epoch for epoch in holes if epoch > lowest}
        if holes:
            found.anomaly(f"epochs never pre-committed at or below the checkpoint: {_sample(holes)}")
    if spark_checkpoint is not None:
        commits = spark_checkpoint / "commits"
        writer_checkpoint = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1)
        found.facts["spark_last_batch"] = writer_checkpoint
    if writer_checkpoint is not None and writer_checkpoint != checkpointed:
        found.anomaly(
            f"the writer's last checkpointed batch is {writer_checkpoint}, the coordinator recorded {checkpointed}"
        )

    # The sink row's numbers move forward only; a reset starts a new generation, and its first registration
    # (the row awaiting a writer) starts the checkpoint again at the new query's.
    for went_back in sink_row_went_back(connection, sink_id):
        found.anomaly(went_back)

    # Snapshot markers along the ancestry, oldest first, never go back (within a generation; generations rise).
    markers = [
        (int(properties.get(MARKER_GENERATION, "0")), int(properties[MARKER_EPOCH]))
        for snapshot in reversed(list(ancestors_of(loaded.current_snapshot(), loaded.metadata)))
        if (properties := snapshot_properties(snapshot)).get(MARKER_SINK) == sink
    ]
    found.facts["snapshots"] = len(markers)
    if any(later < earlier for earlier, later in itertools.pairwise(markers)):
        found.anomaly(f"snapshot markers (generation, epoch) of the sink go back along the ancestry: {markers}")
    if markers and markers[-1] > (generation, committed):
        found.anomaly(f"the newest marker {markers[-1]} is above the committed epoch {committed}")

    # A zombie writer's files never reached the log nor the table.
    if zombie_paths:
        logged = {path for paths in paths_by_attempt.values() for path in paths} & zombie_paths
        if logged:
            found.anomaly(f"a fenced writer's pre-commit reached the log: {_sample(logged, 3)}")
        if zombie_paths & table_files:
            found.anomaly(f"a fenced writer's files are in the table: {_sample(zombie_paths & table_files, 3)}")
    return found


def _check_rows_once(
    found: Findings,
    loaded: Table,
    expected: set[int],
    lost: set[int],
    may_be_missing: frozenset[int],
    bad_rows: Counter[int | None] | None,
) -> None:
    """An append table: every expected record's row once (by its order_id), none of those lost by design."""
    keys: Counter[int | None] = Counter(
        loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()
    )
    if bad_rows:
        absent = bad_rows - keys
        if absent:
            found.anomaly(f"rows of records that do not fit the schema missing from the table: {dict(absent)}")
        keys -= bad_rows
    missing = expected - set(keys) - lost - may_be_missing
    found.facts["lost_with_topic"] = len(may_be_missing - set(keys))
    duplicated = {key for key, count in keys.items() if count > 1}
    unexpected = set(keys) - expected
    found.facts["rows"] = sum(keys.values())
    if missing:
        found.anomaly(f"{len(missing)} produced records missing from the table: keys {_sample(missing)}")
    if lost & set(keys):
        found.anomaly(f"records lost by design (aborted, deleted) are in the table: keys {_sample(lost & set(keys))}")
    if duplicated:
        found.anomaly(f"{len(duplicated)} records in the table more than once: keys {_sample(duplicated)}")
    if unexpected:
        found.anomaly(f"{len(unexpected)} records in the table that were never produced: {_sample(unexpected)}")


def check_sink_tables(connection: psycopg.Connection[Any], sink: str, tables: set[str]) -> list[str]:
    """A settled fan-out sink: its tables are the ones its writer wrote, each holds every checkpointed epoch, and
    the sink's committed epoch is the least of theirs."""
    rows = connection.execute(
        "SELECT t.table_identifier, t.committed_epoch, s.committed_epoch, s.checkpointed_epoch "
        "FROM sink_tables t JOIN sinks s ON s.id = t.sink_id WHERE s.name = %s",
        (sink,),
    ).fetchall()
    problems = []
    recorded = {str(table): int(epoch) for table, epoch, _, _ in rows}
    if set(recorded) != tables:
        problems.append(f"the log's tables of the sink are {sorted(recorded)}, its writer wrote {sorted(tables)}")
    if rows:
        committed, checkpointed = int(rows[0][2]), int(rows[0][3])
        if min(recorded.values()) != committed:
            problems.append(f"the sink's committed epoch {committed} is not the least of its tables' {recorded}")
        behind = {table: epoch for table, epoch in recorded.items() if epoch != checkpointed}
        if behind:
            problems.append(f"tables not at the checkpointed epoch {checkpointed}: {behind}")
    return problems


def check_verifier_agrees(found: Findings, verification: Verification) -> None:
    """The verifier (shallow, and deep where the table has Kafka positions) over the run's table agrees with the run's
    own exactly-once check: a fault it finds in a run whose checks found none is a disagreement (an anomaly). One it
    does not find where the checks found one is counted (`verifier_missed`): the run's anomaly fails it anyway, and
    the shallow check cannot see a record twice inside an epoch's range."""
    found.facts["verifier_faults"] = len(verification.faults)
    found.facts["verifier_deep"] = all(table.deep for table in verification.tables)
    found.facts["verifier_missed"] = int(bool(found.anomalies) and verification.ok)
    if verification.faults and not found.anomalies:
        found.anomaly(
            "the verifier disagrees with the run's exactly-once checks, which found nothing: "
            + "; ".join(str(fault) for fault in verification.faults[:5])
        )
