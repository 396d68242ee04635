"""The names of a keyed sink's key (an upsert or change stream's): the rule both sides apply before anything is looked
up, the writer to its flags and the coordinator to every request (which columns exist is for the schema and the table
to say). It imports the standard library only: the Spark writer uses it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# Most columns a key may have.
MAX_KEY_COLUMNS: Final = 32


def key_columns_problem(keys: Sequence[str]) -> str | None:
    """Why no table could have `keys` as its key (too many columns, an empty name, a NUL, a column named twice), or
    None."""
    if len(keys) > MAX_KEY_COLUMNS:
        return f"a key of {len(keys)} columns exceeds {MAX_KEY_COLUMNS}"
    for key in keys:
        if not key.strip() or "\x00" in key:
            return f"key column name {key[:200]!r} is empty or holds a NUL character"
    if len(set(keys)) != len(keys):
        return f"the key {', '.join(keys)[:200]!r} names a column twice"
    return None
