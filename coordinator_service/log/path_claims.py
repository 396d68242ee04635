"""Every statement on epoch_files: which epoch, part or deletion a path belongs to.

One row per path (its primary key), so that a claim and a deletion of the same path exclude each other in the
log, whatever process makes them (docs/architecture.md, "Deletion is proven, never assumed"):

* a pre-commit claims its paths in the transaction that persists its epoch, and a multi-writer epoch's part in
  the transaction that stores it; a claim never takes a path a deletion has marked;
* a deletion marks its paths in a transaction of its own before it deletes them, and marks none that anything
  else claims; the mark stays ORPHAN_GRACE_SECONDS after the deletion, even once the sink that made it is deleted;
* a claim of a path no row held (a fresh insert) must be made before its file is ORPHAN_GRACE_SECONDS old
  (`deadline`, on the database's clock): a pre-commit that checked a file before a deletion marked it can then
  never claim it after the mark is gone, since a deletion of an unclaimed path keeps its mark that long.

Rows held by an epoch's attempt (epoch, attempt), by a waiting part (epoch, no attempt), discarded for the
cleaner (discarded_at; epoch NULL once the epoch's row is gone), or marked (deleting_at, then deleted_at).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator_service.contract.errors import quote
from coordinator_service.contract.views import EpochStatus


@dataclass(frozen=True)
class CleanupDelays:
    """How long files of an aborted attempt are kept: every discarded path `delay_seconds` at least; a path
    discarded by a recovery abort (Spark runs the batch again) `keep_seconds`, unless the new attempt comes first."""

    delay_seconds: float
    keep_seconds: float

    def parameters(self) -> dict[str, float]:
        return {"delay_seconds": self.delay_seconds, "keep_seconds": self.keep_seconds}


# A discarded path whose delay is over.
_DUE = """
    discarded_at IS NOT NULL AND discarded_at <= now() - make_interval(
        secs => CASE WHEN keep_for_rerun THEN GREATEST(:keep_seconds, :delay_seconds) ELSE :delay_seconds END)
"""


def _deadline(deadline: float | None) -> dict[str, float | None]:
    return {"deadline": deadline}


# --------------------------------------------------------------------------------------------------- claims

# The epoch's attempt holds exactly :paths: those its earlier attempts or its parts claimed are taken over (never a
# marked one), the others are inserted (before the deadline), and the epoch's other claims are discarded.
_CLAIM_FOR_ATTEMPT = """
    WITH wanted AS (
        SELECT DISTINCT path FROM unnest(CAST(:paths AS text[])) AS path
    ), taken AS (
        UPDATE epoch_files f SET attempt = :attempt, discarded_at = NULL, keep_for_rerun = false
        FROM wanted
        WHERE f.path = wanted.path AND f.sink_id = :sink_id AND f.epoch = :epoch AND f.deleting_at IS NULL
        RETURNING f.path
    ), inserted AS (
        INSERT INTO epoch_files (path, sink_id, epoch, attempt)
        SELECT path, :sink_id, :epoch, :attempt FROM wanted
        WHERE path NOT IN (SELECT path FROM taken)
          AND (CAST(:deadline AS double precision) IS NULL OR clock_timestamp() < to_timestamp(:deadline))
        ON CONFLICT (path) DO NOTHING
        RETURNING path
    ), released AS (
        UPDATE epoch_files SET discarded_at = COALESCE(discarded_at, now()), keep_for_rerun = false
        WHERE sink_id = :sink_id AND epoch = :epoch AND deleting_at IS NULL AND path <> ALL(CAST(:paths AS text[]))
    )
    SELECT (SELECT count(*) FROM taken) + (SELECT count(*) FROM inserted)
