"""Keyed tables: the tables of upsert and change streams, whose rows each have a key (Iceberg's identifier fields).

A keyed table is created as format v2 (position delete files) with `identifier-field-ids` set to its key columns,
which are required: a key is never null, and Iceberg allows no other identifier field. A present table is taken as
keyed only when its identifier fields are the key the writer names, in that order.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pydantic
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.contract.key_columns import key_columns_problem
from coordinator_service.tables.key_resolution import key_columns
from coordinator_service.tables.pyiceberg_internals import iceberg_schema

# The table property that sets a new table's format version (Iceberg's name).
FORMAT_VERSION = "format-version"
# Position delete files are a format v2 feature; v3 tables take deletion vectors instead (not built).
KEYED_FORMAT_VERSION = 2


def check_key_request(keys: Sequence[str]) -> None:
    """Refuse (InvalidArgument) a key a writer names that no table could have (contract.key_columns' rule), before
    anything is looked up."""
    problem = key_columns_problem(keys)
    if problem is not None:
        raise InvalidArgument(problem)


def keyed_schema(arrow_schema: pa.Schema, keys: Sequence[str]) -> Schema:
    """The Iceberg schema of a new table of the writer's `arrow_schema` whose key is `keys`: its identifier fields.

    Raises InvalidArgument when a key column is missing, named twice, may hold nulls in `arrow_schema` (the files
    would not fit a required column: declare it not nullable), or is of a type Iceberg refuses as a key (not a
    primitive, a float or a double)."""
    names = list(arrow_schema.names)
    missing = [key for key in keys if key not in names]
    if missing:
        raise InvalidArgument(
            f"key columns {quote(', '.join(missing))} are not in arrow_schema, whose columns are "
            f"{quote(', '.join(names))}"
        )
    if len(set(keys)) != len(keys):
        raise InvalidArgument(f"the key {quote(', '.join(keys))} names a column twice")
    nullable = [key for key in keys if arrow_schema.field(key).nullable]
    if nullable:
        raise InvalidArgument(
            f"key columns {quote(', '.join(nullable))} may hold nulls in arrow_schema: a key column is required, "
            "declare it not nullable (and write no null in it)"
        )
    schema = iceberg_schema(arrow_schema)
    for key in keys:
        try:
            Schema(*schema.fields, identifier_field_ids=[schema.find_field(key).field_id])
        except pydantic.ValidationError as error:
            reasons = "; ".join(str(problem["msg"]).split(" invalid: ")[-1] for problem in error.errors())
            raise InvalidArgument(f"the key column {quote(key)} cannot be a table's key: {reasons}") from error
        except ValueError as error:
            raise InvalidArgument(f"the key column {quote(key)} cannot be a table's key: {cause(error)}") from error
    identifiers = [schema.find_field(key).field_id for key in keys]
    return Schema(*schema.fields, schema_id=schema.schema_id, identifier_field_ids=identifiers)


def new_keyed_table_properties() -> dict[str, str]:
    """The properties a keyed table is created with, besides the coordinator's own."""
    return {FORMAT_VERSION: str(KEYED_FORMAT_VERSION)}


def check_table_key(table: Table, keys: Sequence[str]) -> None:
    """Refuse (InvalidArgument) a present table as the keyed table of `keys` unless it is format v2 and its
    identifier fields are exactly those columns, in that order."""
    name = ".".join(table.name())
    if table.format_version != KEYED_FORMAT_VERSION:
        raise InvalidArgument(
            f"table {quote(name)} is format v{table.format_version}: an upsert or change stream needs format "
            f"v{KEYED_FORMAT_VERSION} (position deletes); write a table of its own"
        )
    try:
        present = key_columns(table.schema())
    except ValueError:
        present = ()
    if list(present) != list(keys):
        has = f"its key is {quote(', '.join(present))}" if present else "it has no key (identifier fields)"
        raise InvalidArgument(
            f"table {quote(name)} cannot take rows keyed by {quote(', '.join(keys))}: {has}. Write a table of its "
            "own, or name its key"
        )
