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
  (each value checked by `walker`, as the rosbags codec checks it).
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

from timelyllm_ros.ros.walker import FLOAT_TYPES, MessageError, basic_in, sequence_in, string_in

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


def to_msg(cls: Any, fields: Mapping[str, Any], path: str = "") -> Any:
    """A new `cls` message from a field dict (see the module docstring)."""
    if not isinstance(fields, Mapping):
        what = f"field {path!r}" if path else cls.__name__
        raise MessageError(f"{what} must be a mapping of fields, got {type(fields).__name__}")
    layout = _layout(cls)
    known = {n for n, _ in layout}
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise MessageError(f"{path or cls.__name__}: {cls.__name__} has no field(s) {sorted(map(str, unknown))}")
    msg = cls()
    for name, t in layout:
        if name in fields:
            setattr(msg, name, _value_in(t, fields[name], f"{path}.{name}" if path else name))
    return msg


def _value_in(t: Any, v: Any, path: str) -> Any:
    kind = _kind(t)
    if kind == "NamespacedType":
        return to_msg(_namespaced_class(t), v, path)
    if kind in ("UnboundedString", "BoundedString", "UnboundedWString", "BoundedWString"):
        return string_in(v, path, getattr(t, "maximum_size", None))
    if kind == "BasicType":
        return basic_in(t.typename, v, path)
    if kind in ("Array", "BoundedSequence", "UnboundedSequence"):
        items = sequence_in(v, path, size=t.size if kind == "Array" else None,
                            bound=t.maximum_size if kind == "BoundedSequence" else None)
        return [_value_in(t.value_type, x, f"{path}[{i}]") for i, x in enumerate(items)]
    raise MessageError(f"field {path!r}: unsupported interface type {kind}")  # pragma: no cover


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
