"""Where keys live: a keyed table's live rows of given keys, as (data file path, row position), and the positions a
sequence of epochs deletes when each replaces or deletes the rows of the keys it touched.

A keyed table's identifier fields (`identifier-field-ids`) are its key. The live rows are found by scanning the
table with pyiceberg: the files its current snapshot holds (pruned by the keys' values where the file statistics
allow), their key columns read whole in file order, so that a row's index is its position, minus the positions the
table's position delete files already delete. That costs as much as the table, not the epoch (docs/architecture.md,
"Row mutations: position deletes resolved at commit"); the key index (coordinator_service.engine.key_index) answers
the same question in O(keys), and is built from this same scan of every live row (live_key_rows).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
    Reference,
)
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import IntegerType, LongType, StringType

from coordinator_service.tables.file_columns import data_file_columns
from coordinator_service.tables.position_deletes import RowNumbers, deleted_rows

# A key's values, in the order of the table's identifier fields.
Key: TypeAlias = tuple[Any, ...]
# A row of a data file: its path and its position in the file (0 first).
RowPosition: TypeAlias = tuple[str, int]
# The column of a file's rows that holds each row's position in the file, beside its key columns.
POSITION = "pos"

T = TypeVar("T")
R = TypeVar("R")

# Up to this many distinct values of a key column, the scan's filter names them (pyiceberg and Java prune files by
# IN lists up to 200 values); beyond it, their range.
_IN_LIST_LIMIT = 200
# Data files read at once while resolving keys.
_READERS = 4
# Key column types whose values become a scan filter that prunes files by their bounds; other keys read every file.
_PRUNABLE = (IntegerType, LongType, StringType)


class KeysUnresolvable(ValueError):
    """What no retry of a keyed commit can resolve: the table is not a keyed format v2 table (no key, a nested one),
    a data file holds another number of rows than its manifest entry counts, or an epoch's rows hold a key twice. The
    committer stops on it (the sink is stuck, and says why) instead of retrying the same epochs forever."""


class DuplicateKeys(KeysUnresolvable):
    """An epoch's new rows hold a key more than once: committing them would make the key appear twice."""


@dataclass(frozen=True)
class EpochRows:
    """One epoch's change to a keyed table: the data files of its rows (the last row of each key it upserted) and the
    keys it touched (upserted or deleted), as a table of the key columns. The keys of its rows count as touched
    whether or not `touched_keys` names them."""

    data_files: Sequence[DataFile]
    touched_keys: pa.Table


@dataclass
class LiveRows:
    """Where each key lives among a table's live rows, and the data files of those rows by path."""

    positions: dict[Key, list[RowPosition]] = field(default_factory=dict)
    data_files: dict[str, DataFile] = field(default_factory=dict)


@dataclass(frozen=True)
class FileRows:
    """Rows of one data file: its key columns (by name, in the key's order) and POSITION, each row's position."""

    data_file: DataFile
    rows: pa.Table


@dataclass(frozen=True)
class EpochKeys:
    """What a sequence of epochs does by key: each epoch's new rows (key, where it is) and every key it touched (the
    keys of its new rows included)."""

    new_rows: tuple[tuple[tuple[Key, RowPosition], ...], ...]
    touched: tuple[frozenset[Key], ...]

    @property
    def keys(self) -> set[Key]:
        """Every key any of the epochs touched: the keys whose live rows the epochs' commit must know."""
        return set().union(*self.touched)


@dataclass(frozen=True)
class ResolvedDeletes:
    """The row positions a sequence of epochs deletes, resolved against the table at `base_snapshot_id` (None: the
    table had no snapshot): by data file path, sorted, with each path's data file (the table's or an epoch's)."""

    base_snapshot_id: int | None
    positions: dict[str, list[int]]
    data_files: dict[str, DataFile]
    keys_resolved: int

    @property
    def deleted_rows(self) -> int:
        return sum(len(rows) for rows in self.positions.values())


def key_columns(schema: Schema) -> tuple[str, ...]:
    """The names of the schema's identifier fields (its key), in their order. Raises KeysUnresolvable when it has
    none, or a key column that is not a top-level column."""
    if not schema.identifier_field_ids:
        raise KeysUnresolvable("the table has no identifier fields (identifier-field-ids): it has no key to resolve")
    top_level = {column.field_id for column in schema.fields}
    names = []
    for field_id in schema.identifier_field_ids:
        name = schema.find_column_name(field_id)
        if name is None or field_id not in top_level:
            raise KeysUnresolvable(
                f"the key column {name or field_id} is nested: only top-level key columns are resolved"
            )
        names.append(name)
    return tuple(names)


