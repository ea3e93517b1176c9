"""ROS interfaces (msg/, action/) and the conversion code, checked without ROS via rosbags."""

from __future__ import annotations

import math
from pathlib import Path

import os
import subprocess
import sys

import pytest

rosbags = pytest.importorskip("rosbags")
from rosbags.typesys import get_types_from_msg  # noqa: E402

from timelyllm_ros.paths import SOURCE_ROOT  # noqa: E402
from timelyllm_ros.core.tuf import NORMAL, TUF  # noqa: E402
from timelyllm_ros.core.types import (  # noqa: E402
    GenState,
    Generation,
    PlanRequest,
    RequestError,
    ResultCode,
    Segment,
    SegmentGoal,
    SkillCall,
)
from timelyllm_ros.ros import convert as c  # noqa: E402
from timelyllm_ros.ros import cdr  # noqa: E402
from timelyllm_ros.ros import interfaces as ifc  # noqa: E402
from timelyllm_ros.ros import walker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_every_msg_file_parses_and_is_registered():
    files = sorted((ROOT / "msg").glob("*.msg"))
    assert {f.stem for f in files} == set(ifc.MSG_FILES)
    ts = cdr.typestore()
    for f in files:
        types = get_types_from_msg(f.read_text(), f"timelyllm/msg/{f.stem}")
        assert f"timelyllm/msg/{f.stem}" in types
        assert f"timelyllm/msg/{f.stem}" in ts.types


def test_action_file_has_goal_result_feedback_sections():
    files = sorted((ROOT / "action").glob("*.action"))
    assert {f.stem for f in files} == set(ifc.ACTION_FILES)
    ts = cdr.typestore()
    for f in files:
        goal, result, feedback = ifc.split_action(f.read_text())
        for suffix, text in (("Goal", goal), ("Result", result), ("Feedback", feedback)):
            assert get_types_from_msg(text, f"timelyllm/msg/{f.stem}_{suffix}")
            assert f"timelyllm/action/{f.stem}_{suffix}" in ts.types
    # nested SkillCall resolves to the package's message, as rosidl resolves it
    _, fields = ts.fielddefs[ifc.EXECUTE_SEGMENT_GOAL]
    calls = dict(fields)["calls"]
    assert calls[1][0][1] == "timelyllm/msg/SkillCall"
    consts = {name: value for name, _, value in ts.fielddefs[ifc.EXECUTE_SEGMENT_RESULT][0]}
    assert consts == {code.name: int(code) for code in ResultCode}


def test_split_action_rejects_wrong_section_count():
    with pytest.raises(walker.MessageError):
        ifc.split_action("int32 a\n---\nint32 b\n")


def test_every_srv_file_has_request_response_and_is_registered():
    files = sorted((ROOT / "srv").glob("*.srv"))
    assert {f.stem for f in files} == set(ifc.SRV_FILES)
    ts = cdr.typestore()
    for f in files:
        for suffix in ("Request", "Response"):
            assert f"timelyllm/srv/{f.stem}_{suffix}" in ts.types
    # nested messages resolve to the package's own, as rosidl resolves them
    _, fields = ts.fielddefs[ifc.GET_GOAL_STATES + "_Response"]
    assert dict(fields)["goals"][1][0][1] == ifc.GOAL_STATE
    with pytest.raises(walker.MessageError, match="a service needs exactly 2 sections"):
        ifc.split_service("int32 a\n")


def test_request_status_states_match_core_states():
    ts = cdr.typestore()
    consts = {value for _, _, value in ts.fielddefs[ifc.REQUEST_STATUS][0]}
    assert {s.value for s in GenState} | {"rejected"} == consts


def _request(**kw) -> PlanRequest:
    base = dict(request_id="r-1", robot_id="drone1", robot_type="tello", task="find the cat",
                scene="cat, chair", tuf=TUF(ert=1.0, alpha=-2.0, beta=1.0), arrival=3.0,
                task_type="T1", category="urgent", consume_rate=12.5,
                reference_plan="s('cat');g('cat');tp;")
    base.update(kw)
    return PlanRequest(**base)


def test_plan_request_roundtrip_through_cdr_and_back_to_core():
    r = _request()
    fields = c.plan_request_to_fields(r, stamp=1700000000.25)
    wire = cdr.cdr_roundtrip(ifc.PLAN_REQUEST, fields)
    assert wire == fields
    back = PlanRequest.from_mapping(c.plan_request_mapping(wire), arrival=3.0)
    assert back == r
    assert c.time_from_fields(wire["stamp"]) == pytest.approx(1700000000.25)


def test_plan_request_zero_consume_rate_means_unset_and_bad_tuf_is_rejected_by_core():
    fields = c.plan_request_to_fields(_request(consume_rate=None))
    assert c.plan_request_mapping(fields)["consume_rate"] is None
    fields["tuf_beta"] = 0.0  # a message with the TUF left out
    with pytest.raises(RequestError, match="beta"):
        PlanRequest.from_mapping(c.plan_request_mapping(fields), arrival=0.0)


