"""Deleting files: the one place that proves, at the moment it deletes a file, that the file is garbage.

Every deletion the coordinator makes goes through `FileDeleter.delete`: the cleaner's (aborted attempts, replaced
attempts, dropped parts), maintenance's (the orphan sweep, files only expired snapshots referenced, files a
compaction wrote but could not commit), and an operator's deletion of a sink (the files it gave up, and the files of
the tables it drops). A path is deleted only when, right then:

1. the log marks it as being deleted (path_claims.mark, by the rule the caller is allowed), in a statement that
   checks that nothing claims it; no claim can take it afterwards, and the mark stays ORPHAN_GRACE_SECONDS after
   the deletion (a pre-commit that read the file before cannot claim it later: path_claims, `deadline`);
2. it lies where one of the caller's tables keeps its files, judged on that table loaded after the mark: on the
   table's storage, under its data directory (or its metadata directory, for the callers that delete metadata
   files), with no symbolic link on the way on a local file system (the real path lies there too, and the file is
   not a link), and under no other table's location nested inside (a directory holding `metadata/*.metadata.json`);
   a table the caller dropped (DroppedTable) is judged as loaded right before its drop while the catalog, asked
   after the mark, has no table under its name, and as any table once one was created again under it;
3. no metadata of those tables, loaded after the mark, reaches it (metadata files, manifest lists, manifests, data
   and delete files, statistics files): a dropped table that the catalog no longer has reaches nothing;
4. the caller still holds the sink's commit lock, verified right before the delete (an operator's fence commit
   under that lock means no append built on an older head can land: docs/architecture.md).

A path that fails 2 or 3 is unmarked and reported, never deleted; the caller decides what it means (the cleaner
settles a referenced one with the tables' side).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

import structlog

from coordinator_service import metrics
from coordinator_service.log import path_claims
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.database import Database
from coordinator_service.log.path_claims import CleanupDelays, MarkRule
from coordinator_service.tables import table_maintenance as tm
from coordinator_service.tables.catalog_calls import in_catalog
from coordinator_service.tables.format import LoadedTable, TableFormat

log = structlog.get_logger(__name__)

# Paths marked, proven and deleted at a time (one lock verification each).
DELETE_BATCH = 100


@dataclass
class Deletion:
    """What a deletion did with the paths it was given."""

    deleted: list[str] = field(default_factory=list)
    # The tables' metadata reaches them: kept (unmarked).
    referenced: list[str] = field(default_factory=list)
    # Not where the tables keep their files (or a link): kept, with the reason.
    refused: dict[str, str] = field(default_factory=dict)
    # The rule did not let them be marked (something claims them): kept.
    claimed: list[str] = field(default_factory=list)

    def add(self, other: Deletion) -> None:
        self.deleted += other.deleted
        self.referenced += other.referenced
        self.refused.update(other.refused)
        self.claimed += other.claimed


@dataclass(frozen=True)
class DroppedTable:
    """A table the caller dropped from its catalog under the sink's commit lock, as loaded right before the drop:
    where it kept its files, for as long as no table exists under its name again."""

    name: str
    before_drop: LoadedTable


class FileDeleter:
    """Deletes files of a sink's tables, each proven garbage at that moment (see the module)."""

    def __init__(self, database: Database, iceberg: TableFormat, delays: CleanupDelays) -> None:
        self.database = database
        self.iceberg = iceberg
        self.delays = delays

    async def delete(
        self,
        sink: str,
        sink_id: int,
        lock: CommitLock,
        tables: Sequence[str | DroppedTable],
        paths: Iterable[str],
        rule: MarkRule,
        *,
        metadata_files: bool = False,
        batch: int = DELETE_BATCH,
        after_batch: Callable[[], Awaitable[None]] | None = None,
    ) -> Deletion:
        """Delete those of `paths` (canonical URIs) that are garbage now, `batch` at a time (`after_batch` awaited
        after each), under the sink's commit lock. `tables`: the tables the paths may belong to (each path is judged
        on the table whose data, or with `metadata_files` metadata, directory holds it), dropped ones included;
        `rule`: which paths the log lets this caller mark."""
        pending = list(dict.fromkeys(paths))
        done = Deletion()
        for first in range(0, len(pending), batch):
            some = pending[first : first + batch]
            done.add(await self._delete_batch(sink_id, lock, tables, some, rule, metadata_files))
            if after_batch is not None:
                await after_batch()
        if done.refused:
            metrics.DELETIONS_REFUSED.labels(sink).inc(len(done.refused))
            log.error(
                "refused to delete files that are not where the sink's tables keep theirs",
                sink=sink,
                files={path: why for path, why in list(done.refused.items())[:10]},
                refused=len(done.refused),
            )
        return done

    async def _delete_batch(
        self,
        sink_id: int,
        lock: CommitLock,
        tables: Sequence[str | DroppedTable],
        paths: list[str],
        rule: MarkRule,
        metadata_files: bool,
    ) -> Deletion:
        async with self.database.connection(autocommit=True) as connection:
            marked = await path_claims.mark(connection, sink_id, paths, rule, self.delays)
        outcome = Deletion(claimed=[path for path in paths if path not in marked])
        if not marked:
            return outcome
        deleting = False
        try:
            judged = [await in_catalog(self._as_now, table) for table in tables]
            loaded = [table for table, _ in judged]
            placed, outcome.refused = await in_catalog(_place, loaded, sorted(marked), metadata_files)
            existing = [table for table, exists in judged if exists]
            referenced = await in_catalog(_referenced_by, existing, placed)
            outcome.referenced = sorted(set().union(*placed.values()) & referenced)
            await lock.verify()
            deleting = True
            for index, batch in placed.items():
                gone, links = await in_catalog(_delete_files, loaded[index], [p for p in batch if p not in referenced])
                outcome.deleted += gone
                outcome.refused.update(dict.fromkeys(links, "a symbolic link"))
        finally:
            # Nothing deleted yet: every mark goes. A failure while deleting leaves the rest marked, for the sink's
            # cleaner to prove and delete again (under the lock, a mark of its sink is a deletion that did not end).
            kept = [*outcome.referenced, *outcome.refused] if deleting else sorted(marked - set(outcome.deleted))
            async with self.database.connection(autocommit=True) as connection:
                await path_claims.record_deleted(connection, outcome.deleted)
                await path_claims.unmark(connection, kept)
        return outcome

    def _as_now(self, table: str | DroppedTable) -> tuple[LoadedTable, bool]:
        """The table to judge paths on, read after the mark, and whether it exists: a dropped table of whose name
        the catalog has no table is gone (its metadata reaches nothing) and kept its files where it did."""
        if isinstance(table, str):
            return self.iceberg.load(table), True
        if not self.iceberg.exists(table.name):
            return table.before_drop, False
        return self.iceberg.load(table.name), True


