"""Whether a writer's Arrow schema fits a table: the check RegisterWriter, EnsureTables and every pre-commit make (the
same rules), and the misfit in words."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.exceptions import (
    ValidationError,
)
from pyiceberg.table import Table

from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.tables.data_file_entries import FileRules, RulesKey
from coordinator_service.tables.pyiceberg_internals import check_file_schema, evolved_schema


def decode_arrow_schema(serialized: bytes) -> pa.Schema:
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(serialized))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as error:
        raise InvalidArgument(
            f"arrow_schema is not an Arrow IPC-serialized schema ({cause(error)}); send schema.serialize()"
        ) from error
    for name in _field_names(schema):
        if "\x00" in name:
            raise InvalidArgument(f"arrow_schema: the field name {quote(name)} contains a NUL character")
    return schema


def _field_names(fields: Iterable[pa.Field]) -> Iterator[str]:
    """The names of the fields and of every field nested in them (struct fields, list items, map keys and values)."""
    for column in fields:
        yield column.name
        kind = column.type
        if pa.types.is_struct(kind):
            yield from _field_names(kind.fields)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            yield from _field_names([kind.value_field])
        elif pa.types.is_map(kind):
            yield from _field_names([kind.key_field, kind.item_field])


@dataclass(frozen=True)
class FitKey:
    """A file's Arrow schema (serialized, with its field ids) against one table schema."""

    rules_key: RulesKey
    file_schema: bytes
    rules: FileRules = field(compare=False, hash=False, repr=False)


def check_writer_schema(table: Table, identifier: str, schema: pa.Schema, written_by: Sequence[str]) -> None:
    """Refuse a writer's schema whose files the table would refuse, as registering leaves the table: with the new
    columns added (_add_missing_columns) when there are any. pyiceberg's union_by_name, applied in memory (its
    evolved_schema: nothing is committed), refuses a type that cannot change."""
    known = set(table.schema().column_names)
    new = [name for name in schema.names if name not in known]
    writers = ", ".join(written_by)
    whose = f", which sink {writers} writes" if len(written_by) == 1 else f", which sinks {writers} write"
    refusal = f"the writer's schema does not fit table {quote(identifier)}{whose if written_by else ''}"
    advice = "Write a table of its own, or a schema that fits this one. Nothing was changed"
    try:
        evolved = evolved_schema(table.update_schema().union_by_name(schema))
    except (ValueError, ValidationError) as error:
        adding = f"it cannot add the columns {quote(', '.join(new))}, or change one: " if new else ""
        raise InvalidArgument(f"{refusal}: {adding}{cause(error).rstrip('.')}. {advice}") from None
    try:
        check_file_schema(evolved if new else table.schema(), schema, format_version=table.format_version)
    except ValueError as error:
        raise InvalidArgument(f"{refusal}: {flat_misfit(str(error), 'the writer')}. {advice}") from None


def flat_misfit(text: str, theirs: str) -> str:
    """pyiceberg's schema mismatch on one line: its table's rows marked ❌ (a table field and `theirs`, the data's),
    or the text itself when it has no table."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 3:
            continue
        if cells[0]:
            rows.append(cells)
        elif rows:  # a cell wrapped onto the next line
            rows[-1] = [" ".join(filter(None, pair)) for pair in zip(rows[-1], cells, strict=True)]
    mismatched = [f"{table} ({theirs}: {data})" for mark, table, data in rows if mark == "❌"]
    return "mismatched fields: " + "; ".join(mismatched) if mismatched else " ".join(text.split())


@functools.lru_cache(maxsize=1024)
def schema_misfit(key: FitKey) -> str | None:
    """Why files of this Arrow schema do not fit the table schema, or None: the writers of a stream write
    files of the same few schemas, so the check runs once per schema, not per file."""
    file_schema = pa.ipc.read_schema(pa.py_buffer(key.file_schema))
    try:
        check_file_schema(key.rules.schema, file_schema, format_version=key.rules.format_version)
    except ValueError as error:
        return flat_misfit(str(error), "the file")
    return None
