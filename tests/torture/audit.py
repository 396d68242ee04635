"""The audit of a run's log (test-only, installed by the harness after the migration): triggers that keep every
version of every `pending_sink_state` row (with the sink's checkpoint as that transaction saw it) and of every `sinks`
row, and NOTIFY the harness of each change; and the reading of that history by tests/torture/checks.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from coordinator_service.log import precommit_metadata

AUDIT_SQL = """
CREATE TABLE torture_epoch_audit (
    id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL,
    sink_id int NOT NULL, epoch bigint NOT NULL, status text NOT NULL, attempt int, metadata bytea,
    files_cleaned bool, checkpointed_epoch bigint, generation int, abort_cause text
);
CREATE TABLE torture_sink_audit (
    id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), sink_id int NOT NULL,
    checkpointed_epoch bigint NOT NULL, committed_epoch bigint NOT NULL, writer_term bigint NOT NULL,
    generation int NOT NULL, awaiting_writer_after_reset bool NOT NULL
);
CREATE FUNCTION torture_epoch_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO torture_epoch_audit (op, sink_id, epoch, status, generation)
        SELECT 'DELETE', OLD.sink_id, OLD.epoch, OLD.status::text, s.generation FROM sinks s WHERE s.id = OLD.sink_id;
    ELSE
        INSERT INTO torture_epoch_audit (op, sink_id, epoch, status, attempt, metadata, files_cleaned,
            checkpointed_epoch, generation, abort_cause)
        SELECT TG_OP, NEW.sink_id, NEW.epoch, NEW.status::text, NEW.attempt, NEW.metadata, NEW.files_cleaned,
            s.checkpointed_epoch, s.generation, NEW.abort_cause::text FROM sinks s WHERE s.id = NEW.sink_id;
    END IF;
    PERFORM pg_notify('torture', 'epoch');
    RETURN NULL;
END $$;
CREATE FUNCTION torture_sink_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture_sink_audit (sink_id, checkpointed_epoch, committed_epoch, writer_term, generation,
        awaiting_writer_after_reset)
    VALUES (NEW.id, NEW.checkpointed_epoch, NEW.committed_epoch, NEW.writer_term, NEW.generation,
        NEW.rebase_on_register);
    PERFORM pg_notify('torture', 'sink');
    RETURN NULL;
END $$;
CREATE TRIGGER torture_epoch_audit AFTER INSERT OR UPDATE OR DELETE ON pending_sink_state
    FOR EACH ROW EXECUTE FUNCTION torture_epoch_audit();
CREATE TRIGGER torture_sink_audit AFTER INSERT OR UPDATE ON sinks
    FOR EACH ROW EXECUTE FUNCTION torture_sink_audit();
"""


def sink_row_went_back(connection: psycopg.Connection[Any], sink_id: int) -> list[str]:
    """Every version of the sink's row (torture_sink_audit, one a statement) whose numbers went back: its generation
    and term never do, and its checkpointed and committed epochs only in a row awaiting its writer after a reset
    (the new numbering starts at the new query's checkpoint)."""
    went_back = []
    previous: tuple[int, int, int, int] | None = None
    rebasing = False
    for row in connection.execute(
        "SELECT generation, writer_term, checkpointed_epoch, committed_epoch, awaiting_writer_after_reset "
        "FROM torture_sink_audit WHERE sink_id = %s ORDER BY id",
        (sink_id,),
    ):
        now = (int(row[0]), int(row[1]), int(row[2]), int(row[3]))
        if previous is not None and (
            now[:2] < previous[:2]
            or (not rebasing and now[0] == previous[0] and any(a < b for a, b in zip(now, previous, strict=True)))
        ):
            went_back.append(f"the sink row went back: (generation, term, checkpointed, committed) {previous} -> {now}")
        rebasing = bool(row[4])
        previous = now
    return went_back


@dataclass
class History:
    """A sink's epochs over its whole log history, keyed by (generation, epoch)."""

    latest: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)  # status (PRUNED), cause
    properties: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    paths_by_attempt: dict[tuple[int, int, int], frozenset[str]] = field(default_factory=dict)
    properties_by_attempt: dict[tuple[int, int, int], dict[str, str]] = field(default_factory=dict)
    aborted: set[tuple[int, int, int]] = field(default_factory=set)
    anomalies: list[str] = field(default_factory=list)


def read_history(rows: Iterable[Sequence[Any]]) -> History:
    """The audit's rows (op, epoch, status, attempt, metadata, checkpoint then, generation then, abort cause).

    A row belongs to the generation in which its attempt was pre-committed (the audit records the sink's
    generation at each change: the cleaner may mark, and the first registration after a reset deletes, an old
    generation's row after the reset). A deleted COMMITTED row is PRUNED (its records are in the table); a deleted
    ABORTED row stays what it was (an operator's abort stays lost by design after the reset deleted its row).
    """
    history = History()
    row_generation: dict[int, int] = {}
    for op, epoch, status, attempt, metadata, checkpoint_then, sink_generation, cause in rows:
        if op == "INSERT" or (op == "UPDATE" and status == "PENDING"):
            row_generation[epoch] = sink_generation
        gen = row_generation.get(epoch, sink_generation)
        if op == "DELETE":
            if status == "COMMITTED":
                history.latest[(gen, epoch)] = ("PRUNED", None)
            continue
        history.latest[(gen, epoch)] = (status, cause)
        decoded = precommit_metadata.decode(bytes(metadata))
        history.paths_by_attempt[(gen, epoch, attempt)] = decoded.paths
        history.properties[(gen, epoch)] = decoded.properties
        history.properties_by_attempt[(gen, epoch, attempt)] = decoded.properties
        if status == "ABORTED":
            history.aborted.add((gen, epoch, attempt))
        if status == "COMMITTED" and checkpoint_then is not None and epoch > checkpoint_then:
            history.anomalies.append(
                f"epoch {epoch} was marked COMMITTED while the recorded checkpoint was {checkpoint_then} (invariant 3)"
            )
    return history
