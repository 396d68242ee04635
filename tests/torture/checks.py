"""What a torture run must find once the system settled: exactly once, against what was produced to Kafka.

The metastore of each run carries audit triggers (AUDIT_SQL, test-only, installed
by the harness after the migration): every version of every `pending_sink_state`
row (with the sink's checkpoint as that transaction saw it) and of every `sinks`
row is kept, and each change NOTIFYs the harness. So the files of an attempt that
was ABORTED and later overwritten by a new attempt are still known, and the
checks can see the whole history, not only its end.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.table.snapshots import ancestors_of

from coordinator_service import precommit_metadata
from coordinator_service.iceberg import MARKER_EPOCH, MARKER_SINK

AUDIT_SQL = """
CREATE TABLE torture_epoch_audit (
    id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL,
    sink_id int NOT NULL, epoch bigint NOT NULL, status text NOT NULL, attempt int, metadata bytea,
    files_cleaned bool, checkpointed_epoch bigint
);
CREATE TABLE torture_sink_audit (
    id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), sink_id int NOT NULL,
    checkpointed_epoch bigint NOT NULL, committed_epoch bigint NOT NULL, writer_term bigint NOT NULL
);
CREATE FUNCTION torture_epoch_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO torture_epoch_audit (op, sink_id, epoch, status) VALUES ('DELETE', OLD.sink_id, OLD.epoch,
            OLD.status::text);
    ELSE
        INSERT INTO torture_epoch_audit (op, sink_id, epoch, status, attempt, metadata, files_cleaned,
            checkpointed_epoch)
        VALUES (TG_OP, NEW.sink_id, NEW.epoch, NEW.status::text, NEW.attempt, NEW.metadata, NEW.files_cleaned,
            (SELECT checkpointed_epoch FROM sinks WHERE id = NEW.sink_id));
    END IF;
    PERFORM pg_notify('torture', 'epoch');
    RETURN NULL;
END $$;
CREATE FUNCTION torture_sink_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture_sink_audit (sink_id, checkpointed_epoch, committed_epoch, writer_term)
    VALUES (NEW.id, NEW.checkpointed_epoch, NEW.committed_epoch, NEW.writer_term);
    PERFORM pg_notify('torture', 'sink');
    RETURN NULL;
END $$;
CREATE TRIGGER torture_epoch_audit AFTER INSERT OR UPDATE OR DELETE ON pending_sink_state
    FOR EACH ROW EXECUTE FUNCTION torture_epoch_audit();
CREATE TRIGGER torture_sink_audit AFTER INSERT OR UPDATE ON sinks
    FOR EACH ROW EXECUTE FUNCTION torture_sink_audit();
