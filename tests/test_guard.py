"""Dispatch guard: hand-written accept/reject cases."""

from __future__ import annotations

import dataclasses

import pytest

from timelyllm_ros.core.guard import GuardVerdict, check_goal, check_segment
from timelyllm_ros.core.minispec import parse_statement
from timelyllm_ros.core.robots import load_robots, parse_robot
from timelyllm_ros.core.types import SegmentGoal, SkillCall

ROBOTS = load_robots()
TELLO, ARM, CHAT = ROBOTS["tello"], ROBOTS["arm"], ROBOTS["chat"]


def calls(text, robot=TELLO):
    return parse_statement(text, robot, check=False).calls


def verdict(text, robot=TELLO):
    return check_segment(robot, text, calls(text, robot))


@pytest.mark.parametrize("robot, text", [
    (TELLO, "mf(50);"), (TELLO, "mf(20)"), (TELLO, "mf(500);"), (TELLO, "tc(1)"), (TELLO, "tu(360)"),
    (TELLO, "tp"), (TELLO, "take_picture();"), (TELLO, "?iv('cat')==True{g('cat');tp}"),
    (TELLO, ":{s('cat')}"), (TELLO, "8{?iv('cat')==True{->True}tc(45)}"), (TELLO, "_1=ox('cat');"),
    (TELLO, "l('\\'; rm -rf /');"), (TELLO, "l('naïve café 猫 🐈');"), (TELLO, "10{10{10{l('x')}}}"),  # 1000 calls: the loop-product limit; 1000 tp = 500 s leaves the envelope
    (ARM, "mt(-80,80,0);"), (ARM, "rw(-180)"), (ARM, "?dt('red box'){pk('red box');pl('blue box')}"),
])
def test_accepts_valid_segments(robot, text):
    v = verdict(text, robot)
    assert v.ok and v.reason == "" and bool(v)


@pytest.mark.parametrize("robot, text, fragment", [
    (TELLO, "mf(19)", "outside 20..500"),
    (TELLO, "mf(501)", "outside 20..500"),
    (TELLO, "mf(-50)", "outside 20..500"),
    (TELLO, "tc(0)", "outside 1..360"),
    (TELLO, "tc(361)", "outside 1..360"),
    (TELLO, "mf(50.0)", "must be an int"),
    (TELLO, "mf('50')", "must be an int"),
    (TELLO, "mf(True)", "must be an int"),
    (TELLO, "mf()", "takes 1 argument"),
    (TELLO, "s(3)", "must be a string"),
    (TELLO, "l('" + "x" * 201 + "')", "longer than 200"),
    (TELLO, "l('a\u202eb')", "non-printable"),
    (TELLO, "l('a\u0000b')", "non-printable"),
    (TELLO, "l('line\nbreak')", "non-printable"),
    (TELLO, "mf(50);mf(60)", "invalid statement"),
    (TELLO, "foo(1)", "unknown skill"),
    (TELLO, "11{10{10{tp}}}", "nested loops repeat 1100"),
    (TELLO, "101{tp}", "invalid statement"),
    (TELLO, "l('abc", "unterminated"),
    (ARM, "mt(0,0,91)", "outside 0..90"),
    (ARM, "rw(181)", "outside -180..180"),
])
def test_rejects_schema_violations(robot, text, fragment):
    try:
        c = calls(text, robot)
    except Exception:
        c = ()
    v = check_segment(robot, text, c)
    assert not v.ok and fragment in v.reason, v.reason


def test_calls_must_equal_calls_in_text():
    good = calls("mf(50);")
    assert check_segment(TELLO, "mf(50);", good).ok
    for smuggled in [
        (SkillCall("move_forward", "mf", (500,)),),
        (SkillCall("move_forward", "mf", (50.0,)),),  # 50.0 == 50 in Python, not here
        (SkillCall("move_backward", "mb", (50,)),),
        (SkillCall("move_forward", "mb", (50,)),),
        good + good,
        (),
    ]:
        v = check_segment(TELLO, "mf(50);", smuggled)
        assert not v.ok and "differ from the calls in the text" in v.reason
    # True must not stand for 1 in a comparison of call lists
    v = check_segment(TELLO, "l('x');", (SkillCall("log", "l", ("x",)),))
    assert v.ok


def test_hard_limits_hold_even_if_schema_is_loosened():
    data = {"robot_type": "tello", "language": "minispec", "skills": {
        "move_forward": {"abbr": "mf", "args": [{"name": "distance", "type": "int", "min": 0, "max": 5000}]},
        "turn_cw": {"abbr": "tc", "args": [{"name": "degrees", "type": "float", "min": 0, "max": 720}]},
    }}
    loose = parse_robot(data)
    assert parse_statement("mf(5000)", loose).calls  # the loosened schema allows it ...
    v = verdict("mf(5000)", loose)
    assert not v.ok and "hard limit 20..500" in v.reason  # ... the guard does not
    v = verdict("tc(90.5)", loose)
    assert not v.ok and "must be an int" in v.reason  # SDK takes ints only


def test_call_count_bound():
    text = "{" + ";".join(["tp"] * 20) + "}"
    many = (SkillCall("take_picture", "tp", ()),) * 40
    v = check_segment(TELLO, "1" + text, many)
    assert not v.ok and "40 calls" in v.reason


def test_never_raises_on_garbage_arguments():
    for robot, text, c in [
        (None, "tp", ()), (TELLO, None, ()), (TELLO, "tp", None), (TELLO, "tp", [object()]),
        (TELLO, "tp", "tp"), (TELLO, 42, ()), (TELLO, "", ()), (TELLO, "   ", ()),
        (TELLO, "mf(50)", (SkillCall("move_forward", "mf", [50]),)),  # args not a tuple
        (TELLO, "x" * 100000, ()),
        (TELLO, "mf(50)", (SkillCall("move_forward", "mf", (10**5000,)),)),  # str() of it raises
        (TELLO, "mf(1" + "0" * 5000 + ")", (SkillCall("move_forward", "mf", (10**5000,)),)),
    ]:
        v = check_segment(robot, text, c)  # type: ignore[arg-type]
        assert isinstance(v, GuardVerdict) and not v.ok and v.reason
        assert not v.reason.startswith("internal guard error"), v.reason


def test_chat_segments():
    say = lambda t: (SkillCall("say", "say", (t,)),)  # noqa: E731
    assert check_segment(CHAT, "Hello there.", say("Hello there.")).ok
    assert check_segment(CHAT, "Line one\nline two.", say("Line one\nline two.")).ok
    assert not check_segment(CHAT, "Hello.", say("Goodbye.")).ok
    assert not check_segment(CHAT, "Hello.", say("Hello.") * 2).ok
    assert not check_segment(CHAT, "Hi \x1b[2J.", say("Hi \x1b[2J.")).ok
    assert not check_segment(CHAT, "x" * 2001, say("x" * 2001)).ok
    assert not check_segment(CHAT, "Hi.", (SkillCall("log", "say", ("Hi.",)),)).ok


def test_check_goal_matches_robot_type():
    goal = SegmentGoal("r1", "drone1", "tello", 0, "mf(50);", calls("mf(50);"), 2.2, False)
    assert check_goal(TELLO, goal).ok
    assert not check_goal(ARM, goal).ok
    bad = dataclasses.replace(goal, calls=(SkillCall("move_forward", "mf", (400,)),))
    assert not check_goal(TELLO, bad).ok