def key_schema(schema: Schema) -> Schema:
    """The table schema's key columns alone (their field ids and types)."""
    return schema.select(*key_columns(schema))


def keys_of(rows: pa.Table, schema: Schema) -> list[Key]:
    """The keys of `rows` (a table holding the key columns by name, in any type that casts to theirs), in row order.
    Raises KeysUnresolvable when a key column is missing or holds a null: a key is never null."""
    arrow = key_schema(schema).as_arrow()
    columns = []
    for name in key_columns(schema):
        if name not in rows.column_names:
            raise KeysUnresolvable(
                f"the keys have no column {name}: the table's key is {', '.join(key_columns(schema))}"
            )
        column = rows.column(name)
        if column.null_count:
            raise KeysUnresolvable(f"the keys hold {column.null_count} null {name}: a key is never null")
        columns.append(column.cast(arrow.field(name).type).to_pylist())
    return list(zip(*columns, strict=True))


def live_rows(table: Table, keys: Iterable[Key]) -> LiveRows:
    """Where the `keys` live among the table's live rows (its current snapshot, minus the rows its position delete
    files delete). A key the table does not hold is absent; a key the table holds more than once has all its rows."""
    wanted = set(keys)
    found = LiveRows()
    if not wanted or table.current_snapshot() is None:
        return found
    schema = table.schema()
    names = key_columns(schema)
    wanted_table = pa.Table.from_pylist([dict(zip(names, key, strict=True)) for key in wanted])
    for file_rows in live_key_rows(table, live_file_tasks(table, _key_filter(schema, wanted))):
        for key, position in _wanted_rows(file_rows.rows, wanted_table, names):
            found.positions.setdefault(key, []).append((file_rows.data_file.file_path, position))
            found.data_files[file_rows.data_file.file_path] = file_rows.data_file
    return found


def live_file_tasks(table: Table, row_filter: BooleanExpression | None = None) -> list[FileScanTask]:
    """The data files of the table's current snapshot with their delete files (none without a snapshot); with
    `row_filter`, only those whose statistics may hold a row passing it."""
    if table.current_snapshot() is None:
        return []
    names = key_columns(table.schema())
    return list(table.scan(row_filter=row_filter or AlwaysTrue(), selected_fields=names).plan_files())


def live_key_rows(table: Table, files: Sequence[FileScanTask]) -> Generator[FileRows]:
    """The live rows of these files of the table (live_file_tasks), file by file in their order, a few files read at
    once: each data file's key columns and positions, minus the positions its delete files delete."""
    # Threads of its own: each file's read runs on pyiceberg's pool, which a task waiting in that pool could starve.
    with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="key-resolution") as readers:
        deleted = deleted_rows(table.io, (each for task in files for each in task.delete_files), readers.map)

        def read(task: FileScanTask) -> FileRows:
            rows = _without_deleted(file_key_rows(table, task.file), deleted.get(task.file.file_path))
            return FileRows(task.file, rows)

        yield from _in_order(readers, read, files)


