"""The shapes of what the coordinator answers: each declared once, here, and used on every surface.

The protocol returns them, the gRPC server sends them and the client returns them again
(coordinator_service.contract.wire converts), and the admin API's responses subclass them (admin.schemas). So a field's
name is its field's name in proto/sink_coordinator.proto's message, and an enum member's name its value's name in the
proto enum. An optional field is None, never its proto type's zero value (0, ""), which carries the None on the wire. An
epoch's fields are also its row's columns, by name (from_attributes reads them). It imports only the standard library:
the Spark writer uses it through the client, without the server's stack.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

View = TypeVar("View", bound="DataclassInstance")


class EpochStatus(StrEnum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class PreCommitOutcome(StrEnum):
    # The epoch is durable in the log; it will be committed after its checkpoint.
    PERSISTED = "PERSISTED"
    # The epoch is already in the table; the writer must delete the files it wrote.
    ALREADY_COMMITTED = "ALREADY_COMMITTED"


@dataclass(frozen=True)
class Registration:
    writer_term: int
    committed_epoch: int
    checkpointed_epoch: int
    aborted_epochs: tuple[int, ...]
    recommitting_epochs: tuple[int, ...]
    table_location: str
    # Whether the catalog holds nested namespaces (lake.shop.orders); an older coordinator does not say: False.
    nested_namespaces: bool = False
    # The sink's key (an upsert or change stream), as recorded; () for an append stream, and from an older
    # coordinator, which knows no keys.
    key_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreCommitResult:
    outcome: PreCommitOutcome
    attempt: int
    record_count: int


@dataclass(frozen=True)
class CheckpointResult:
    committed_epoch: int
    checkpointed_epoch: int


@dataclass(frozen=True)
class EpochView:
    epoch: int
    status: EpochStatus
    attempt: int
    file_count: int
    record_count: int
    snapshot_id: int | None
    reason: str | None
    files_cleaned: bool


@dataclass(frozen=True)
class SinkTable:
    """One of a sink's tables: the newest epoch whose files of this table it holds (every epoch below included)."""

    table: str
    committed_epoch: int


@dataclass(frozen=True)
class SinkView:
    sink: str
    table: str
    catalog: str
    checkpointed_epoch: int
    # The least of its tables' committed epochs.
    committed_epoch: int
    writer_term: int
    writer_count: int
    # Every table of the sink (fan-out): its own first, then the others by name.
    tables: tuple[SinkTable, ...]


@dataclass(frozen=True)
class SinkState(SinkView):
    """A sink and its epochs that are not COMMITTED, in epoch order (GetSinkState)."""

    epochs: tuple[EpochView, ...]
    # The sink's key, as recorded; () for an append stream, and from an older coordinator.
    key_columns: tuple[str, ...] = ()
    # What its snapshots' markers carry (contract.markers.SinkIdentity); None from an older coordinator.
    incarnation: str | None = None
    generation: int = 0


@dataclass(frozen=True)
class TableLocation:
    table: str
    location: str
    # The key the table was ensured with; () for an append stream, and from an older coordinator.
    key_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class TablesEnsured:
    """EnsureTables' answer: each requested table's location, in the request's order."""

    tables: tuple[TableLocation, ...]


def from_attributes(view_type: type[View], source: object, **given: Any) -> View:
    """A view_type whose fields are those given, and each other one the attribute of the same name of source."""
    read = {
        field.name: getattr(source, field.name) for field in dataclasses.fields(view_type) if field.name not in given
    }
    return view_type(**read, **given)
