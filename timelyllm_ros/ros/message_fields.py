"""Field dicts <-> rclpy's generated message classes, from the classes' own type information.

The transport port carries plain field dicts (see `timelyllm_ros.ros.convert`); the rclpy
transport turns them into the generated Python classes (`timelyllm.msg.PlanRequest`, ...) and
back.  Every generated class describes itself: `get_fields_and_field_types()` gives the field
names in order and `SLOT_TYPES` the rosidl_parser type of each (BasicType, bounded/unbounded
(w)strings, NamespacedType for nested messages, Array / BoundedSequence / UnboundedSequence).
This module walks that description:

- `to_msg(cls, fields)` builds a *new* message; the input dict (and every list or dict inside
  it) is only read, never changed or stored, so one dict can be sent any number of times.
  Missing fields keep the message's defaults; unknown fields, wrong types, out-of-range
  integers, over-long bounded strings and sequences, strings holding a NUL (a ROS string ends at
  its first NUL: the rest would be dropped silently) raise `MessageError` naming the field path
  (the walk and its checks: `walker`, the same for the rosbags codec).
- `from_msg(msg)` gives the field dict: nested messages as dicts, sequences and arrays as
  lists of Python values, `byte` (octet) as 1-byte `bytes` -- the shapes `convert` and the
  rosbags CDR checks use.

rclpy itself is not imported here: only the generated classes (and rosidl_parser, which they
import themselves) are touched.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any, Mapping

from timelyllm_ros.ros.walker import FLOAT_TYPES, FieldType, message_in

Fields = dict[str, Any]


def message_class(type_name: str) -> Any:
    """'timelyllm/msg/PlanRequest' -> timelyllm.msg.PlanRequest (also 'pkg/action/Name', and
    'pkg/action/Name_Goal' for an action's goal/result/feedback message)."""
    parts = type_name.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"type name must be pkg/kind/Name, got {type_name!r}")
    pkg, kind, name = parts
    module = importlib.import_module(f"{pkg}.{kind}")
    if kind == "action" and "_" in name and not hasattr(module, name):
        action, part = name.rsplit("_", 1)
        return getattr(getattr(module, action), part)
    return getattr(module, name)


def _namespaced_class(t: Any) -> Any:
    """rosidl_parser NamespacedType(['pkg', 'msg'], 'Name') -> the generated class."""
    return _class_of(tuple(t.namespaces), t.name)


@lru_cache(maxsize=None)
def _class_of(namespaces: tuple[str, ...], name: str) -> Any:
    return getattr(importlib.import_module(".".join(namespaces)), name)


@lru_cache(maxsize=None)
def _layout(cls: Any) -> tuple[tuple[str, Any], ...]:
    """((field name, rosidl_parser type), ...) of a generated message class, in field order."""
    names = list(cls.get_fields_and_field_types())
    slot_types = cls.SLOT_TYPES
    if len(names) != len(slot_types):  # pragma: no cover - a generator change
        raise TypeError(f"{cls.__name__}: {len(names)} fields but {len(slot_types)} slot types")
    return tuple(zip(names, slot_types))


def _kind(t: Any) -> str:
    return type(t).__name__  # rosidl_parser.definition class names


# ----------------------------------------------------------------------------- dict -> message


_STRINGS = ("UnboundedString", "BoundedString", "UnboundedWString", "BoundedWString")
_SEQUENCES = {"Array": "array", "BoundedSequence": "sequence", "UnboundedSequence": "sequence"}


def _field_type(t: Any) -> FieldType:
    """A rosidl_parser type as the walk's FieldType."""
    kind = _kind(t)
    if kind == "NamespacedType":
        return FieldType("message", _namespaced_class(t))
    if kind in _STRINGS:
        return FieldType("string", bound=getattr(t, "maximum_size", None))
    if kind == "BasicType":
        return FieldType("basic", t.typename)
    if kind in _SEQUENCES:
        bound = t.size if kind == "Array" else (t.maximum_size if kind == "BoundedSequence" else None)
        return FieldType(_SEQUENCES[kind], bound=bound, elem=_field_type(t.value_type))
    return FieldType("unsupported", kind)


class _Rclpy:
    """The walk's Codec over rclpy's generated classes (key: the class)."""

    @staticmethod
    @lru_cache(maxsize=None)
    def fields(cls: Any) -> tuple[tuple[str, FieldType], ...]:
        return tuple((name, _field_type(t)) for name, t in _layout(cls))

    @staticmethod
    def label(cls: Any) -> str:
        return cls.__name__

    @staticmethod
    def build(cls: Any, values: dict[str, Any]) -> Any:
        msg = cls()
        for name, v in values.items():
            setattr(msg, name, v)
        return msg

    @staticmethod
    def basic(t: FieldType, v: Any) -> Any:
        return v

    @staticmethod
    def sequence(t: FieldType, items: list) -> list:
        return items


def to_msg(cls: Any, fields: Mapping[str, Any], path: str = "") -> Any:
    """A new `cls` message from a field dict (see the module docstring)."""
    return message_in(_Rclpy, cls, fields, path)


# ----------------------------------------------------------------------------- message -> dict


def from_msg(msg: Any) -> Fields:
    """Generated message -> field dict (nested dicts, lists, Python scalars)."""
    return {name: _value_out(t, getattr(msg, name)) for name, t in _layout(type(msg))}


def _value_out(t: Any, v: Any) -> Any:
    kind = _kind(t)
    if kind == "NamespacedType":
        return from_msg(v)
    if kind in ("Array", "BoundedSequence", "UnboundedSequence"):
        # numeric sequences are array.array / numpy arrays in rclpy; their items become Python scalars
        return [_value_out(t.value_type, x) for x in v]
    if kind == "BasicType":
        if hasattr(v, "item"):  # numpy scalar (fixed-size numeric arrays)
            return v.item()
        if t.typename in FLOAT_TYPES:
            return float(v)
    return v
