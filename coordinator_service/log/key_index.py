"""The key index's statements (key_index_tables, key_index_files, key_index; migration 0015): one index per keyed table,
locked by its row while it changes, its files numbered within it, its rows loaded with COPY.

Every function runs in the caller's transaction, which holds the index's row lock (lock_index) for anything that
changes the index: two sinks may write the same table, and each one's catch-up must see the other's (the engine's
coordinator_service.engine.key_index is the one caller).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

# COPY's binary format (PostgreSQL's documentation, "COPY", "Binary Format"): the signature, flags and header
# extension length, then each row, then the trailer (a field count of -1).
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_TRAILER = b"\xff\xff"
# A row's fields before its key's bytes: the field count, then each field's length and value, in network order.
_COPY_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("index_id_size", ">i4"),
        ("index_id", ">i4"),
        ("file_row_size", ">i4"),
        ("file_row", ">i8"),
        ("key_size", ">i4"),
    ]
)
_COPY_STATEMENT = "COPY key_index (index_id, file_row, key) FROM STDIN (FORMAT BINARY)"
# A row's place in key_index.file_row: its file's number in these high bits, its position in the low ones.
_POSITION_BITS = 32
_POSITIONS = 1 << _POSITION_BITS


def file_row(file_id: int, position: int) -> int:
    """Where a row is, as key_index.file_row holds it."""
    return (file_id << _POSITION_BITS) | position


@dataclass(frozen=True)
class IndexState:
    """An index as its row says: which snapshot of the table its rows are the live rows of (None: the table had no
    snapshot), whether it was ever built (an index created and not built yet holds nothing), and for which key."""

    index_id: int
    snapshot_id: int | None
    built: bool
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    rows: int


@dataclass(frozen=True)
class IndexedFile:
    """A data file the index names: its number, path, and its manifest description (data_file_codec's bytes, under
    the partition type of spec `spec_id` as schema `schema_id` typed it)."""

    file_id: int
    path: str
    spec_id: int
    schema_id: int
    data_file: bytes


@dataclass(frozen=True)
class NewFile:
    """A data file to name in the index (its number is given by add_files)."""

    path: str
    spec_id: int
    schema_id: int
    data_file: bytes


_LOCK = """
    SELECT index_id, snapshot_id, built_at IS NOT NULL, key_columns, key_types, rows
    FROM key_index_tables WHERE table_uuid = :table_uuid FOR UPDATE
"""


async def lock_index(
    session: AsyncSession, table_uuid: uuid.UUID, table_identifier: str, key_columns: Sequence[str]
) -> IndexState:
    """The table's index, its row locked until the transaction ends; created (not built) when the table has none."""
    index = await existing_index(session, table_uuid)
    if index is not None:
        return index
    # Inserted only when missing: an INSERT that does nothing still takes a number of the serial.
    await session.execute(
        text(
            "INSERT INTO key_index_tables (table_uuid, table_identifier, key_columns, key_types, built_at) "
            "VALUES (:table_uuid, :table_identifier, :key_columns, '{}', NULL) ON CONFLICT (table_uuid) DO NOTHING"
        ),
        {"table_uuid": table_uuid, "table_identifier": table_identifier, "key_columns": list(key_columns)},
    )
    created = await existing_index(session, table_uuid)
    assert created is not None, f"the key index of table {table_uuid} vanished as it was created"
    return created


async def existing_index(session: AsyncSession, table_uuid: uuid.UUID) -> IndexState | None:
    """The table's index, its row locked until the transaction ends; None when it has none."""
    row = (await session.execute(text(_LOCK), {"table_uuid": table_uuid})).one_or_none()
    if row is None:
        return None
    index_id, snapshot_id, built, columns, types, rows = row
    return IndexState(index_id, snapshot_id, built, tuple(columns), tuple(types), rows)


async def empty_index(
    session: AsyncSession, index_id: int, table_identifier: str, key_columns: Sequence[str], key_types: Sequence[str]
) -> None:
    """Remove every row and file of the index, which is then not built, for the key given (a rebuild's start)."""
    await session.execute(text("DELETE FROM key_index WHERE index_id = :index_id"), {"index_id": index_id})
    await session.execute(text("DELETE FROM key_index_files WHERE index_id = :index_id"), {"index_id": index_id})
    await session.execute(
        text(
            "UPDATE key_index_tables SET snapshot_id = NULL, built_at = NULL, rows = 0, updated_at = now(), "
            "table_identifier = :table_identifier, key_columns = :key_columns, key_types = :key_types "
            "WHERE index_id = :index_id"
        ),
        {
            "index_id": index_id,
            "table_identifier": table_identifier,
            "key_columns": list(key_columns),
            "key_types": list(key_types),
        },
    )


