"""The views (coordinator_service.contract.views) on every surface: each field of each view, whatever its type, crosses
the gRPC wire (coordinator_service.contract.wire) and reaches the admin API's responses.

The samples are built from the views' own type hints, so a field added to a view is covered here without a new
test: it fails until the field has its field in the proto message (and, for an epoch, its column).
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import pytest
from google.protobuf.message import Message
from pydantic import TypeAdapter

from coordinator_service.admin.schemas import EpochResponse, SinkResponse
from coordinator_service.contract.client import PreCommitFile, _sent_files
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.contract.views import (
    CheckpointResult,
    EpochStatus,
    EpochView,
    PreCommitOutcome,
    PreCommitResult,
    Registration,
    SinkState,
    SinkTable,
    SinkView,
    TableLocation,
    TablesEnsured,
    from_attributes,
)
from coordinator_service.contract.wire import from_message, to_message
from coordinator_service.log.models import AbortCause, EpochRecord

# Every view the gRPC server sends, with its message.
ANSWERS: list[tuple[type[Any], type[Message]]] = [
    (Registration, pb.RegisterWriterResponse),
    (PreCommitResult, pb.PreCommitResponse),
    (CheckpointResult, pb.CommitCheckpointResponse),
    (EpochView, pb.EpochState),
    (SinkState, pb.GetSinkStateResponse),
    (SinkTable, pb.SinkTable),
    (TableLocation, pb.TableLocation),
    (TablesEnsured, pb.EnsureTablesResponse),
]


def sample(view_type: type[Any], *, absent: bool = False, numbers: itertools.count[int] | None = None) -> Any:
    """A view_type with no field at its zero value (a distinct number for each number), or with every optional
    field None when absent."""
    numbers = numbers if numbers is not None else itertools.count(1)
    hints = typing.get_type_hints(view_type)
    return view_type(
        **{
            field.name: _value(field.name, hints[field.name], absent, numbers)
            for field in dataclasses.fields(view_type)
        }
    )


def _value(name: str, hint: Any, absent: bool, numbers: itertools.count[int]) -> Any:
    if typing.get_origin(hint) is types.UnionType:
        if absent:
            return None
        (hint,) = (arm for arm in typing.get_args(hint) if arm is not types.NoneType)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_value(name, item, absent, numbers) for _ in range(2))
    if dataclasses.is_dataclass(hint):
        return sample(typing.cast(type[Any], hint), absent=absent, numbers=numbers)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return list(hint)[-1]
    if hint is bool:
        return True
    if hint is int:
        return next(numbers)
    if hint is str:
        return f"{name}-{next(numbers)}"
    raise AssertionError(f"no sample of {hint} ({name}): teach sample() the new type, and wire.py if it needs it")


def over_the_wire(view: Any, message_type: type[Message]) -> Message:
    """The view's message, serialized and parsed as the other side would."""
    return message_type.FromString(to_message(view, message_type).SerializeToString())


@pytest.mark.parametrize(("view_type", "message_type"), ANSWERS, ids=lambda pair: getattr(pair, "__name__", ""))
def test_a_view_and_its_message_have_the_same_fields(view_type: type[Any], message_type: type[Message]) -> None:
    assert {field.name for field in dataclasses.fields(view_type)} == set(message_type.DESCRIPTOR.fields_by_name)


@pytest.mark.parametrize(("view_type", "message_type"), ANSWERS, ids=lambda pair: getattr(pair, "__name__", ""))
def test_every_field_crosses_the_wire_and_back(view_type: type[Any], message_type: type[Message]) -> None:
    view = sample(view_type)
    message = over_the_wire(view, message_type)
    # Every field was sent with a value (none at its default, which the wire would not carry).
    assert {descriptor.name for descriptor, _ in message.ListFields()} == set(message_type.DESCRIPTOR.fields_by_name)
    assert from_message(message, view_type) == view


def test_an_optional_field_is_absent_on_the_wire_when_none() -> None:
    view = sample(EpochView, absent=True)
    assert (view.snapshot_id, view.reason) == (None, None)
    message = over_the_wire(view, pb.EpochState)
    assert (message.snapshot_id, message.reason) == (0, "")
    assert from_message(message, EpochView) == view
    state = over_the_wire(dataclasses.replace(sample(SinkState), epochs=(view,)), pb.GetSinkStateResponse)
    assert from_message(state, SinkState).epochs == (view,)


