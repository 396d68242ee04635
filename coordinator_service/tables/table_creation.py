"""A sink's tables created from a writer's Arrow schema and partitioning, or checked against them and evolved
(new columns); a table pyiceberg would refuse is refused before anything is created."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import structlog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import CreateTableTransaction, StagedTable, Table, TableProperties, Transaction
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

from coordinator_service.contract import partition_syntax
from coordinator_service.contract.errors import InvalidArgument, cause, quote
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.tables.catalog_tables import CatalogTables
from coordinator_service.tables.keyed_tables import check_table_key, keyed_schema, new_keyed_table_properties
from coordinator_service.tables.pyiceberg_internals import iceberg_schema
from coordinator_service.tables.schema_fit import check_writer_schema
from coordinator_service.tables.table_origin import CREATED, ORIGIN

log = structlog.get_logger(__name__)


# Where a new table's metadata is built in memory, to be checked before anything is created.
_CHECK_LOCATION = "memory://sink-coordinator/check"


def parse_partition_field(text: str) -> tuple[str, Transform[Any, Any]]:
    """'region', 'day(ts)', 'truncate(4, name)' -> (source column, transform); the syntax is partition_syntax's."""
    spec = partition_syntax.parse_partition_field(text)
    if spec.transform == "truncate":
        return spec.source, TruncateTransform(int(str(spec.width)))
    transforms: dict[str, Transform[Any, Any]] = {
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
    }
    return spec.source, transforms[spec.transform]


class TableCreation(CatalogTables):
    """A sink's tables created, or checked and evolved for a writer (RegisterWriter, EnsureTables)."""

    def ensure_table(
        self,
        identifier: str,
        schema: pa.Schema | None,
        partition_by: Sequence[str],
        written_by: Sequence[str] = (),
        key: Sequence[str] = (),
    ) -> str:
        """Create the table when missing (given a schema), add new columns when present; return its location. The
        name went through the name policy, or the log records it from before the policy (the protocol's to say).

        A present table's schema must take the writer's files (InvalidArgument, nothing changed, naming the other
        sinks that write it, `written_by`): the same check the pre-commit makes of each file, before Spark writes
        one. Given a `key` (the columns of an upsert or change stream's key), the table is keyed
        (coordinator_service.tables.keyed_tables): created as format v2 with those identifier fields, or refused
        when present with another key."""
        parts = parse_table_identifier(identifier)
        fields = [parse_partition_field(text) for text in partition_by]
        try:
            table = self.catalog.load_table(parts)
        except NoSuchTableError:
            if schema is None:
                raise InvalidArgument(
                    f"table {quote(identifier)} does not exist in catalog {self.catalog_name} and the writer sent no "
                    "schema to create it: create the table, or send arrow_schema"
                ) from None
            table = self._create_table(parts, schema, fields, key)
        else:
            if key:
                check_table_key(table, key)
            if schema is not None:
                check_writer_schema(table, identifier, schema, written_by)
                self._add_missing_columns(table, schema)
        self.forget(identifier)  # the schema may have just changed
        return str(table.location())

    def _create_table(
        self,
        parts: tuple[str, ...],
        arrow_schema: pa.Schema,
        fields: list[tuple[str, Transform[Any, Any]]],
        key: Sequence[str],
    ) -> Table:
        schema = keyed_schema(arrow_schema, key) if key else arrow_schema
        self._check_new_table(parts, schema, fields)
        namespace = parts[:-1]
        try:
            self.catalog.create_namespace(namespace)
        except Exception:
            # Another registration created it first: the SQL catalog says so with its database's unique-key
            # error rather than NamespaceAlreadyExistsError when both checked before either inserted.
            if not self.catalog.namespace_exists(namespace):
                raise
        try:
            properties = {ORIGIN: CREATED, **(new_keyed_table_properties() if key else {})}
            with self.catalog.create_table_transaction(parts, schema=schema, properties=properties) as transaction:
                _describe_new_table(transaction, fields)
            log.info("created iceberg table", table=".".join(parts), partition_by=[str(f) for f in fields])
        except Exception:
            if not self.catalog.table_exists(parts):  # likewise for the table
                raise
        return self.catalog.load_table(parts)

    def _check_new_table(
        self, parts: tuple[str, ...], schema: pa.Schema | Schema, fields: list[tuple[str, Transform[Any, Any]]]
    ) -> None:
        """Build the new table's metadata in memory, as _create_table does, so that a schema or a partitioning
        pyiceberg refuses is refused before the namespace or the table is created."""
        names = schema.names if isinstance(schema, pa.Schema) else schema.column_names
        missing = [source for source, _ in fields if source not in names]
        if missing:
            raise InvalidArgument(
                f"partition columns {quote(', '.join(missing))} are not in arrow_schema, whose columns are "
                f"{quote(', '.join(names))}"
            )
        try:
            metadata = new_table_metadata(
                schema=schema if isinstance(schema, Schema) else iceberg_schema(schema),
                partition_spec=UNPARTITIONED_PARTITION_SPEC,
                sort_order=UNSORTED_SORT_ORDER,
                location=_CHECK_LOCATION,
                properties={},
            )
            staged = StagedTable(parts, metadata, f"{_CHECK_LOCATION}/metadata.json", PyArrowFileIO(), self.catalog)
            _describe_new_table(CreateTableTransaction(staged), fields)
        except ValueError as error:
            raise InvalidArgument(
                f"table {quote('.'.join(parts))} cannot be created from the writer's arrow_schema and "
                f"partition_by: {cause(error)}"
            ) from error

    def _add_missing_columns(self, table: Table, schema: pa.Schema) -> None:
        known = set(table.schema().column_names)
        new = [name for name in schema.names if name not in known]
        if not new:
            return
        try:
            with table.update_schema() as update:
                update.union_by_name(schema)
        except ValueError as error:  # raised before the commit: nothing changed
            raise InvalidArgument(
                f"table {quote('.'.join(table.name()))} cannot add the columns {quote(', '.join(new))}: {cause(error)}"
            ) from error
        log.info("added columns to iceberg table", table=".".join(table.name()), columns=new)


def _describe_new_table(transaction: Transaction, fields: list[tuple[str, Transform[Any, Any]]]) -> None:
    """A new table's partitioning and name mapping, on its creation transaction."""
    if fields:
        with transaction.update_spec() as spec:
            for source, transform in fields:
                spec.add_field(source, transform)
    name_mapping = transaction.table_metadata.schema().name_mapping
    transaction.set_properties({TableProperties.DEFAULT_NAME_MAPPING: name_mapping.model_dump_json()})
