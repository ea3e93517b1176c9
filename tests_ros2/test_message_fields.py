"""Field dicts <-> rclpy's generated classes (timelyllm_ros.ros.message_fields), property-tested
against the rosbags CDR path of tests/test_ros_interfaces.py: for any field dict of a message
type, rclpy's own serialisation of our message and rosbags' serialisation of the same dict read
back to the same fields, and rosbags reads rclpy's bytes as the same fields too."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message

from timelyllm_ros.ros import convert as c
from timelyllm_ros.ros import cdr
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.ros import walker
from timelyllm_ros.ros import message_fields as mf

TYPES = [ifc.PLAN_REQUEST, ifc.SKILL_CALL, ifc.SEGMENT, ifc.REQUEST_STATUS, ifc.PLANNER_STATUS,
         ifc.EXECUTE_SEGMENT_GOAL, ifc.EXECUTE_SEGMENT_RESULT, ifc.EXECUTE_SEGMENT_FEEDBACK,
         ifc.DIAGNOSTIC_ARRAY, ifc.MARKER_ARRAY, "std_msgs/msg/String", "builtin_interfaces/msg/Time"]

# CDR strings are NUL-terminated; surrogates are not UTF-8
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_INT = {f"{u}int{b}": st.integers(*walker.INT_RANGES[f"{u}int{b}"]) for u in ("", "u") for b in (8, 16, 32, 64)}


def _value(t) -> st.SearchStrategy:
    kind = type(t).__name__
    if kind == "NamespacedType":
        cls = mf._namespaced_class(t)
        return st.deferred(lambda: fields_of(cls))
    if kind in ("UnboundedString", "BoundedString"):
        size = getattr(t, "maximum_size", 12)
        return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                       max_size=min(size, 12))
    if kind == "BasicType":
        typ = t.typename
        if typ == "boolean":
            return st.booleans()
        if typ == "octet":
            return st.binary(min_size=1, max_size=1)
        if typ == "float":
            return st.floats(width=32, allow_nan=False)
        if typ == "double":
            return st.floats(allow_nan=False)
        return _INT[typ]
    elem = _value(t.value_type)
    if kind == "Array":
        return st.lists(elem, min_size=t.size, max_size=t.size)
    return st.lists(elem, max_size=min(getattr(t, "maximum_size", 3), 3))


def fields_of(cls) -> st.SearchStrategy:
    """Every field of a message with a valid value.  (All fields: rosbags does not know the
    defaults a .msg may declare, e.g. Quaternion's w = 1; partial dicts are tested below.)"""
    return st.fixed_dictionaries({n: _value(t) for n, t in mf._layout(cls)})


def _rclpy_roundtrip(cls, fields):
    raw = serialize_message(mf.to_msg(cls, fields))
    return raw, mf.from_msg(deserialize_message(raw, cls))


@pytest.mark.parametrize("typename", TYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rclpy_and_rosbags_agree_on_every_message(typename, data):
    cls = mf.message_class(typename)
    fields = data.draw(fields_of(cls))
    before = copy.deepcopy(fields)
    raw, via_rclpy = _rclpy_roundtrip(cls, fields)
    assert fields == before  # the input is read, never changed
    expected = cdr.cdr_roundtrip(typename, fields)  # rosbags: dict -> CDR -> dict
    assert via_rclpy == expected
    assert _rosbags_read(raw, typename) == expected  # rosbags reads rclpy's bytes alike


def _rosbags_read(raw: bytes, typename: str) -> dict:
    """rosbags' CDR reader over rclpy's bytes.  rmw_fastrtps's serialize reports its size
    *estimate* as the buffer length, so unused bytes may follow the message: read the message
    and check it ends inside the buffer (rosbags' deserialize_cdr insists on an exact size)."""
    ts = cdr.typestore()
    assert bytes(raw[:4]) == b"\x00\x01\x00\x00"  # CDR, little endian
    msg, end = ts.get_msgdef(typename).deserialize_cdr_le(bytes(raw[4:]), 0, ts.types[typename], ts)
    assert end <= len(raw) - 4
    return cdr.from_rosbags(msg, ts)


def test_a_goal_dict_can_be_sent_twice_and_stays_as_it_was():
    """rosidl_runtime_py's set_message_fields replaced the nested dicts of the caller's list
    with SkillCall objects: the second send of the same dict failed ("... is expected to be a
    dictionary but is a SkillCall")."""
    cls = mf.message_class(ifc.EXECUTE_SEGMENT_GOAL)
    goal = {"request_id": "r", "robot_id": "drone1", "segment_index": 3, "text": "mf(50);",
            "calls": [{"name": "move_forward", "abbr": "mf", "args": ["50"], "arg_types": ["int"]}]}
    before = copy.deepcopy(goal)
    first, second = mf.to_msg(cls, goal), mf.to_msg(cls, goal)
    assert goal == before and first == second
    assert type(goal["calls"][0]) is dict and first.calls[0].args == ["50"]
    first.calls[0].args.append("x")  # the message owns its lists
    assert goal["calls"][0]["args"] == ["50"]


def test_missing_fields_keep_the_declared_defaults():
    cls = mf.message_class(ifc.MARKER_ARRAY)
    marker = mf.from_msg(mf.to_msg(cls, {"markers": [{"ns": "drone1"}]}))["markers"][0]
    assert marker["ns"] == "drone1" and marker["pose"]["orientation"]["w"] == 1.0  # `float64 w 1`
    assert mf.from_msg(mf.to_msg(cls, {})) == mf.from_msg(cls())


def test_builtin_time_and_nested_messages():
    msg = mf.to_msg(mf.message_class(ifc.PLAN_REQUEST), {"stamp": c.time_fields(12.25), "request_id": "a"})
    assert (msg.stamp.sec, msg.stamp.nanosec) == (12, 250_000_000)
    assert mf.from_msg(msg)["stamp"] == {"sec": 12, "nanosec": 250_000_000}


@pytest.mark.parametrize("typename,fields,match", [
    (ifc.PLAN_REQUEST, {"request": "x"}, r"no field\(s\) \['request'\]"),
    (ifc.PLAN_REQUEST, {"tuf_ert": "1"}, "'tuf_ert' must be a number"),
    (ifc.PLAN_REQUEST, {"stamp": {"nanosec": -1}}, r"'stamp.nanosec' must be a uint32"),
    (ifc.PLAN_REQUEST, {"stamp": 5}, "'stamp' must be a mapping"),
    (ifc.SEGMENT, {"calls": [{"args": ["1", 2]}]}, r"'calls\[0\].args\[1\]' must be a string"),
    (ifc.SEGMENT, {"calls": "mf(1)"}, "'calls' must be a sequence"),
    (ifc.SEGMENT, {"index": -1}, "'index' must be a uint32"),
    (ifc.REQUEST_STATUS, {"terminal": 1}, "'terminal' must be a bool"),
    (ifc.DIAGNOSTIC_ARRAY, {"status": [{"level": 1}]}, r"'status\[0\].level' must be exactly 1 byte"),
    ("geometry_msgs/msg/PoseWithCovariance", {"covariance": [0.0] * 35}, "exactly 36 items"),
    ("rcl_interfaces/msg/ParameterDescriptor", {"integer_range": [{}, {}]}, "at most 1 items"),
    ("type_description_interfaces/msg/FieldType", {"nested_type_name": "x" * 256}, "bound of 255"),
])
def test_bad_fields_name_the_field(typename, fields, match):
    with pytest.raises(walker.MessageError, match=match):
        mf.to_msg(mf.message_class(typename), fields)


def test_bounded_strings_and_sequences_within_their_bounds():
    ft = mf.to_msg(mf.message_class("type_description_interfaces/msg/FieldType"), {"nested_type_name": "x" * 255})
    assert len(ft.nested_type_name) == 255
    pd = mf.from_msg(mf.to_msg(mf.message_class("rcl_interfaces/msg/ParameterDescriptor"),
                               {"integer_range": [{"from_value": 1, "to_value": 5, "step": 1}]}))
    assert pd["integer_range"] == [{"from_value": 1, "to_value": 5, "step": 1}]


def test_action_part_type_names():
    from timelyllm.action import ExecuteSegment

    assert mf.message_class(ifc.EXECUTE_SEGMENT) is ExecuteSegment
    assert mf.message_class(ifc.EXECUTE_SEGMENT_GOAL) is ExecuteSegment.Goal
    with pytest.raises(ValueError, match="pkg/kind/Name"):
        mf.message_class("timelyllm/PlanRequest")


def test_a_nul_in_a_string_field_is_refused_not_cut_off():
    """Issue 26: rclpy cuts a string at its first NUL (a plan 'mf(50);\\x00tc(90);' arrived as
    'mf(50);', the rest silently dropped); every string field with a NUL is refused, naming it."""
    cls = mf.message_class(ifc.PLAN_REQUEST)
    with pytest.raises(walker.MessageError, match=r"field 'reference_plan' contains a NUL character \(U\+0000\) at "
                                             r"position 7: .* the 7 character\(s\) after it would be lost"):
        mf.to_msg(cls, {"request_id": "a", "reference_plan": "mf(50);\x00tc(90);"})
    goal = mf.message_class(ifc.EXECUTE_SEGMENT_GOAL)
    with pytest.raises(walker.MessageError, match=r"field 'calls\[0\].args\[0\]' contains a NUL"):
        mf.to_msg(goal, {"calls": [{"name": "log", "abbr": "l", "args": ["a\x00b"], "arg_types": ["str"]}]})
    ok = mf.to_msg(cls, {"request_id": "a", "reference_plan": "mf(50);\ntc(90);"})  # other text is kept whole
    assert deserialize_message(serialize_message(ok), cls).reference_plan == "mf(50);\ntc(90);"