"""


async def claim_for_attempt(
    session: AsyncSession, sink_id: int, epoch: int, attempt: int, paths: Sequence[str], deadline: float | None
) -> bool:
    """The epoch's attempt now holds exactly `paths` (its earlier attempts' other paths are discarded, no longer
    kept for a re-run). False when a path is held by anything else or marked for deletion, or a fresh claim comes
    after `deadline` (Unix seconds; None: the pre-commit has no file, or none that is not claimed already): the
    caller rolls back."""
    parameters = {"sink_id": sink_id, "epoch": epoch, "attempt": attempt, "paths": list(paths), **_deadline(deadline)}
    claimed = (await session.execute(text(_CLAIM_FOR_ATTEMPT), parameters)).scalar_one()
    return int(claimed) == len(set(paths))


_CLAIM_FOR_PART = """
    WITH wanted AS (
        SELECT DISTINCT path FROM unnest(CAST(:paths AS text[])) AS path
    ), taken AS (
        UPDATE epoch_files f SET discarded_at = NULL
        FROM wanted
        WHERE f.path = wanted.path AND f.sink_id = :sink_id AND f.epoch = :epoch AND f.attempt IS NULL
          AND f.deleting_at IS NULL
        RETURNING f.path
    ), inserted AS (
        INSERT INTO epoch_files (path, sink_id, epoch)
        SELECT path, :sink_id, :epoch FROM wanted
        WHERE path NOT IN (SELECT path FROM taken)
          AND (CAST(:deadline AS double precision) IS NULL OR clock_timestamp() < to_timestamp(:deadline))
        ON CONFLICT (path) DO NOTHING
        RETURNING path
    ), released AS (
        UPDATE epoch_files SET discarded_at = now()
        WHERE sink_id = :sink_id AND epoch = :epoch AND attempt IS NULL AND discarded_at IS NULL
          AND deleting_at IS NULL AND path = ANY(CAST(:released AS text[]))
    )
    SELECT (SELECT count(*) FROM taken) + (SELECT count(*) FROM inserted)
"""


async def claim_for_part(
    session: AsyncSession,
    sink_id: int,
    epoch: int,
    paths: Sequence[str],
    released: Sequence[str],
    deadline: float | None,
) -> bool:
    """A multi-writer epoch's part, waiting for the others, holds `paths` (`released`: the paths of the writer's
    earlier part that this one does not name, discarded). False as for claim_for_attempt."""
    parameters = {
        "sink_id": sink_id,
        "epoch": epoch,
        "paths": list(paths),
        "released": list(released),
        **_deadline(deadline),
    }
    claimed = (await session.execute(text(_CLAIM_FOR_PART), parameters)).scalar_one()
    return int(claimed) == len(set(paths))


async def discard_epochs(session: AsyncSession, sink_id: int, epochs: Sequence[int], keep_for_rerun: bool) -> None:
    """The epochs were aborted: the paths their attempts hold are garbage from now on (kept for a re-run when a
    recovery aborted them)."""
    if not epochs:
        return
    await session.execute(
        text(
            "UPDATE epoch_files SET discarded_at = now(), keep_for_rerun = :keep "
            "WHERE sink_id = :sink_id AND epoch = ANY(CAST(:epochs AS bigint[])) AND discarded_at IS NULL "
            "AND deleting_at IS NULL"
        ),
        {"sink_id": sink_id, "epochs": list(epochs), "keep": keep_for_rerun},
    )


async def discard_parts(session: AsyncSession, sink_id: int) -> None:
    """Every waiting part of the sink was dropped (a new writer term): their paths are garbage."""
    await session.execute(
        text(
            "UPDATE epoch_files SET discarded_at = now() WHERE sink_id = :sink_id AND epoch IS NOT NULL "
            "AND attempt IS NULL AND discarded_at IS NULL AND deleting_at IS NULL"
        ),
        {"sink_id": sink_id},
    )


async def hold_again(session: AsyncSession, sink_id: int, epoch: int, attempt: int, paths: Sequence[str]) -> None:
    """The table references these discarded paths after all (an append landed without its lock): the epoch's attempt
    holds them again, and the cleaner leaves them."""
    await session.execute(
        text(
            "UPDATE epoch_files SET epoch = :epoch, attempt = :attempt, discarded_at = NULL, keep_for_rerun = false, "
            "deleting_at = NULL WHERE sink_id = :sink_id AND path = ANY(CAST(:paths AS text[])) AND deleted_at IS NULL"
        ),
        {"sink_id": sink_id, "epoch": epoch, "attempt": attempt, "paths": list(paths)},
    )


async def forget(session: AsyncSession, paths: Sequence[str]) -> None:
    """The log stops deciding these paths (a table keeps them, or they are not where a table keeps its files); a
    deletion's mark stays."""
    await session.execute(
        text("DELETE FROM epoch_files WHERE path = ANY(CAST(:paths AS text[])) AND deleting_at IS NULL"),
        {"paths": list(paths)},
    )


