"""Field dicts <-> rosbags message objects, and CDR (what DDS puts on the wire) via rosbags.

rosbags is pure Python: with it the wire format of every interface is checked without ROS
installed (the in-process transport's wire check, bags of a demo run, the tests).  rosbags' own
field definitions of each type, described as `walker.FieldType`s, are walked by `walker` (the
same walk and checks as the rclpy codec, `message_fields`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from timelyllm_ros.ros.interfaces import interface_types
from timelyllm_ros.ros.walker import FieldType, message_in


@lru_cache(maxsize=1)
def typestore():
    """A rosbags typestore for ROS 2 Jazzy (builtin_interfaces, diagnostic_msgs, ...) plus ours."""
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_JAZZY)
    ts.register(interface_types())
    return ts


_NUMPY_DTYPES = {
    "bool": "bool", "byte": "uint8", "char": "uint8", "uint8": "uint8", "int8": "int8",
    "uint16": "uint16", "int16": "int16", "uint32": "uint32", "int32": "int32",
    "uint64": "uint64", "int64": "int64", "float32": "float32", "float64": "float64",
}

# rosbags' (.msg) primitive names -> the IDL names the walk checks under (rosbags keeps a `char`
# as its 0..255 code), and back to numpy's dtypes for numeric arrays
_IDL = {"bool": "boolean", "byte": "octet", "char": "uint8", "float32": "float", "float64": "double"}
_IDL_DTYPES = {_IDL.get(k, k): v for k, v in _NUMPY_DTYPES.items() if k != "char"}


def _field_type(node: tuple) -> FieldType:
    """A rosbags field definition node as the walk's FieldType."""
    kind, detail = int(node[0]), node[1]
    if kind == 1:  # BASE: (type name, string bound; 0 = unbounded)
        typ, bound = detail[0], detail[1]
        if typ in ("string", "wstring"):
            return FieldType("string", bound=bound or None)
        return FieldType("basic", _IDL.get(typ, typ))
    if kind == 2:  # NAME (nested message)
        return FieldType("message", detail)
    elem, size = detail  # ARRAY (3): exactly size items / SEQUENCE (4): at most size (0 = unbounded)
    return FieldType("array" if kind == 3 else "sequence", bound=size if kind == 3 else (size or None),
                     elem=_field_type(elem))


class _Rosbags:
    """The walk's Codec over a rosbags typestore (key: the type name)."""

    def __init__(self, ts) -> None:
        self.ts = ts

    def fields(self, typename: str) -> tuple[tuple[str, FieldType], ...]:
        return tuple((name, _field_type(node)) for name, node in self.ts.fielddefs[typename][1])

    def label(self, typename: str) -> str:
        return typename

    def build(self, typename: str, values: dict[str, Any]) -> Any:
        _consts, defs = self.ts.fielddefs[typename]
        return self.ts.types[typename](**{name: values[name] if name in values else _default(self.ts, node)
                                          for name, node in defs})

    def basic(self, t: FieldType, v: Any) -> Any:
        if t.name == "octet":
            return v[0] - 256 if v[0] > 127 else v[0]  # rosbags packs `byte` as signed
        return v

    def sequence(self, t: FieldType, items: list) -> Any:
        import numpy as np

        if t.elem.kind == "basic" and t.elem.name in _IDL_DTYPES:
            return np.array(items, dtype=_IDL_DTYPES[t.elem.name])
        return items


def to_rosbags(typename: str, fields: Mapping[str, Any], ts=None) -> Any:
    """Field dict -> rosbags message object (missing fields take ROS defaults)."""
    ts = typestore() if ts is None else ts
    return message_in(_Rosbags(ts), typename, fields)


def _default(ts, node: tuple) -> Any:
    import numpy as np

    kind, detail = int(node[0]), node[1]
    if kind == 1:
        typ = detail[0]
        return "" if typ in ("string", "wstring") else (False if typ == "bool" else (0.0 if typ.startswith("float") else 0))
    if kind == 2:
        return to_rosbags(detail, {}, ts)
    elem, size = detail
    if kind == 3:
        return np.zeros(size, dtype=_NUMPY_DTYPES[elem[1][0]]) if int(elem[0]) == 1 and elem[1][0] in _NUMPY_DTYPES \
            else [_default(ts, elem) for _ in range(size)]
    if int(elem[0]) == 1 and elem[1][0] in _NUMPY_DTYPES:
        return np.zeros(0, dtype=_NUMPY_DTYPES[elem[1][0]])
    return []


def from_rosbags(msg: Any, ts=None) -> dict[str, Any]:
    """rosbags message object -> field dict (the inverse of to_rosbags)."""
    ts = typestore() if ts is None else ts
    typename = msg.__msgtype__
    _consts, defs = ts.fielddefs[typename]
    return {name: _node_to_fields(ts, node, getattr(msg, name)) for name, node in defs}


def _node_to_fields(ts, node: tuple, value: Any) -> Any:
    kind, detail = int(node[0]), node[1]
    if kind == 1:
        if detail[0] == "byte":
            return bytes([int(value) & 0xFF])
        if hasattr(value, "item"):  # numpy scalar
            return value.item()
        return value
    if kind == 2:
        return from_rosbags(value, ts)
    elem = detail[0]
    return [_node_to_fields(ts, elem, v) for v in value]


def cdr_roundtrip(typename: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Serialise fields as CDR (what DDS puts on the wire) and read them back."""
    ts = typestore()
    raw = ts.serialize_cdr(to_rosbags(typename, fields, ts), typename)
    return from_rosbags(ts.deserialize_cdr(bytes(raw), typename), ts)
