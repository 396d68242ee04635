"""The one name policy: which sink names and table identifiers the coordinator and the writer take.

A name that becomes a catalog identifier or a path must not be able to reach into another's: a table name
with a ``/`` is a directory inside the namespace's, where the SQL catalog's warehouse (and another table's
maintenance) would find it. So every name goes through this module, on both sides, before anything is
created: the coordinator refuses a sink or table a writer names (RegisterWriter, EnsureTables, a data file's
table, the admin routes' sink) and the Spark writer checks its own sink and tables before Spark starts and,
in dynamic fan-out, each record's table, which goes to the unrouted records when it is outside the policy
(never to the catalog). It imports the standard library and coordinator_service.contract.errors only
(tests/unit/test_writer_imports.py).

The policy (docs/architecture.md, "Names"):

* **Table identifier**: ``namespace.table``, its parts separated by ``.``; a namespace of several parts
  (``lake.shop.orders``) only on a catalog with nested namespaces (not the SQL, Hive or Glue catalogs).
  Each part is 1 or more of ``a-z``, ``0-9``, ``_`` and ``-``, not starting with ``-``: no path separator,
  no dot inside a part (so no empty part and no ``..``), no space or control character, and lower case,
  because Glue and Hive fold names to lower case (and Spark resolves them case-insensitively): ``Orders`` and
  ``orders`` would be one table there and two elsewhere. The namespace (its parts joined with ``.``) and the
  table name are each at most 255 bytes, the SQL catalog's column and a warehouse directory name.
* **Sink name**: 1 to 200 of ``A-Z``, ``a-z``, ``0-9``, ``_``, ``.`` and ``-``, starting with a letter or
  a digit, the whole name (a trailing line break included) matched.
"""

from __future__ import annotations

import re
from typing import Final

from coordinator_service.contract.errors import InvalidArgument, quote

# Longest namespace (its parts joined with '.') and table name: the SQL catalog keeps each in a VARCHAR(255),
# and a file-system warehouse makes a directory of each, whose name is at most 255 bytes.
MAX_NAME_BYTES: Final = 255
TABLE_NAME_PART: Final = re.compile(r"[a-z0-9_][a-z0-9_\-]*")
_TABLE_NAME_CHARACTER: Final = re.compile(r"[a-z0-9_\-]")
TABLE_NAME_CHARACTERS: Final = "lower-case letters a-z, digits, '_' and '-' (not first)"
SINK_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
_CONTROL_CHARACTER: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def sink_name_problem(name: str) -> str | None:
    """Why `name` cannot name a sink, or None when it can."""
    if SINK_NAME.fullmatch(name):
        return None
    return (
        f"sink name {quote(name)} is invalid: use 1 to 200 letters, digits, '_', '.', '-', "
        "starting with a letter or digit"
    )


def check_sink_name(name: str) -> str:
    """`name`, or InvalidArgument saying why it cannot name a sink."""
    problem = sink_name_problem(name)
    if problem is not None:
        raise InvalidArgument(problem)
    return name


def parse_table_identifier(identifier: str) -> tuple[str, ...]:
    """The parts of an identifier the log already holds, for the catalog (``check_table_identifier`` decides which
    identifiers a writer may name); InvalidArgument when it has no namespace or an empty or space-padded part."""
    parts = tuple(identifier.split("."))
    if len(parts) < 2 or any(not part.strip() or part != part.strip() for part in parts):
        raise InvalidArgument(
            f"table identifier {quote(identifier)} must be 'namespace.table' (namespaces may be dotted), "
            "with no empty or space-padded parts"
        )
    return parts


def table_identifier_problem(identifier: str, *, nested_namespaces: bool = True) -> str | None:
    """Why `identifier` is outside the policy (the module's docstring), or None when it is in; with
    `nested_namespaces` False (the catalog has none), a namespace of several parts is outside too."""
    parts = identifier.split(".")
    if len(parts) < 2 or not all(parts):
        return (
            f"table identifier {quote(identifier)} must be 'namespace.table' (namespaces may be dotted), "
            "with no empty part"
        )
    for part in parts:
        if not TABLE_NAME_PART.fullmatch(part):
            return (
                f"table identifier {quote(identifier)} contains {_outside(part)}: its names are {TABLE_NAME_CHARACTERS}"
            )
    for what, name in (("namespace", ".".join(parts[:-1])), ("table name", parts[-1])):
        if len(name) > MAX_NAME_BYTES:  # ASCII: a character is a byte
            return (
                f"table identifier {quote(identifier)}: the {what} is {len(name)} bytes long; catalogs and "
                f"warehouses store at most {MAX_NAME_BYTES}"
            )
    if len(parts) > 2 and not nested_namespaces:
        return (
            f"table identifier {quote(identifier)} names a nested namespace, which the catalog cannot hold: "
            "use 'namespace.table'"
        )
    return None


def check_table_identifier(identifier: str, *, nested_namespaces: bool = True) -> tuple[str, ...]:
    """The parts of an identifier a writer names, or InvalidArgument saying how it is outside the policy."""
    problem = table_identifier_problem(identifier, nested_namespaces=nested_namespaces)
    if problem is not None:
        raise InvalidArgument(problem)
    return tuple(identifier.split("."))


def _outside(part: str) -> str:
    """How a message names the first thing of `part` outside the policy."""
    if part.startswith("-"):
        return "a name starting with '-'"
    character = next(c for c in part if not _TABLE_NAME_CHARACTER.fullmatch(c))
    if _CONTROL_CHARACTER.fullmatch(character):
        return "a control character (such as NUL or a line break)"
    if character in "/\\":
        return f"the path separator {character!r}"
    if character.isupper():
        return (
            f"the upper-case {character!r} (names are lower case: Glue and Hive fold case, so 'Orders' and "
            "'orders' would be one table there)"
        )
    return f"the character {character!r}"