# Claims of epoch rows being deleted (pruned, or of an older numbering): a held path goes with its row (a COMMITTED
# epoch's file is in the table and needs no claim once the epoch is out of the log), a discarded or marked one stays,
# without an epoch, for the cleaner.
RELEASE_CLAIMS_OF_DELETED_EPOCHS = """
    released AS (
        DELETE FROM epoch_files f USING deleted
        WHERE f.sink_id = deleted.sink_id AND f.epoch = deleted.epoch
          AND f.discarded_at IS NULL AND f.deleting_at IS NULL
    ), kept AS (
        UPDATE epoch_files f SET epoch = NULL, attempt = NULL FROM deleted
        WHERE f.sink_id = deleted.sink_id AND f.epoch = deleted.epoch
          AND (f.discarded_at IS NOT NULL OR f.deleting_at IS NOT NULL)
    )
"""


@dataclass(frozen=True)
class PathHolder:
    """What holds a path a pre-commit names: another epoch, a part, the cleaner's queue or a deletion."""

    path: str
    sink: str
    epoch: int | None
    status: EpochStatus | None
    part: bool
    discarded: bool
    marked: bool

    def describe(self) -> str:
        path = quote(self.path)
        if self.marked:
            return f"{path} is being deleted (or was, within ORPHAN_GRACE_SECONDS): write it under another name"
        if self.discarded:
            return f"{path} was given up by sink {self.sink} and waits for the cleaner to delete it"
        if self.part:
            return f"{path} is held by a waiting part of epoch {self.epoch} of sink {self.sink}"
        if self.status == EpochStatus.COMMITTED:
            return f"{path} is in the table: epoch {self.epoch} of sink {self.sink}"
        status = "" if self.status is None else f" ({self.status.value})"
        return f"{path} is held by epoch {self.epoch} of sink {self.sink}{status}"


async def holders(session: AsyncSession, sink_id: int, epoch: int, paths: Sequence[str]) -> list[PathHolder]:
    """The paths among `paths` that the epoch cannot claim (at most 10): held by anything else, or marked."""
    rows = await session.execute(
        text(
            """
            SELECT f.path, COALESCE(s.name, 'a deleted sink'), f.epoch, p.status,
                   f.epoch IS NOT NULL AND f.attempt IS NULL, f.discarded_at IS NOT NULL, f.deleting_at IS NOT NULL
            FROM epoch_files f LEFT JOIN sinks s ON s.id = f.sink_id
            LEFT JOIN pending_sink_state p ON p.sink_id = f.sink_id AND p.epoch = f.epoch
            WHERE f.path = ANY(CAST(:paths AS text[]))
              AND (f.deleting_at IS NOT NULL OR f.sink_id <> :sink_id OR f.epoch IS DISTINCT FROM :epoch)
            ORDER BY f.path LIMIT 10
            """
        ),
        {"sink_id": sink_id, "epoch": epoch, "paths": list(paths)},
    )
    return [
        PathHolder(path, sink, held_epoch, None if status is None else EpochStatus(status), part, discarded, marked)
        for path, sink, held_epoch, status, part, discarded, marked in rows.all()
    ]


async def unsettled(session: AsyncSession, paths: Sequence[str]) -> set[str]:
    """The paths among `paths` whose claim is not a COMMITTED epoch's held file: a PENDING or ABORTED epoch's, a
    waiting part's, the cleaner's queue, a deletion's (compaction leaves these files alone)."""
    rows = await session.execute(
        text(
            """
            SELECT f.path FROM epoch_files f
            LEFT JOIN pending_sink_state p ON p.sink_id = f.sink_id AND p.epoch = f.epoch
            WHERE f.path = ANY(CAST(:paths AS text[]))
              AND NOT (p.status IS NOT DISTINCT FROM 'COMMITTED' AND f.attempt IS NOT NULL
                       AND f.discarded_at IS NULL AND f.deleting_at IS NULL)
            """
        ),
        {"paths": list(paths)},
    )
    return set(rows.scalars().all())