async def mark_built(session: AsyncSession, index_id: int, snapshot_id: int | None, rows: int) -> None:
    """The index now holds the `rows` live rows of `snapshot_id` (a rebuild's end)."""
    await session.execute(
        text(
            "UPDATE key_index_tables SET snapshot_id = :snapshot_id, rows = :rows, built_at = now(), "
            "updated_at = now() WHERE index_id = :index_id"
        ),
        {"index_id": index_id, "snapshot_id": snapshot_id, "rows": rows},
    )


async def mark_unbuilt(session: AsyncSession, index_id: int) -> None:
    """Take the index as wrong: the next use rebuilds it."""
    await session.execute(
        text("UPDATE key_index_tables SET built_at = NULL, updated_at = now() WHERE index_id = :index_id"),
        {"index_id": index_id},
    )


async def move_to(session: AsyncSession, index_id: int, snapshot_id: int, rows_changed: int) -> None:
    """The index now reflects `snapshot_id`, with `rows_changed` rows more (or fewer) than before."""
    await session.execute(
        text(
            "UPDATE key_index_tables SET snapshot_id = :snapshot_id, rows = rows + :rows_changed, updated_at = now() "
            "WHERE index_id = :index_id"
        ),
        {"index_id": index_id, "snapshot_id": snapshot_id, "rows_changed": rows_changed},
    )


async def without_statement_timeout(session: AsyncSession) -> None:
    """No statement timeout for the rest of the transaction: a rebuild loads a table's every row in one COPY."""
    await session.execute(text("SET LOCAL statement_timeout = 0"))


async def refresh_statistics(connection: AsyncConnection) -> None:
    """ANALYZE the index's rows (outside the transaction that loaded them: it holds its lock to the end of one)."""
    await connection.execute(text("ANALYZE key_index"))


async def find_keys(session: AsyncSession, index_id: int, keys: Sequence[bytes]) -> list[tuple[bytes, int, int]]:
    """The rows of these keys (their encoded bytes): (key, file_id, position), in no particular order."""
    if not keys:
        return []
    cursor = await (await _driver(session)).execute(
        "SELECT key, file_row FROM key_index WHERE index_id = %s AND key = ANY(%b)", (index_id, list(keys)), binary=True
    )
    return [(bytes(key), place >> _POSITION_BITS, place & (_POSITIONS - 1)) for key, place in await cursor.fetchall()]


async def files_by_id(session: AsyncSession, index_id: int, file_ids: Sequence[int]) -> list[IndexedFile]:
    rows = await session.execute(
        text(
            "SELECT file_id, path, spec_id, schema_id, data_file FROM key_index_files "
            "WHERE index_id = :index_id AND file_id = ANY(CAST(:file_ids AS integer[]))"
        ),
        {"index_id": index_id, "file_ids": list(file_ids)},
    )
    return [
        IndexedFile(file_id, path, spec_id, schema_id, bytes(data_file))
        for file_id, path, spec_id, schema_id, data_file in rows.all()
    ]


async def file_ids_by_path(session: AsyncSession, index_id: int, paths: Sequence[str]) -> dict[str, int]:
    """The numbers of those of these paths that the index names."""
    if not paths:
        return {}
    rows = await session.execute(
        text(
            "SELECT path, file_id FROM key_index_files "
            "WHERE index_id = :index_id AND path = ANY(CAST(:paths AS text[]))"
        ),
        {"index_id": index_id, "paths": list(paths)},
    )
    return {path: file_id for path, file_id in rows.all()}


async def add_files(session: AsyncSession, index_id: int, files: Sequence[NewFile]) -> dict[str, int]:
    """Name these data files in the index, numbered after its highest number; their numbers by path."""
    if not files:
        return {}
    highest = await session.scalar(
        text("SELECT coalesce(max(file_id), 0) FROM key_index_files WHERE index_id = :index_id"),
        {"index_id": index_id},
    )
    numbers = {file.path: int(highest or 0) + index for index, file in enumerate(files, start=1)}
    await session.execute(
        text(
            "INSERT INTO key_index_files (index_id, file_id, path, spec_id, schema_id, data_file) "
            "SELECT :index_id, * FROM unnest(CAST(:file_ids AS integer[]), CAST(:paths AS text[]), "
            "CAST(:spec_ids AS integer[]), CAST(:schema_ids AS integer[]), CAST(:data_files AS bytea[]))"
        ),
        {
            "index_id": index_id,
            "file_ids": [numbers[file.path] for file in files],
            "paths": [file.path for file in files],
            "spec_ids": [file.spec_id for file in files],
            "schema_ids": [file.schema_id for file in files],
            "data_files": [file.data_file for file in files],
        },
    )
    return numbers


