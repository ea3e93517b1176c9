"""THE walk of a field dict into a message, shared by both message codecs.

The transport port carries plain field dicts (`timelyllm_ros.ros.convert`); two codecs turn
them into messages: rclpy's generated classes (`message_fields`, the nodes) and rosbags' CDR
(`cdr`, the in-process transport's wire check, bags, tests).  Each describes its messages' fields
in the neutral `FieldType` (from rosidl_parser types / rosbags field definitions) and builds its
own message objects (`Codec`); the walk and every check are here: unknown fields, nested
mappings, array sizes and sequence bounds, the same integer ranges (`INT_RANGES`), bool, byte,
float32, strings (bound, NUL), under the interface-definition (IDL) name of each type, so a dict
that one codec refuses the other refuses too, with the same text naming the field path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol


class MessageError(ValueError):
    """A message's fields do not describe a valid core object; the text says which and why."""


INT_RANGES = {f"{u}int{b}": ((0, 2**b - 1) if u else (-(2 ** (b - 1)), 2 ** (b - 1) - 1))
              for u in ("", "u") for b in (8, 16, 32, 64)}
FLOAT32_MAX = 3.4028234663852886e38
FLOAT_TYPES = ("float", "double", "long double")


def nul_problem(path: str, v: str) -> str | None:
    """Why a string cannot go into a ROS message as it is: a ROS string is a C string and ends
    at its first NUL, so everything after it would be dropped silently (None if it can)."""
    i = v.find("\x00")
    if i < 0:
        return None
    return (f"field {path!r} contains a NUL character (U+0000) at position {i}: a ROS string ends there "
            f"and the {len(v) - i - 1} character(s) after it would be lost; remove it")


def string_in(v: Any, path: str, limit: int | None = None) -> str:
    """A (w)string field: a str within its bound (None: unbounded) without a NUL."""
    if not isinstance(v, str):
        raise MessageError(f"field {path!r} must be a string, got {type(v).__name__}")
    if limit is not None and len(v) > limit:
        raise MessageError(f"field {path!r} is longer than its bound of {limit} characters")
    problem = nul_problem(path, v)  # a ROS string would be cut at its first NUL, silently
    if problem:
        raise MessageError(problem)
    return v


def basic_in(typ: str, v: Any, path: str) -> Any:
    """One primitive field (IDL type name: boolean, octet, char, [u]intN, float, double) checked
    the way the generated rclpy setters check it (no silent coercion); the field-dict value as
    rclpy takes it (octet: a 1-byte bytes, char: a 1-character str, floats as float)."""
    if typ == "boolean":
        if not isinstance(v, bool):
            raise MessageError(f"field {path!r} must be a bool, got {v!r}")
        return v
    if typ == "octet":  # rclpy: a 1-byte bytes object
        if isinstance(v, (bytes, bytearray)) and len(v) == 1:
            return bytes(v)
        raise MessageError(f"field {path!r} must be exactly 1 byte, got {v!r}")
    if typ == "char":  # rclpy: a 1-character str
        if isinstance(v, str) and len(v) == 1 and ord(v) < 256:
            return v
        raise MessageError(f"field {path!r} must be 1 character, got {v!r}")
    if typ in INT_RANGES:
        lo, hi = INT_RANGES[typ]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise MessageError(f"field {path!r} must be a {typ} in [{lo}, {hi}], got {v!r}")
        return int(v)
    if typ in FLOAT_TYPES:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MessageError(f"field {path!r} must be a number, got {v!r}")
        f = float(v)
        if typ == "float" and math.isfinite(f) and abs(f) > FLOAT32_MAX:
            raise MessageError(f"field {path!r} is out of float32 range: {v!r}")
        return f
    raise MessageError(f"field {path!r}: unsupported basic type {typ}")  # pragma: no cover


def sequence_in(v: Any, path: str, *, size: int | None = None, bound: int | None = None) -> list:
    """An array (exactly `size` items) or a sequence (at most `bound`; None: unbounded) as a list."""
    if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
        raise MessageError(f"field {path!r} must be a sequence, got {type(v).__name__}")
    items = list(v)
    if size is not None and len(items) != size:
        raise MessageError(f"field {path!r} must have exactly {size} items, got {len(items)}")
    if bound is not None and len(items) > bound:
        raise MessageError(f"field {path!r} may have at most {bound} items, got {len(items)}")
    return items


# ----------------------------------------------------------------------------- the walk


@dataclass(frozen=True)
class FieldType:
    """One field's type, as both codecs describe it.  `kind`: "basic" (`name`: the IDL type name),
    "string" (`bound`: its maximum length, None = unbounded), "message" (`name`: the codec's key
    of the nested type), "array" (`bound`: its exact size) or "sequence" (`bound`: its maximum,
    None = unbounded) of `elem`; anything else is refused when a value comes for it."""

    kind: str
    name: Any = ""
    bound: int | None = None
    elem: "FieldType | None" = None


class Codec(Protocol):
    """What a codec gives the walk: its description of a message type (`key`: a generated class,
    a type name) and how it builds its objects from the checked values."""

    def fields(self, key: Any) -> tuple[tuple[str, FieldType], ...]:
        """The message's fields in their declared order."""

    def label(self, key: Any) -> str:
        """The message type as an error names it."""

    def build(self, key: Any, values: dict[str, Any]) -> Any:
        """A new message: the given fields (checked, in declared order) and defaults for the rest."""

    def basic(self, t: FieldType, v: Any) -> Any:
        """A checked primitive (as `basic_in` gives it) as the codec's message holds it."""

    def sequence(self, t: FieldType, items: list) -> Any:
        """Checked items of an array / a sequence as the codec's message holds them."""


def message_in(codec: Codec, key: Any, fields: Any, path: str = "") -> Any:
    """A new message of type `key` from a field dict; the dict is only read.  Raises MessageError
    naming the field path."""
    label = codec.label(key)
    if not isinstance(fields, Mapping):
        what = f"field {path!r}" if path else label
        raise MessageError(f"{what} must be a mapping of fields, got {type(fields).__name__}")
    layout = codec.fields(key)
    known = {n for n, _ in layout}
    unknown = [k for k in fields if k not in known]
    if unknown:
        where = f"field {path!r}: " if path else ""
        raise MessageError(f"{where}{label} has no field(s) {sorted(map(str, unknown))}")
    values = {name: value_in(codec, t, fields[name], f"{path}.{name}" if path else name)
              for name, t in layout if name in fields}
    return codec.build(key, values)


def value_in(codec: Codec, t: FieldType, v: Any, path: str) -> Any:
    """One field's value, checked, as the codec's message holds it."""
    if t.kind == "message":
        return message_in(codec, t.name, v, path)
    if t.kind == "string":
        return string_in(v, path, t.bound)
    if t.kind == "basic":
        return codec.basic(t, basic_in(t.name, v, path))
    if t.kind in ("array", "sequence"):
        items = sequence_in(v, path, size=t.bound if t.kind == "array" else None,
                            bound=t.bound if t.kind == "sequence" else None)
        return codec.sequence(t, [value_in(codec, t.elem, x, f"{path}[{i}]") for i, x in enumerate(items)])
    raise MessageError(f"field {path!r}: unsupported interface type {t.name or t.kind}")  # pragma: no cover