# ------------------------------------------------------------------------------------------------- the cleaner


_CLEANER_WORK = f"""
    deleted_at IS NULL AND (deleting_at IS NOT NULL OR ({_DUE}))
"""


async def sinks_with_cleanup_work(session: AsyncSession, delays: CleanupDelays) -> list[int]:
    """Sinks with discarded paths that are due, a deletion of theirs that did not finish, or an ABORTED epoch that
    holds nothing any more and is not marked cleaned yet."""
    statement = f"""
        SELECT sink_id FROM epoch_files WHERE sink_id IS NOT NULL AND {_CLEANER_WORK}
        UNION
        SELECT p.sink_id FROM pending_sink_state p
        WHERE p.status = 'ABORTED' AND NOT p.files_cleaned
          AND NOT EXISTS (SELECT 1 FROM epoch_files f WHERE f.sink_id = p.sink_id AND f.epoch = p.epoch)
        ORDER BY 1
    """
    return list((await session.execute(text(statement), delays.parameters())).scalars().all())


@dataclass(frozen=True)
class DuePath:
    """A path the cleaner may delete, and what held it (to hold it again if a table references it)."""

    path: str
    epoch: int | None
    attempt: int | None


async def due_paths(session: AsyncSession, sink_id: int, delays: CleanupDelays, limit: int) -> list[DuePath]:
    """The sink's discarded paths that are due, and the paths a deletion of its left marked (it did not finish;
    only the holder of the sink's commit lock deletes for it, so under the lock any such mark is stale)."""
    rows = await session.execute(
        text(
            f"SELECT path, epoch, attempt FROM epoch_files WHERE sink_id = :sink_id AND {_CLEANER_WORK} "
            "ORDER BY path LIMIT :limit"
        ),
        {"sink_id": sink_id, "limit": limit, **delays.parameters()},
    )
    return [DuePath(path, epoch, attempt) for path, epoch, attempt in rows.all()]


async def settle_cleaned(session: AsyncSession, sink_id: int) -> list[int]:
    """Mark cleaned the sink's ABORTED epochs that hold no path any more (an empty one from the start)."""
    rows = await session.execute(
        text(
            """
            UPDATE pending_sink_state p SET files_cleaned = true, updated_at = now()
            WHERE p.sink_id = :sink_id AND p.status = 'ABORTED' AND NOT p.files_cleaned
              AND NOT EXISTS (SELECT 1 FROM epoch_files f WHERE f.sink_id = p.sink_id AND f.epoch = p.epoch)
            RETURNING p.epoch
            """
        ),
        {"sink_id": sink_id},
    )
    return sorted(rows.scalars().all())


# ---------------------------------------------------------------------------------------------- deletion marks


class MarkRule(enum.StrEnum):
    """Which paths a deletion may mark."""

    # Only paths nothing claims (the orphan sweep; files a compaction wrote and did not commit).
    UNCLAIMED = "unclaimed"
    # The deleting sink's discarded paths that are due, and its own marks of a deletion that did not finish.
    DISCARDED = "discarded"
    # Paths nothing claims, and paths a COMMITTED epoch's attempt holds: files that only expired snapshots
    # referenced (they were in the table).
    EXPIRED = "expired"
    # Paths nothing claims, and paths the deleting sink's own COMMITTED epochs hold: files of a table it dropped
    # (never one another sink's epoch holds).
    DROPPED = "dropped"


_MARK_UNCLAIMED = """
    INSERT INTO epoch_files (path, sink_id, deleting_at)
    SELECT DISTINCT path, :sink_id, clock_timestamp() FROM unnest(CAST(:paths AS text[])) AS path
    ON CONFLICT (path) DO NOTHING
    RETURNING path
"""

