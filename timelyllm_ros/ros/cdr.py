"""Field dicts <-> rosbags message objects, and CDR (what DDS puts on the wire) via rosbags.

rosbags is pure Python: with it the wire format of every interface is checked without ROS
installed (the in-process transport's wire check, bags of a demo run, the tests).  The walk
follows rosbags' own field definitions of each type; every value is checked by `walker`, as the
rclpy codec (`message_fields`) checks it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from timelyllm_ros.ros.interfaces import interface_types
from timelyllm_ros.ros.walker import MessageError, basic_in, sequence_in, string_in


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

# rosbags' (.msg) primitive names -> the IDL names `walker` checks under (rosbags keeps a `char`
# as its 0..255 code)
_IDL = {"bool": "boolean", "byte": "octet", "char": "uint8", "float32": "float", "float64": "double"}


def _check_base(typ: str, bound: int, value: Any, path: str) -> Any:
    """One primitive: checked by `walker`, then as rosbags holds it."""
    if typ in ("string", "wstring"):
        return string_in(value, path, bound or None)
    v = basic_in(_IDL.get(typ, typ), value, path)
    if typ == "byte":
        return v[0] - 256 if v[0] > 127 else v[0]  # rosbags packs `byte` as signed
    return v


def _node_from_fields(ts, node: tuple, value: Any, path: str) -> Any:
    import numpy as np

    kind, detail = node
    kind = int(kind)
    if kind == 1:  # BASE
        return _check_base(detail[0], detail[1], value, path)
    if kind == 2:  # NAME (nested message)
        return to_rosbags(detail, value, ts, path)
    # ARRAY (3) / SEQUENCE (4): detail = (element node, size; a sequence's 0 = unbounded)
    elem, size = detail
    items = sequence_in(value, path, size=size if kind == 3 else None, bound=(size or None) if kind == 4 else None)
    values = [_node_from_fields(ts, elem, v, f"{path}[{i}]") for i, v in enumerate(items)]
    if int(elem[0]) == 1 and elem[1][0] in _NUMPY_DTYPES:
        return np.array(values, dtype=_NUMPY_DTYPES[elem[1][0]])
    return values


def to_rosbags(typename: str, fields: Mapping[str, Any], ts=None, path: str = "") -> Any:
    """Field dict -> rosbags message object (missing fields take ROS defaults)."""
    ts = typestore() if ts is None else ts
    cls = ts.types[typename]
    if not isinstance(fields, Mapping):
        what = f"field {path!r}" if path else typename
        raise MessageError(f"{what} must be a mapping of fields, got {type(fields).__name__}")
    _consts, defs = ts.fielddefs[typename]
    unknown = set(fields) - {n for n, _ in defs}
    if unknown:
        raise MessageError(f"{typename} has no fields {sorted(unknown)}")
    kwargs = {}
    for name, node in defs:
        if name in fields:
            kwargs[name] = _node_from_fields(ts, node, fields[name], f"{path}.{name}" if path else name)
        else:
            kwargs[name] = _default(ts, node)
    return cls(**kwargs)


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