def _in_order(readers: Executor, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """`function` of each item, in the items' order, computed on `readers` with at most twice their number pending
    (a consumer slower than the reads holds a few files' rows, not the table's)."""
    pending: deque[Future[R]] = deque()
    for item in items:
        pending.append(readers.submit(function, item))
        if len(pending) >= 2 * _READERS:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _key_filter(schema: Schema, keys: set[Key]) -> BooleanExpression:
    """A filter every row of `keys` passes, that prunes files whose bounds hold none of them (where it can)."""
    if not keys:
        return AlwaysFalse()
    conditions: list[BooleanExpression] = []
    for index, name in enumerate(key_columns(schema)):
        if not isinstance(schema.find_field(name).field_type, _PRUNABLE):
            continue
        values = {key[index] for key in keys}
        column = Reference(name)
        if len(values) <= _IN_LIST_LIMIT:
            conditions.append(In(term=column, values=values))
        else:
            lowest, highest = min(values), max(values)
            conditions.append(
                And(GreaterThanOrEqual(term=column, value=lowest), LessThanOrEqual(term=column, value=highest))
            )
    if not conditions:
        return AlwaysTrue()
    return conditions[0] if len(conditions) == 1 else And(*conditions)


def file_key_rows(table: Table, data_file: DataFile) -> pa.Table:
    """Every row of one of the table's data files, in file order (no delete applied): its key columns and POSITION.

    Raises KeysUnresolvable when the file holds another number of rows than its manifest entry counts."""
    rows = data_file_columns(table, [data_file], key_columns(table.schema()))
    if rows.num_rows != data_file.record_count:
        raise KeysUnresolvable(
            f"data file {data_file.file_path} read {rows.num_rows} rows where its manifest entry counts "
            f"{data_file.record_count}: row positions cannot be trusted"
        )
    return rows.append_column(POSITION, pa.array(range(rows.num_rows), pa.int64()))


def _without_deleted(rows: pa.Table, deleted: RowNumbers | None) -> pa.Table:
    if deleted is None:
        return rows
    return rows.filter(pc.invert(pc.is_in(rows.column(POSITION), value_set=pa.array(deleted, pa.int64()))))


def _wanted_rows(rows: pa.Table, wanted: pa.Table, names: Sequence[str]) -> list[tuple[Key, int]]:
    """The rows whose key is wanted: (key, position)."""
    if len(names) == 1:
        [name] = names
        column = rows.column(name)
        rows = rows.filter(pc.is_in(column, value_set=wanted.column(name).cast(column.type).combine_chunks()))
    else:
        typed = pa.table({name: wanted.column(name).cast(rows.column(name).type) for name in names})
        rows = rows.join(typed, keys=list(names), join_type="left semi")
    columns = [rows.column(name).to_pylist() for name in names]
    return list(zip(zip(*columns, strict=True), rows.column(POSITION).to_pylist(), strict=True))


def epoch_rows(table: Table, data_files: Sequence[DataFile]) -> list[tuple[Key, RowPosition]]:
    """The keys of an epoch's new rows, with where each is: (key, (path, position))."""
    names = key_columns(table.schema())
    found: list[tuple[Key, RowPosition]] = []
    for data_file in data_files:
        rows = file_key_rows(table, data_file)
        columns = [rows.column(name).to_pylist() for name in names]
        found.extend(
            (key, (data_file.file_path, position))
            for key, position in zip(zip(*columns, strict=True), rows.column(POSITION).to_pylist(), strict=True)
        )
    return found


def epoch_keys(table: Table, epochs: Sequence[EpochRows]) -> EpochKeys:
    """The epochs' new rows (their data files read: O(epoch)) and the keys each touched.

    Raises DuplicateKeys when an epoch's rows hold a key twice."""
    schema = table.schema()
    new_rows = [epoch_rows(table, epoch.data_files) for epoch in epochs]
    touched: list[frozenset[Key]] = []
    for epoch, rows in zip(epochs, new_rows, strict=True):
        _refuse_duplicates(rows)
        touched.append(frozenset(keys_of(epoch.touched_keys, schema)) | {key for key, _ in rows})
    return EpochKeys(tuple(tuple(rows) for rows in new_rows), tuple(touched))


def resolve_epochs(table: Table, epochs: Sequence[EpochRows], keys: EpochKeys, live: LiveRows) -> ResolvedDeletes:
    """The positions that committing `epochs` (in order, as one snapshot) on the table as loaded deletes, given their
    `keys` (epoch_keys) and where those keys live among the table's live rows (`live`: live_rows of keys.keys, or the
    key index's same answer): each epoch deletes the live rows of every key it touched, including rows an earlier
    epoch of the sequence added, and its own rows become the live rows of their keys. Nothing is read."""
    positions = dict(live.positions)
    data_files = dict(live.data_files)
    deleted: dict[str, set[int]] = defaultdict(set)
    for epoch, rows, touched in zip(epochs, keys.new_rows, keys.touched, strict=True):
        for key in touched:
            for path, position in positions.pop(key, ()):
                deleted[path].add(position)
        for key, row in rows:
            positions[key] = [row]
        data_files.update((data_file.file_path, data_file) for data_file in epoch.data_files)
    snapshot = table.current_snapshot()
    return ResolvedDeletes(
        base_snapshot_id=None if snapshot is None else snapshot.snapshot_id,
        positions={path: sorted(rows) for path, rows in sorted(deleted.items())},
        data_files={path: data_files[path] for path in deleted},
        keys_resolved=sum(len(touched) for touched in keys.touched),
    )


def _refuse_duplicates(rows: Sequence[tuple[Key, RowPosition]]) -> None:
    seen: dict[Key, RowPosition] = {}
    for key, row in rows:
        if key in seen:
            raise DuplicateKeys(
                f"the key {key} is in an epoch's rows twice ({seen[key][0]} row {seen[key][1]} and {row[0]} row "
                f"{row[1]}): an epoch writes one row per key, the last of it"
            )
        seen[key] = row