_MARK_DISCARDED = f"""
    UPDATE epoch_files SET deleting_at = COALESCE(deleting_at, clock_timestamp())
    WHERE path = ANY(CAST(:paths AS text[])) AND sink_id = :sink_id AND {_CLEANER_WORK}
    RETURNING path
"""

_MARK_COMMITTED_OR_UNCLAIMED = """
    WITH committed AS (
        UPDATE epoch_files f SET deleting_at = clock_timestamp()
        FROM pending_sink_state p
        WHERE f.path = ANY(CAST(:paths AS text[])) AND p.sink_id = f.sink_id AND p.epoch = f.epoch {which_sinks}
          AND p.status = 'COMMITTED' AND f.attempt IS NOT NULL AND f.discarded_at IS NULL AND f.deleting_at IS NULL
        RETURNING f.path
    ), unclaimed AS (
        INSERT INTO epoch_files (path, sink_id, deleting_at)
        SELECT DISTINCT path, :sink_id, clock_timestamp() FROM unnest(CAST(:paths AS text[])) AS path
        ON CONFLICT (path) DO NOTHING
        RETURNING path
    )
    SELECT path FROM committed UNION SELECT path FROM unclaimed
"""

_MARKS = {
    MarkRule.UNCLAIMED: _MARK_UNCLAIMED,
    MarkRule.DISCARDED: _MARK_DISCARDED,
    MarkRule.EXPIRED: _MARK_COMMITTED_OR_UNCLAIMED.format(which_sinks=""),
    MarkRule.DROPPED: _MARK_COMMITTED_OR_UNCLAIMED.format(which_sinks="AND f.sink_id = :sink_id"),
}


async def mark(
    connection: AsyncConnection, sink_id: int, paths: Sequence[str], rule: MarkRule, delays: CleanupDelays
) -> set[str]:
    """Mark for deletion the paths among `paths` that `rule` allows, in one statement (the connection is in
    autocommit: the marks stand before the caller deletes anything); return those marked."""
    parameters = {"sink_id": sink_id, "paths": list(paths), **delays.parameters()}
    return set((await connection.execute(text(_MARKS[rule]), parameters)).scalars().all())


async def unmark(connection: AsyncConnection, paths: Sequence[str]) -> None:
    """The paths are not deleted after all (a table references them, or they are not where they may be deleted):
    a mark made for the deletion goes, a claim that was marked is as it was."""
    if not paths:
        return
    parameters = {"paths": list(paths)}
    await connection.execute(
        text(
            "DELETE FROM epoch_files WHERE path = ANY(CAST(:paths AS text[])) AND deleted_at IS NULL "
            "AND deleting_at IS NOT NULL AND epoch IS NULL AND attempt IS NULL AND discarded_at IS NULL"
        ),
        parameters,
    )
    await connection.execute(
        text(
            "UPDATE epoch_files SET deleting_at = NULL WHERE path = ANY(CAST(:paths AS text[])) AND deleted_at IS NULL"
        ),
        parameters,
    )


async def record_deleted(connection: AsyncConnection, paths: Sequence[str]) -> None:
    """The marked paths are deleted from storage: each mark stays (no claim of it) for ORPHAN_GRACE_SECONDS, and no
    epoch holds it any more."""
    if not paths:
        return
    await connection.execute(
        text(
            "UPDATE epoch_files SET deleted_at = clock_timestamp(), epoch = NULL, attempt = NULL, "
            "discarded_at = NULL, keep_for_rerun = false "
            "WHERE path = ANY(CAST(:paths AS text[])) AND deleting_at IS NOT NULL"
        ),
        {"paths": list(paths)},
    )


async def expire_marks(connection: AsyncConnection, grace_seconds: float) -> int:
    """Forget the marks of deletions done more than grace_seconds ago, and any other row whose sink is gone (a
    release before migration 0014 deleted the sink: nothing decides its paths any more)."""
    result = await connection.execute(
        text(
            "DELETE FROM epoch_files WHERE deleted_at < now() - make_interval(secs => :grace) "
            "OR (sink_id IS NULL AND deleted_at IS NULL)"
        ),
        {"grace": grace_seconds},
    )
    return int(getattr(result, "rowcount", 0) or 0)