@pytest.mark.parametrize("bad", [{"request_id": 5}, {"tuf_ert": "soon"}, {"tuf_alpha": math.nan}, "text"])
def test_plan_request_mapping_names_the_bad_field(bad):
    fields = c.plan_request_to_fields(_request())
    if isinstance(bad, dict):
        fields.update(bad)
    else:
        fields = bad
    with pytest.raises(walker.MessageError):
        c.plan_request_mapping(fields)


@pytest.mark.parametrize("key, n, match", [
    ("task", 4001, "task is longer than 4000"), ("scene", 4001, "scene is longer than 4000"),
    ("task", 1 << 21, "task is longer than 4000"), ("task_type", 257, "task_type is longer than 256"),
    ("category", 65, "category is longer than 64"), ("robot_type", 257, "robot_type is longer than 256"),
    ("reference_plan", (1 << 20) + 1, "reference_plan is longer than 1048576"),
    ("request_id", 300, "request_id must match")])
def test_a_request_is_validated_once_by_the_core(key, n, match):
    """The message only gives the fields' shape; the core decides every limit (one validation:
    PlanRequest.from_mapping), whichever way the request came."""
    fields = c.plan_request_to_fields(_request())
    fields[key] = "x" * n
    m = c.plan_request_mapping(fields)  # no limit here
    assert m[key] == fields[key]
    with pytest.raises(RequestError, match=match):
        PlanRequest.from_mapping(m, arrival=0.0)


def test_values_keep_their_type():
    for v in (None, True, False, 0, -7, 2.5, 1e-300, "", "a 'quoted' str"):
        text, typ = c.value_to_text(v)
        back = c.value_from_text(text, typ)
        assert back == v and type(back) is type(v)
    for text, typ in (("yes", "bool"), ("1.5", "int"), ("nan", "float"), ("x", "tuple")):
        with pytest.raises(walker.MessageError):
            c.value_from_text(text, typ)


def test_segment_goal_roundtrip():
    g = SegmentGoal(request_id="r-1", robot_id="drone1", robot_type="tello", segment_index=3,
                    text="?iv('cat')==True{g('cat');}",
                    calls=(SkillCall("is_visible", "iv", ("cat",)), SkillCall("goto", "g", ("cat",)),
                           SkillCall("move_forward", "mf", (50,)), SkillCall("take_picture", "tp", ())),
                    est_exec_s=4.25, blocking=True)
    wire = cdr.cdr_roundtrip(ifc.EXECUTE_SEGMENT_GOAL, c.segment_goal_to_fields(g))
    assert c.segment_goal_from_fields(wire) == g


@pytest.mark.parametrize("patch", [
    {"calls": [{"name": "mf", "abbr": "mf", "args": ["50"], "arg_types": []}]},
    {"calls": [{"name": "mf", "abbr": "mf", "args": ["fifty"], "arg_types": ["int"]}]},
    {"est_exec_s": -1.0},
    {"segment_index": -1},
    {"text": "x" * 5000},
])
def test_malformed_goal_is_rejected_with_reason(patch):
    g = SegmentGoal("r", "d", "tello", 0, "mf(50);", (SkillCall("move_forward", "mf", (50,)),), 1.0, False)
    fields = c.segment_goal_to_fields(g)
    fields.update(patch)
    with pytest.raises(walker.MessageError):
        c.segment_goal_from_fields(fields)


def test_result_roundtrip_and_planner_side_conversion():
    fields = c.execute_result_fields(code=ResultCode.OK, call_durations_s=[1.25, 2.5], calls_done=2,
                                     value=0.42, exec_duration_s=3.75)
    wire = cdr.cdr_roundtrip(ifc.EXECUTE_SEGMENT_RESULT, fields)
    assert wire == fields
    r = c.segment_result_from_fields(wire, request_id="r", segment_index=2, received_at=10.0)
    assert r.ok and r.value == 0.42 and r.call_durations_s == (1.25, 2.5) and r.calls_done == 2
    assert (r.exec_start, r.exec_end) == (pytest.approx(6.25), 10.0)
    failed = c.execute_result_fields(code=ResultCode.TIMEOUT, error="no reply")
    r2 = c.segment_result_from_fields(cdr.cdr_roundtrip(ifc.EXECUTE_SEGMENT_RESULT, failed),
                                      request_id="r", segment_index=0, received_at=1.0)
    assert r2.code == ResultCode.TIMEOUT and r2.error == "no reply" and not r2.ok


@pytest.mark.parametrize("patch", [{"error_code": 99}, {"success": False}, {"value_type": "int", "value": "x"},
                                   {"call_durations_s": [-1.0]}])
def test_malformed_result_becomes_aborted_result_not_an_exception(patch):
    fields = c.execute_result_fields(code=ResultCode.OK, value=3)
    fields.update(patch)
    r = c.segment_result_from_fields(fields, request_id="r", segment_index=1, received_at=5.0)
    assert r.code == ResultCode.ABORTED and "malformed" in r.error and r.segment_index == 1


def test_feedback_roundtrip():
    fb = c.feedback_fields(2, "mf(50)", 1.5)
    assert cdr.cdr_roundtrip(ifc.EXECUTE_SEGMENT_FEEDBACK, fb) == fb