def _place(
    tables: Sequence[LoadedTable], paths: Sequence[str], metadata_files: bool
) -> tuple[dict[int, list[str]], dict[str, str]]:
    """Each path with the index of the table that keeps it, or the reason it is none of theirs."""
    placed: dict[int, list[str]] = {}
    refused: dict[str, str] = {}
    nested = _NestedTables()
    roots = [tm.storage_roots(table) for table in tables]
    for path in paths:
        reasons = []
        for index, (table, root) in enumerate(zip(tables, roots, strict=True)):
            directories = [root.data, root.metadata] if metadata_files else [root.data]
            why = _why_not_under(path, directories, root.location, table, nested)
            if why is None:
                placed.setdefault(index, []).append(path)
                break
            reasons.append(why)
        else:
            refused[path] = "; ".join(reasons) or "no table"
    return placed, refused


def _why_not_under(
    path: str, directories: Sequence[str], location: str, table: LoadedTable, nested: _NestedTables
) -> str | None:
    """None when `path` lies under one of the table's `directories` (and nowhere it must not be deleted from)."""
    parsed = urlparse(path)
    inside = None
    for directory in directories:
        root = urlparse(directory)
        if (parsed.scheme or "file", parsed.netloc) != (root.scheme or "file", root.netloc):
            continue
        if parsed.path.startswith(root.path.rstrip("/") + "/") and ".." not in parsed.path.split("/"):
            inside = directory
            break
    if inside is None:
        return f"outside {' and '.join(directories)}"
    if (parsed.scheme or "file") == "file":
        real, real_root = os.path.realpath(parsed.path), os.path.realpath(urlparse(inside).path)
        if real != posixpath.normpath(parsed.path) or not real.startswith(real_root.rstrip("/") + "/"):
            return f"reached through a symbolic link (its real path is {real})"
    other = nested.root_between(table, location, inside, path)
    if other is not None:
        return f"inside another table's location {other}"
    return None


class _NestedTables:
    """Whether a directory is another table's location (it holds metadata/*.metadata.json); each directory looked
    at once per deletion."""

    def __init__(self) -> None:
        self._is_root: dict[str, bool] = {}

    def root_between(self, table: LoadedTable, location: str, directory: str, path: str) -> str | None:
        """The first of `directory` and the directories between it and `path` that is another table's location
        (the table's own location is its own), or None."""
        below = path[len(directory.rstrip("/")) + 1 :].split("/")[:-1]
        current = directory.rstrip("/")
        for part in ["", *below]:
            current = f"{current}/{part}" if part else current
            if current != location.rstrip("/") and self._holds_table(table, current):
                return current
        return None

    def _holds_table(self, table: LoadedTable, directory: str) -> bool:
        known = self._is_root.get(directory)
        if known is None:
            known = self._is_root[directory] = tm.holds_table_metadata(table, directory)
        return known


def nested_table_roots(location: str, listed: Iterable[str]) -> set[str]:
    """The directories strictly below `location` that hold another table, from a listing of files under it: those
    with a metadata/*.metadata.json."""
    base = location.rstrip("/") + "/"
    roots = set()
    for uri in listed:
        if uri.startswith(base) and uri.endswith(tm.METADATA_FILE_SUFFIX):
            directory, _, _ = uri.rpartition("/")
            parent, _, name = directory.rpartition("/")
            if name == "metadata" and parent.startswith(base):
                roots.add(parent)
    return roots


def _referenced_by(tables: Sequence[LoadedTable], placed: Mapping[int, Sequence[str]]) -> set[str]:
    """Those of the placed paths that any of the tables' metadata reaches (the tables are loaded after the mark)."""
    candidates = {tm.same_file(path): path for batch in placed.values() for path in batch}
    if not candidates:
        return set()
    referenced: set[str] = set()
    for table in tables:
        referenced |= tm.referenced_files(table)
    return {path for same, path in candidates.items() if same in referenced}


def _delete_files(table: LoadedTable, paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Delete through the table's own storage; a file already gone counts as deleted, a local symbolic link is
    never deleted (nor followed). Returns the deleted and the links."""
    deleted, links = [], []
    for path in paths:
        parsed = urlparse(path)
        if (parsed.scheme or "file") == "file":
            try:
                if stat.S_ISLNK(os.lstat(parsed.path).st_mode):
                    links.append(path)
                    continue
            except FileNotFoundError:
                deleted.append(path)
                continue
        tm.delete_stored_file(table, path)
        deleted.append(path)
    return deleted, links