async def remove_files(session: AsyncSession, index_id: int, file_ids: Sequence[int]) -> int:
    """Remove these files and their rows from the index; how many rows went."""
    if not file_ids:
        return 0
    removed = await session.execute(
        text(
            "DELETE FROM key_index k USING unnest(CAST(:firsts AS bigint[])) AS gone(first) "
            "WHERE k.index_id = :index_id AND k.file_row >= gone.first AND k.file_row < gone.first + :positions"
        ),
        {"index_id": index_id, "firsts": [file_row(file_id, 0) for file_id in file_ids], "positions": _POSITIONS},
    )
    await session.execute(
        text("DELETE FROM key_index_files WHERE index_id = :index_id AND file_id = ANY(CAST(:file_ids AS integer[]))"),
        {"index_id": index_id, "file_ids": list(file_ids)},
    )
    return int(removed.rowcount)  # type: ignore[attr-defined]


async def remove_keys(session: AsyncSession, index_id: int, keys: Sequence[bytes]) -> int:
    """Remove every row of these keys (their encoded bytes); how many there were."""
    if not keys:
        return 0
    cursor = await (await _driver(session)).execute(
        "DELETE FROM key_index WHERE index_id = %s AND key = ANY(%b)", (index_id, list(keys)), binary=True
    )
    return cursor.rowcount


async def remove_rows(session: AsyncSession, index_id: int, file_rows: Sequence[int]) -> int:
    """Remove the rows at these places (file_row); how many there were (a place the index does not hold is no row)."""
    if not file_rows:
        return 0
    cursor = await (await _driver(session)).execute(
        "DELETE FROM key_index WHERE index_id = %s AND file_row = ANY(%b)", (index_id, list(file_rows))
    )
    return cursor.rowcount


async def forget_index(session: AsyncSession, table_uuid: uuid.UUID) -> bool:
    """Drop the table's index, rows and all; whether it had one."""
    index = await existing_index(session, table_uuid)
    if index is None:
        return False
    await session.execute(text("DELETE FROM key_index WHERE index_id = :index_id"), {"index_id": index.index_id})
    await session.execute(text("DELETE FROM key_index_tables WHERE index_id = :index_id"), {"index_id": index.index_id})
    return True


def copy_rows(index_id: int, file_ids: int | Sequence[int], positions: pa.Array, keys: pa.BinaryArray) -> bytes:
    """Rows of the index in COPY's binary format, without its header and trailer (copy_in adds them): each row's
    file (one number for all, or one per row), position and key's bytes.

    Raises ValueError for a position beyond what file_row holds (a data file of over 4,294,967,295 rows)."""
    count = len(keys)
    places = positions.to_numpy(zero_copy_only=False).astype(np.int64)
    if count and (places.min() < 0 or places.max() >= _POSITIONS):
        raise ValueError(f"row position {places.max()} is beyond the key index's {_POSITIONS - 1}")
    heads = np.empty(count, dtype=_COPY_ROW)
    heads["fields"] = 3
    heads["index_id_size"] = 4
    heads["index_id"] = index_id
    heads["file_row_size"] = 8
    heads["file_row"] = (np.asarray(file_ids, dtype=np.int64) << _POSITION_BITS) | places
    heads["key_size"] = pc.binary_length(keys).to_numpy(zero_copy_only=False)
    prefix = pa.Array.from_buffers(pa.binary(_COPY_ROW.itemsize), count, [None, pa.py_buffer(heads.tobytes())])
    rows = pc.binary_join_element_wise(prefix.cast(pa.binary()), keys, b"")
    ends = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=count + 1)
    return rows.buffers()[2].slice(0, int(ends[count])).to_pybytes() if count else b""


async def copy_in(session: AsyncSession, chunks: AsyncIterable[bytes]) -> None:
    """Load rows into key_index with one COPY: each chunk is copy_rows' bytes."""
    async with (await _driver(session)).cursor() as cursor, cursor.copy(_COPY_STATEMENT) as copy:
        await copy.write(_COPY_HEADER)
        async for chunk in chunks:
            await copy.write(chunk)
        await copy.write(_COPY_TRAILER)


async def _driver(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The session's psycopg connection, in its transaction: for COPY, and for the statements that send or return
    thousands of rows (SQLAlchemy's rows cost more than the statement). Such statements send their arrays in binary
    (`%b`): psycopg's text dumper escapes each element with a regular expression, 0.3 s for 35,000 keys in the event
    loop, against 6 ms."""
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return driver