def _generation() -> Generation:
    g = Generation(request=_request(arrival=10.0, tuf=NORMAL))
    g.state = GenState.WAITING
    s0 = Segment(0, "mf(50);", (SkillCall("move_forward", "mf", (50,)),), False, 5, 10.0, 10.3, 2.2,
                 dispatched_at=10.4, exec_start=10.5, exec_end=12.5, ok=True)
    s1 = Segment(1, "_1=iv('cat');", (SkillCall("is_visible", "iv", ("cat",)),), True, 6, 12.6, 12.9, 0.3,
                 dispatched_at=13.0)
    g.segments = [s0, s1]
    return g


def test_request_status_and_segment_roundtrip():
    g = _generation()
    st = c.request_status_fields(g, stamp=5.0)
    assert cdr.cdr_roundtrip(ifc.REQUEST_STATUS, st) == st
    assert st["state"] == "waiting" and not st["terminal"]
    assert st["segments_dispatched"] == 2 and st["segments_done"] == 1
    assert st["response_time_s"] == pytest.approx(0.5)
    # TUF0(0.5) = 1 (before ERT) + TUF1(13.0 - 12.5 = 0.5) = 1 - 2*0.5 = 0
    assert st["utility"] == pytest.approx(1.0 + 0.0)
    seg = c.segment_to_fields("r-1", g.segments[1])
    assert cdr.cdr_roundtrip(ifc.SEGMENT, seg) == seg
    rej = c.rejected_status_fields("bad id", "", "request_id must match ...")
    assert cdr.cdr_roundtrip(ifc.REQUEST_STATUS, rej)["state"] == "rejected"


def test_planner_status_from_object_or_mapping():
    m = {"queues": {GenState.QUEUED: 3, "running": 2}, "batch_size": 8, "kv_usage": 0.25,
         "tokens_per_s": 41.5, "accrued_utility": 7.5}
    st = c.planner_status_fields(m, stamp=1.0)
    assert cdr.cdr_roundtrip(ifc.PLANNER_STATUS, st) == st
    assert (st["queued"], st["running"], st["waiting"], st["batch_size"]) == (3, 2, 0, 8)


def test_diagnostics_and_markers_roundtrip_with_jazzy_types():
    diag = {"header": {"stamp": c.time_fields(2.0), "frame_id": ""},
            "status": [{"level": b"\x01", "name": "timelyllm: planner", "message": "queue long",
                        "hardware_id": "cpu", "values": [{"key": "queued", "value": "12"}]}]}
    assert cdr.cdr_roundtrip(ifc.DIAGNOSTIC_ARRAY, diag) == diag
    marker = {"markers": [{"header": {"stamp": c.time_fields(2.0), "frame_id": "map"}, "ns": "drone1",
                           "id": 0, "type": 4, "action": 0,
                           "points": [{"x": 0.0, "y": 0.0, "z": 0.8}, {"x": 0.5, "y": 0.0, "z": 0.8}],
                           "scale": {"x": 0.05, "y": 0.0, "z": 0.0},
                           "color": {"r": 0.0, "g": 1.0, "b": 0.0, "a": 1.0}}]}
    back = cdr.cdr_roundtrip(ifc.MARKER_ARRAY, marker)
    assert back["markers"][0]["points"] == marker["markers"][0]["points"]
    assert back["markers"][0]["ns"] == "drone1"


def test_unknown_field_is_an_error():
    with pytest.raises(walker.MessageError, match=r"PlanRequest has no field\(s\) \[.request.\]"):
        cdr.to_rosbags(ifc.PLAN_REQUEST, {"request": "x"})


def test_rclpy_transport_imports_without_ros_and_says_what_to_run(tmp_path):
    """Without rclpy the module still imports; creating a node says to run `make env` (the old
    text sent users to a ROS setup.bash, which this project no longer needs)."""
    code = ("import sys; sys.modules['rclpy'] = None\n"
            "from timelyllm_ros.transport import rclpy_transport as r\n"
            "try:\n    r.RclpyTransport('t')\nexcept r.RclpyUnavailable as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)})
    assert out.returncode == 0, out.stderr
    assert "run `make env`" in out.stdout and "setup.bash" not in out.stdout


def test_a_plan_with_a_nul_is_refused_before_it_is_sent():
    """Issue 26: `timelyllm request --plan` (and any agent) gets a one-line error instead of a plan
    that DDS would cut at the NUL."""
    from timelyllm_ros.nodes.agent import plan_request_fields

    with pytest.raises(walker.MessageError, match="field 'reference_plan' contains a NUL character"):
        plan_request_fields(request_id="r1", robot_id="d1", robot_type="tello", task="t", plan="mf(50);\x00tc(90);")
    with pytest.raises(walker.MessageError, match="field 'task' contains a NUL"):
        plan_request_fields(request_id="r1", robot_id="d1", robot_type="tello", task="find\x00 the cat")
    g = SegmentGoal("r", "d", "tello", 0, "l('a\x00');", (), 1.0, False)
    with pytest.raises(walker.MessageError, match="field 'text' contains a NUL"):
        c.segment_goal_to_fields(g)