def test_an_empty_tuple_is_an_empty_repeated_field() -> None:
    view = dataclasses.replace(sample(Registration), aborted_epochs=(), recommitting_epochs=())
    assert from_message(over_the_wire(view, pb.RegisterWriterResponse), Registration) == view
    state = dataclasses.replace(sample(SinkState), epochs=())
    assert from_message(over_the_wire(state, pb.GetSinkStateResponse), SinkState) == state


@pytest.mark.parametrize("status", list(EpochStatus))
def test_every_epoch_status_crosses_the_wire_as_the_proto_value_of_its_name(status: EpochStatus) -> None:
    view = dataclasses.replace(sample(EpochView), status=status)
    message = over_the_wire(view, pb.EpochState)
    assert pb.EpochStatus.Name(message.status) == status.name
    assert from_message(message, EpochView).status is status


@pytest.mark.parametrize("outcome", list(PreCommitOutcome))
def test_every_precommit_outcome_crosses_the_wire_as_the_proto_value_of_its_name(outcome: PreCommitOutcome) -> None:
    view = PreCommitResult(outcome, attempt=1, record_count=0)
    message = over_the_wire(view, pb.PreCommitResponse)
    assert pb.PreCommitResponse.Outcome.Name(message.outcome) == outcome.name
    assert from_message(message, PreCommitResult) == view


def test_the_enums_name_the_proto_values() -> None:
    assert {status.name for status in EpochStatus} == set(pb.EpochStatus.keys()) - {"EPOCH_STATUS_UNSPECIFIED"}
    assert {outcome.name for outcome in PreCommitOutcome} == set(pb.PreCommitResponse.Outcome.keys()) - {
        "OUTCOME_UNSPECIFIED"
    }


def test_a_field_the_message_lacks_is_refused_not_dropped() -> None:
    @dataclasses.dataclass(frozen=True)
    class Wider(EpochView):
        files_archived: bool

    wider = Wider(**dataclasses.asdict(sample(EpochView)), files_archived=True)
    with pytest.raises(TypeError, match=r"only in the view \['files_archived'\]"):
        to_message(wider, pb.EpochState)
    with pytest.raises(TypeError, match=r"only in the view \['files_archived'\]"):
        from_message(pb.EpochState(), Wider)


def test_a_field_the_view_lacks_is_refused_not_dropped() -> None:
    hints = typing.get_type_hints(EpochView)
    narrower = dataclasses.make_dataclass(
        "Narrower", [(name, hint) for name, hint in hints.items() if name != "files_cleaned"], frozen=True
    )
    with pytest.raises(TypeError, match=r"only in the message \['files_cleaned'\]"):
        from_message(pb.EpochState(), narrower)


def test_an_epoch_response_carries_every_field_of_the_epoch_view_from_its_row() -> None:
    """The admin API's epoch is built from the row by field name: every field of the view is a column."""
    view = sample(EpochView)
    now = datetime(2025, 3, 1, tzinfo=UTC)
    row = EpochRecord(
        **dataclasses.asdict(view), abort_cause=AbortCause.OPERATOR, aborted_at=now, created_at=now, updated_at=now
    )
    response = EpochResponse.of(row)
    assert from_attributes(EpochView, response) == view
    shown = TypeAdapter(EpochResponse).dump_python(response, mode="json")
    assert {field.name for field in dataclasses.fields(EpochView)} <= set(shown)


def test_the_admin_api_shows_every_field_of_the_views() -> None:
    for response, view in ((EpochResponse, EpochView), (SinkResponse, SinkView)):
        properties = TypeAdapter(response).json_schema()["properties"]
        assert {field.name for field in dataclasses.fields(view)} <= set(properties), response


def test_a_precommit_file_names_its_table_and_a_bare_path_the_sinks_own() -> None:
    [[routed, own]] = _sent_files([PreCommitFile("file:///w/a.parquet", table="db.eu"), "file:///w/b.parquet"])
    assert (routed.path, routed.table) == ("file:///w/a.parquet", "db.eu")
    assert (own.path, own.table) == ("file:///w/b.parquet", "")