"""


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
    """(checkpointed, committed) once everything checkpointed is committed and every aborted file cleaned."""
    row = connection.execute(
        "SELECT id, checkpointed_epoch, committed_epoch FROM sinks WHERE name = %s", (sink,)
    ).fetchone()
    if row is None:
        return None
    sink_id, checkpointed, committed = row
    busy = connection.execute(
        "SELECT count(*) FROM pending_sink_state WHERE sink_id = %s AND ("
        " (status = 'PENDING' AND epoch <= %s) OR (status = 'ABORTED' AND NOT files_cleaned))",
        (sink_id, checkpointed),
    ).fetchone()
    if committed != checkpointed or (busy is not None and busy[0] > 0):
        return None
    return int(checkpointed), int(committed)


def check_run(
    *,
    connection: psycopg.Connection[Any],
    catalog: Catalog,
    sink: str,
    table: str,
    produced_keys: list[int],
    spark_checkpoint: Path,
    zombie_paths: set[str],
) -> Findings:
    found = Findings()
    sink_row = connection.execute(
        "SELECT id, checkpointed_epoch, committed_epoch FROM sinks WHERE name = %s", (sink,)
    ).fetchone()
    if sink_row is None:
        found.anomaly("the sink does not exist")
        return found
    sink_id, checkpointed, committed = (int(v) for v in sink_row)
    found.facts.update(checkpointed_epoch=checkpointed, committed_epoch=committed)

    # What is in the table, by key, against what was produced.
    loaded = catalog.load_table(table)
    keys = Counter(loaded.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())
    produced = Counter(produced_keys)
    missing = set(produced) - set(keys)
    duplicated = {key for key, count in keys.items() if count > 1}
    unexpected = set(keys) - set(produced)
    found.facts.update(produced=len(produced_keys), rows=sum(keys.values()))
    if missing:
        found.anomaly(f"{len(missing)} produced records missing from the table: keys {_sample(missing)}")
    if duplicated:
        found.anomaly(f"{len(duplicated)} records in the table more than once: keys {_sample(duplicated)}")
    if unexpected:
        found.anomaly(f"{len(unexpected)} records in the table that were never produced: {_sample(unexpected)}")
    table_files = set(loaded.inspect.data_files().column("file_path").to_pylist())

    # The log's whole history (the audit triggers).
    history = connection.execute(
        "SELECT op, epoch, status, attempt, metadata, checkpointed_epoch FROM torture_epoch_audit "
        "WHERE sink_id = %s ORDER BY id",
        (sink_id,),
    ).fetchall()
    latest: dict[int, str] = {}
    paths_by_attempt: dict[tuple[int, int], frozenset[str]] = {}
    aborted: set[tuple[int, int]] = set()
    for op, epoch, status, attempt, metadata, checkpoint_then in history:
        latest[epoch] = "PRUNED" if op == "DELETE" else status
        if op == "DELETE":
            continue
        paths_by_attempt[(epoch, attempt)] = precommit_metadata.decode(bytes(metadata)).paths
        if status == "ABORTED":
            aborted.add((epoch, attempt))
        if status == "COMMITTED" and checkpoint_then is not None and epoch > checkpoint_then:
            found.anomaly(
                f"epoch {epoch} was marked COMMITTED while the recorded checkpoint was {checkpoint_then} (invariant 3)"
            )
    found.facts["aborted_attempts"] = len(aborted)

    # Invariant 5: an aborted attempt's files are not in the table and, once cleaned, not on storage.
    for epoch, attempt in sorted(aborted):
        # An attempt's own files may be named again by a later attempt of the epoch (the coordinator keeps those).
        reused = {path for (e, a), paths in paths_by_attempt.items() if e == epoch and a > attempt for path in paths}
        paths = paths_by_attempt[(epoch, attempt)] - reused
        in_table = paths & table_files
        if in_table:
            found.anomaly(f"files of aborted epoch {epoch} attempt {attempt} are in the table: {_sample(in_table, 3)}")
        left = {path for path in paths - in_table if Path(path.removeprefix("file://")).exists()}
        if left:
            found.anomaly(
                f"files of aborted epoch {epoch} attempt {attempt} are still on storage after cleanup: "
                f"{_sample(left, 3)}"
            )

    # Invariant 4 and the settle: every epoch at or below the checkpoint COMMITTED, the checkpoint Spark's.
    not_committed = {
        epoch: status
        for epoch, status in latest.items()
        if epoch <= checkpointed and status not in ("COMMITTED", "PRUNED")
    }
    if not_committed:
        found.anomaly(f"epochs at or below the checkpoint {checkpointed} not COMMITTED: {not_committed}")
    if committed != checkpointed:
        found.anomaly(f"committed epoch {committed} behind the recorded checkpoint {checkpointed}")
    holes = set(range(0, checkpointed + 1)) - set(latest)
    if holes and latest:
        first = min(latest)
        holes = {epoch for epoch in holes if epoch > first}
        if holes:
            found.anomaly(f"epochs never pre-committed at or below the checkpoint: {_sample(holes)}")
    commits = spark_checkpoint / "commits"
    spark_last = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1)
    found.facts["spark_last_batch"] = spark_last
    if spark_last != checkpointed:
        found.anomaly(f"Spark's last checkpointed batch is {spark_last}, the coordinator recorded {checkpointed}")

    # The sink row's numbers move forward only.
    previous: tuple[int, int, int] | None = None
    for row in connection.execute(
        "SELECT checkpointed_epoch, committed_epoch, writer_term FROM torture_sink_audit WHERE sink_id = %s "
        "ORDER BY id",
        (sink_id,),
    ):
        current = (int(row[0]), int(row[1]), int(row[2]))
        if previous is not None and any(now < before for now, before in zip(current, previous, strict=True)):
            found.anomaly(f"the sink row went back: (checkpointed, committed, term) {previous} -> {current}")
        previous = current

    # Snapshot markers along the ancestry, oldest first, never go back.
    markers = [
        int(str(snapshot.summary.get(MARKER_EPOCH)))
        for snapshot in reversed(list(ancestors_of(loaded.current_snapshot(), loaded.metadata)))
        if snapshot.summary is not None and snapshot.summary.get(MARKER_SINK) == sink
    ]
    found.facts["snapshots"] = len(markers)
    if any(later < earlier for earlier, later in itertools.pairwise(markers)):
        found.anomaly(f"snapshot markers of the sink go back along the ancestry: {markers}")
    if markers and markers[-1] > committed:
        found.anomaly(f"the newest marker (epoch {markers[-1]}) is above the committed epoch {committed}")

    # A zombie writer's files never reached the log nor the table.
    if zombie_paths:
        logged = {path for paths in paths_by_attempt.values() for path in paths} & zombie_paths
        if logged:
            found.anomaly(f"a fenced writer's pre-commit reached the log: {_sample(logged, 3)}")
        if zombie_paths & table_files:
            found.anomaly(f"a fenced writer's files are in the table: {_sample(zombie_paths & table_files, 3)}")
    return found
