"""The views (coordinator_service.contract.views) as gRPC messages and back, every field by its name.

A view and its message have the same fields, by name: a field one of them lacks is an error, never left behind.
Where their forms differ:
  - an enum member travels as the proto enum's value of the same name;
  - None travels as the field's absence: unset where the proto field has presence, else its zero value (0, "");
  - a tuple travels as a repeated field, of scalars or of messages (views within the view).
It imports only protobuf, a base dependency: the Spark writer's client uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from coordinator_service.contract.views import View

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MessageType = TypeVar("MessageType", bound=Message)


def to_message(view: DataclassInstance, message_type: type[MessageType]) -> MessageType:
    message = message_type()
    _fill(message, view)
    return message


def from_message(message: Message, view_type: type[View]) -> View:
    values = {
        name: _value_of(message, descriptor, hint) for name, hint, descriptor in _pairing(view_type, message.DESCRIPTOR)
    }
    return view_type(**values)


def _fill(message: Message, view: DataclassInstance) -> None:
    for name, _, descriptor in _pairing(type(view), message.DESCRIPTOR):
        value = getattr(view, name)
        if value is None:
            continue
        if descriptor.message_type is not None and descriptor.is_repeated:
            for item in value:
                _fill(getattr(message, name).add(), item)
        elif descriptor.message_type is not None:
            _fill(getattr(message, name), value)
        elif descriptor.is_repeated:
            getattr(message, name).extend(_scalar(descriptor, item) for item in value)
        else:
            setattr(message, name, _scalar(descriptor, value))


def _scalar(descriptor: FieldDescriptor, value: Any) -> Any:
    if descriptor.enum_type is not None:
        return descriptor.enum_type.values_by_name[value.name].number
    return value


def _value_of(message: Message, descriptor: FieldDescriptor, hint: Any) -> Any:
    raw = getattr(message, descriptor.name)
    present = _present_type(hint)
    if present is not None:
        absent = not message.HasField(descriptor.name) if descriptor.has_presence else raw == descriptor.default_value
        return None if absent else _item_of(descriptor, raw, present)
    if descriptor.is_repeated:
        item_type, _ = typing.get_args(hint)  # tuple[X, ...]
        return tuple(_item_of(descriptor, item, item_type) for item in raw)
    return _item_of(descriptor, raw, hint)


def _item_of(descriptor: FieldDescriptor, raw: Any, hint: Any) -> Any:
    if descriptor.message_type is not None:
        return from_message(raw, hint)
    if descriptor.enum_type is not None:
        enum: type[Enum] = hint
        return enum[descriptor.enum_type.values_by_number[raw].name]
    return raw


def _present_type(hint: Any) -> Any:
    """X of an `X | None` hint; None for a hint that is not optional."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (present,) = (arm for arm in typing.get_args(hint) if arm is not types.NoneType)
        return present
    return None


@functools.cache
def _pairing(view_type: type[DataclassInstance], message: Descriptor) -> tuple[tuple[str, Any, FieldDescriptor], ...]:
    """Each field of the view with its type and its message's field; checked once per pair (annotations are
    strings, resolved here)."""
    fields: Mapping[str, FieldDescriptor] = message.fields_by_name
    names = [field.name for field in dataclasses.fields(view_type)]
    if set(names) != set(fields):
        raise TypeError(
            f"{view_type.__name__} and {message.full_name} differ: only in the view "
            f"{sorted(set(names) - set(fields))}, only in the message {sorted(set(fields) - set(names))}"
        )
    hints = typing.get_type_hints(view_type)
    return tuple((name, hints[name], fields[name]) for name in names)
