"""The tables of one pyiceberg catalog, loaded through a cache of their metadata."""

from __future__ import annotations

import math
import time

import structlog
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.contract.table_identifiers import parse_table_identifier
from coordinator_service.tables.data_file_entries import FileRules, RulesKey
from coordinator_service.tables.precommit_files import FileChecks

log = structlog.get_logger(__name__)


class CatalogTables:
    """The tables of one pyiceberg catalog, each loaded through a cache of its metadata: what the gateway's parts
    share.

    Table metadata is cached per table for `cache_seconds` (0: no cache), and replaced by the
    result of every commit this process makes. Users of a cached table must tolerate staleness:
    the pre-commit validates again on a fresh table before it refuses a file, and the committer's
    append asserts the branch head it walked, so a stale base fails the commit instead of
    appending twice (see docs/architecture.md, "The table-metadata cache").
    """

    def __init__(self, catalog: Catalog, cache_seconds: float = 0.0, orphan_grace_seconds: float = math.inf) -> None:
        self.catalog = catalog
        self.cache_seconds = cache_seconds
        self.file_checks = FileChecks(orphan_grace_seconds)
        self._cache: dict[str, tuple[float, Table]] = {}
        self._file_rules: dict[RulesKey, FileRules] = {}

    def cached(self, identifier: str) -> tuple[Table, bool]:
        """The table from the cache if it is young enough, else freshly loaded; and whether it came from the cache."""
        entry = self._cache.get(identifier)
        if entry is not None and time.monotonic() - entry[0] < self.cache_seconds:
            return entry[1], True
        return self.load(identifier), False

    def remember(self, identifier: str, table: Table) -> None:
        if self.cache_seconds > 0:
            self._cache[identifier] = (time.monotonic(), table)

    def forget(self, identifier: str) -> None:
        self._cache.pop(identifier, None)

    def last_known(self, identifier: str) -> Table | None:
        """The table as this process last loaded or committed it, however old; no catalog call."""
        entry = self._cache.get(identifier)
        return None if entry is None else entry[1]

    @property
    def catalog_name(self) -> str:
        return str(self.catalog.name)

    @property
    def nested_namespaces(self) -> bool:
        """Whether the catalog holds nested namespaces (lake.shop.orders): the SQL, Hive and Glue catalogs do not."""
        return not isinstance(self.catalog, MetastoreCatalog)

    def load(self, identifier: str) -> Table:
        """The table as the catalog has it now (and remembered in the cache)."""
        try:
            table = self.catalog.load_table(parse_table_identifier(identifier))
        except NoSuchTableError as error:
            self.forget(identifier)
            raise InvalidArgument(
                f"table {identifier} does not exist in catalog {self.catalog_name}: create it, or register "
                "the writer with the table's schema so that the coordinator creates it"
            ) from error
        self.remember(identifier, table)
        return table
