"""Iceberg table identifiers: the rules of what a catalog and a warehouse can store.

The coordinator refuses a table a writer names (RegisterWriter, EnsureTables, a data file's table) by these
rules before anything is created, and the Spark writer checks its routes (and, in dynamic fan-out, each
record's table) by the same ones, so a name the writer routes to is never one the coordinator then refuses.
It imports the standard library and coordinator_service.errors only (tests/unit/test_writer_imports.py).
"""

from __future__ import annotations

import re
from typing import Final

from coordinator_service.errors import InvalidArgument, quote

# Longest namespace (its parts joined with '.') and table name: the SQL catalog keeps each in a VARCHAR(255),
# and a file-system warehouse makes a directory of each, whose name is at most 255 bytes.
MAX_NAME_BYTES: Final = 255
_CONTROL_CHARACTER: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def parse_table_identifier(identifier: str) -> tuple[str, ...]:
    parts = tuple(identifier.split("."))
    if len(parts) < 2 or any(not part.strip() or part != part.strip() for part in parts):
        raise InvalidArgument(
            f"table identifier {quote(identifier)} must be 'namespace.table' (namespaces may be dotted), "
            "with no empty or space-padded parts"
        )
    return parts


def check_table_identifier(identifier: str) -> tuple[str, ...]:
    """Parse a table identifier a writer sent, refusing what a catalog or a warehouse cannot store."""
    parts = parse_table_identifier(identifier)
    if _CONTROL_CHARACTER.search(identifier):
        raise InvalidArgument(
            f"table identifier {quote(identifier)} contains a control character (such as NUL or a line break)"
        )
    for what, name in (("namespace", ".".join(parts[:-1])), ("table name", parts[-1])):
        size = len(name.encode())
        if size > MAX_NAME_BYTES:
            raise InvalidArgument(
                f"table identifier {quote(identifier)}: the {what} is {size} bytes long (UTF-8); catalogs and "
                f"warehouses store at most {MAX_NAME_BYTES}"
            )
    return parts
