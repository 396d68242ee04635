"""The table format as the engine sees it (RisingWave's sink coordinator keeps its format behind a trait the same way):
TableFormat is what the commit protocol, the operators' actions and the maintenance need of a table format, and
coordinator_service.tables.iceberg.IcebergGateway is its one implementation. The engine holds a table only as a
LoadedTable, a handle it passes back to this layer (it never reads its metadata, its storage or its catalog itself),
and gets neutral answers: described files, markers, snapshot ids, a TableIdentity.

The maintenance steps' work on a table (retention, expiry, compaction, the orphan sweep's listing) is this layer's
too, in coordinator_service.tables.table_maintenance, over the same handles."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import pyarrow as pa
from pyiceberg.table import Table

from coordinator_service.contract.markers import Marker, SinkIdentity
from coordinator_service.log.precommit_metadata import DataFileEntry
from coordinator_service.tables.precommit_files import FileFacts

if TYPE_CHECKING:
    from coordinator_service.tables.file_descriptions import DescribedFiles
    from coordinator_service.tables.key_files import DescribedKeyFiles

# A table as this layer loaded it: opaque to the engine, which hands it back (a cached table's ancestry walked, then
# appended on; a table as it was before a drop, to prove a deletion against).
LoadedTable: TypeAlias = Table


@dataclass(frozen=True)
class TableIdentity:
    """Which table this is, whatever its name: the UUID its format gave it at creation, and where it keeps its files."""

    uuid: uuid.UUID
    location: str


class TableFormat(Protocol):
    """What the engine needs of the tables a sink writes."""

    @property
    def catalog_name(self) -> str: ...

    @property
    def nested_namespaces(self) -> bool:
        """Whether the catalog holds nested namespaces (lake.shop.orders)."""

    def load(self, identifier: str) -> LoadedTable:
        """The table as the catalog has it now (InvalidArgument when it does not exist)."""

    def cached(self, identifier: str) -> tuple[LoadedTable, bool]:
        """The table as recently loaded or committed here, else loaded now; and whether it came from the cache."""

    def remember(self, identifier: str, table: LoadedTable) -> None: ...

    def forget(self, identifier: str) -> None: ...

    def last_known(self, identifier: str) -> LoadedTable | None:
        """The table as this process last loaded or committed it, however old; no catalog call."""

    def exists(self, identifier: str) -> bool: ...

    def drop(self, identifier: str) -> None:
        """Drop the catalog's entry of the table (its files stay: deleting them is file_deletion's)."""

    def require_takeable(self, identifier: str) -> None:
        """Refuse (FailedPrecondition) an existing table the coordinator did not create and no operator adopted."""

    def identity(self, table: LoadedTable) -> TableIdentity: ...

    def snapshot_count(self, table: LoadedTable) -> int: ...

    def ensure_table(
        self,
        identifier: str,
        schema: pa.Schema | None,
        partition_by: Sequence[str],
        written_by: Sequence[str] = (),
        key: Sequence[str] = (),
    ) -> str:
        """Create the table, or check (and evolve) it for a writer; its location."""

    def read_data_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        evolve_schema: bool,
        facts: Mapping[str, FileFacts] = ...,
        directory: str = "",
    ) -> DescribedFiles:
        """Describe a pre-commit's data files against their table (InvalidArgument naming the first bad file)."""

    def read_key_files(
        self,
        identifier: str,
        uris: Sequence[str],
        writer_id: int,
        facts: Mapping[str, FileFacts],
        directory: str = "",
    ) -> DescribedKeyFiles:
        """Describe a keyed pre-commit's key files against their table's key."""

    def sink_markers(
        self, identifier: str, sink: SinkIdentity, down_to_epoch: int, table: LoadedTable | None = None
    ) -> list[Marker]:
        """The sink's own markers on the table's current branch, oldest first, back to `down_to_epoch`."""

    def append(
        self,
        identifier: str,
        sink: SinkIdentity,
        epoch: int,
        commit_id: str,
        entries: Sequence[DataFileEntry],
        table: LoadedTable | None = None,
        properties: Mapping[str, str] = ...,
        summary: Mapping[str, str] = ...,
    ) -> int:
        """Commit the entries as one change carrying the sink's marker of `epoch` (an append; a keyed table's row
        delta goes through tables.row_deltas); the snapshot id."""

    def fence(self, identifier: str, sink: SinkIdentity, reason: str) -> int:
        """Commit a change of no row that fails any commit built before it; its snapshot id."""
