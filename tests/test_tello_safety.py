"""Tello path safety, against the Tello emulator over real UDP (djitellopy, no mocks).

* the backend refuses what the SDK must never see, whoever calls it (no int() truncation, no bools);
* computed arguments are checked at run time on the resolved value: refused -> nothing sent;
* the flight envelope is enforced at run time when amounts come from variables;
* with 20 % of replies dropped: no motion command is sent twice for one call, every goal ends
  within its timeout, and the drone ends hovering or landed -- as the result says (emulator log);
* a busy local UDP port ends the goal DISCONNECTED with a reason.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

djitellopy = pytest.importorskip("djitellopy")
djitellopy.Tello.LOGGER.setLevel(logging.ERROR)

from netns import own_udp_ports  # noqa: E402
from timelyllm_ros.core.minispec import MiniSpecError, parse_program  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall  # noqa: E402
from timelyllm_ros.executors.base import (CallContext, ExecutorConfig, SegmentExecutor,  # noqa: E402
                                          SimulatedPerception, SkillRejected)
from timelyllm_ros.executors.tello import MOTION_WORDS, TelloBackend, TelloConfig  # noqa: E402
from timelyllm_ros.executors.tello_emulator import TelloEmulator, is_invalid  # noqa: E402

TELLO = load_robots()["tello"]
_hosts = iter(range(10, 250))


def _calls(text):
    """The calls written in the text (what the planner's goals carry; executors refuse others)."""
    try:
        return parse_program(text, TELLO, check=False)[1]
    except MiniSpecError:
        return ()


def goal(text, idx=0, rid="r1"):
    return SegmentGoal(rid, "drone1", "tello", idx, text, _calls(text), 1.0, False)


class Rig:
    def __init__(self, *, emu=None, timeout_s=10.0, visible=("cat",), **cfg):
        self.host = f"127.0.1.{next(_hosts)}"  # 127.0.0.N belongs to tests/test_tello.py
        self.emu = TelloEmulator(self.host, **(emu or {})).start()
        conf = dict(host=self.host, control_port=9889, response_timeout_s=1, retry_count=3, keepalive_s=0,
                    takeoff_timeout_s=2, move_settle_s=0, turn_settle_s=0, state_wait_s=1.0)
        conf.update(cfg)
        self.backend = TelloBackend(TELLO, TelloConfig(**conf), perception=SimulatedPerception(visible, seed=1))
        self.ex = SegmentExecutor(TELLO, self.backend, ExecutorConfig(timeout_s=timeout_s))

    def motion_sent(self):
        return [c for c in self.emu.commands() if c.split(" ", 1)[0] in MOTION_WORDS]

    def close(self):
        self.ex.close()
        self.emu.close()


@pytest.fixture(scope="module", autouse=True)
def _own_udp_ports():
    yield from own_udp_ports()  # tests/netns.py: djitellopy's host-wide ports in a private namespace


@pytest.fixture
def rig():
    made = []

    def make(**kw):
        r = Rig(**kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.mark.parametrize("skill, args", [
    ("move_forward", (600,)), ("move_forward", (19,)), ("move_forward", (50.7,)), ("move_forward", (50.0,)),
    ("move_forward", (True,)), ("move_forward", ("50",)), ("move_forward", (None,)), ("move_forward", ()),
    ("move_forward", (50, 50)), ("turn_cw", (0,)), ("turn_cw", (361,)), ("turn_cw", (90.0,)), ("turn_cw", (False,)),
    ("turn_ccw", (-90,)), ("delay", (10.5,)), ("delay", (True,)), ("scan", (5,)), ("log", (None,)),
])
def test_backend_refuses_what_the_sdk_must_never_see_whoever_calls(rig, skill, args):
    r = rig()
    r.ex.start()
    assert r.ex.execute(goal("tc(10);")).code == ResultCode.OK  # airborne
    before = r.emu.commands()
    ctx = CallContext(lambda: False, time.monotonic() + 5)
    spec = TELLO.skills[skill]
    with pytest.raises(SkillRejected, match="nothing sent"):
        r.backend.call(SkillCall(skill, spec.abbr, args), spec, ctx)
    time.sleep(0.1)
    assert r.emu.commands() == before


def test_computed_argument_refused_at_run_time_nothing_sent(rig):
    r = rig(visible=("cat",))
    rep = r.ex.execute(goal("_1=ox('cat');"))  # a float in 0.3..0.7
    assert rep.code == ResultCode.OK and isinstance(rep.value, float)
    before = r.emu.commands()
    rep = r.ex.execute(goal("mf(_1*10000);", 1))  # 3000..7000 cm
    assert rep.code == ResultCode.REJECTED, rep
    assert "refused at run time" in rep.error and "above maximum 500" in rep.error
    assert rep.error.endswith("drone hovering (stop sent)")
    rep = r.ex.execute(goal("mf(20+_1/3);", 1))  # 20.1..20.2: not whole, never truncated to 20
    assert rep.code == ResultCode.REJECTED and "must be a whole number" in rep.error, rep
    assert [c for c in r.emu.commands()[len(before):] if c != "stop"] == []
    rep = r.ex.execute(goal("_2=2;", 2))
    rep = r.ex.execute(goal("tc(_2*45);mf(360/_2/4*10);", 3))  # 90 and 450.0 -> 450: whole, in range
    assert rep.code == ResultCode.OK, rep.error
    assert r.emu.commands()[-2:] == ["cw 90", "forward 450"]


def test_envelope_enforced_at_run_time_for_computed_amounts(rig):
    r = rig()
    assert r.ex.execute(goal("_1=250;")).code == ResultCode.OK
    rep = r.ex.execute(goal("5{mf(_1)};", 1))  # statically 5 x 20 cm (least legal); really 5 x 250 cm
    assert rep.code == ResultCode.REJECTED and "flight envelope" in rep.error and "distance_cm 1250" in rep.error
    assert r.motion_sent() == ["takeoff", "forward 250", "forward 250", "forward 250", "forward 250"]
    assert rep.calls_done == 4 and rep.error.endswith("drone hovering (stop sent)")


def test_busy_udp_port_is_disconnected_with_a_reason():
    """djitellopy binds local UDP 8889 once per process: occupy it first, in a fresh process."""
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n    s.bind(('', 8889))\nexcept OSError:\n    pass  # busy already: just as good\n"
        "from timelyllm_ros.core.robots import load_robots\n"
        "from timelyllm_ros.core.types import SegmentGoal\n"
        "from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor\n"
        "from timelyllm_ros.executors.tello import TelloBackend, TelloConfig\n"
        "t = load_robots()['tello']\n"
        "ex = SegmentExecutor(t, TelloBackend(t, TelloConfig(host='127.0.1.253', control_port=9889, "
        "response_timeout_s=1, keepalive_s=0)), ExecutorConfig(timeout_s=5))\n"
        "from timelyllm_ros.core.types import SkillCall\n"
        "rep = ex.execute(SegmentGoal('r', 'd', 'tello', 0, 'mf(50);', (SkillCall('move_forward', 'mf', (50,)),), "
        "1.0, False))\n"
        "print(rep.code.name, '|', rep.error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("DISCONNECTED |"), out.stdout + out.stderr
    assert "local UDP port" in out.stdout and "Traceback" not in out.stderr


SEGMENTS = ["mf(50);", "tc(90);", "_1=ox('cat');", "?_1>0.4{tu(30)}:{tc(30)}", "2{mr(20);ml(20)}", "mu(30);",
            "md(30);", "s('cat');", "_2=3;", "tc(_2*10);", "mb(_2*10+20);"]


def test_dropped_replies_never_resend_motion_and_always_leave_the_drone_hovering_or_landed(rig):
    timeout_s = 6.0
    r = rig(emu={"drop_replies": 0.2, "seed": 7}, timeout_s=timeout_s)
    outcomes = []
    for i in range(2 * len(SEGMENTS)):
        t0 = time.monotonic()
        rep = r.ex.execute(goal(SEGMENTS[i % len(SEGMENTS)], i))
        took = time.monotonic() - t0
        assert took <= timeout_s + 0.5, (i, took, rep)  # every goal ends with a result within its timeout
        outcomes.append(rep.code)
        if rep.code is not ResultCode.OK:
            assert rep.error.endswith(("drone hovering (stop sent)", "drone landed")), rep.error
            time.sleep(0.05)  # let `stop` arrive
            assert r.emu.state.flying == rep.error.endswith("hovering (stop sent)")
            assert not r.emu.busy()  # hovering: no motion in progress
    sent = r.motion_sent()
    assert sent == r.backend.tello.motion_log  # every motion reached the drone exactly as often as sent
    assert not [c for c in sent if is_invalid(c)]
    events = r.emu.events()
    assert any(e["dropped"] for e in events if e["cmd"].split(" ", 1)[0] in MOTION_WORDS)  # the test bites
    assert ResultCode.OK in outcomes and any(c is not ResultCode.OK for c in outcomes)
    r.ex.close()  # land (once; a lost reply is settled from the state stream)
    time.sleep(0.2)
    assert not r.emu.busy() and r.emu.state.flying == r.backend.flying
    assert r.motion_sent() == r.backend.tello.motion_log


def test_lost_takeoff_reply_is_settled_from_the_state_stream_not_resent(rig):
    r = rig(emu={"drop_words": ("takeoff",)})
    rep = r.ex.execute(goal("mf(30);"))
    assert rep.code == ResultCode.OK, rep.error  # state shows 80 cm: airborne, the goal goes on
    assert r.motion_sent() == ["takeoff", "forward 30"] == r.backend.tello.motion_log


def test_lost_land_reply_on_close_is_settled_from_the_state_stream(rig):
    r = rig(emu={"drop_words": ("land",)})
    assert r.ex.execute(goal("tc(30);")).code == ResultCode.OK
    r.ex.close()
    assert r.motion_sent()[-1:] == ["land"] and r.motion_sent().count("land") == 1
    assert not r.emu.state.flying and not r.backend.flying


def test_goal_timeout_during_takeoff_leaves_the_drone_managed(rig):
    r = rig(emu={"takeoff_s": 1.5}, timeout_s=0.5, takeoff_timeout_s=5)
    rep = r.ex.execute(goal("mf(30);"))
    assert rep.code == ResultCode.TIMEOUT and rep.error.endswith("drone taking off (a Tello hovers when takeoff "
                                                                 "ends; landed on close)"), rep.error
    # halt() looked at the state stream while the takeoff was pending; once it completes the
    # backend knows the drone flies, so close() lands it
    time.sleep(1.6)
    assert r.emu.state.flying and r.backend.flying
    r.ex.close()
    assert not r.emu.state.flying and r.motion_sent() == ["takeoff", "land"]


def test_emulator_log_file_records_every_command_and_dropped_reply(tmp_path, rig):
    import json

    path = tmp_path / "emu.jsonl"
    r = rig(emu={"drop_words": ("cw",), "log_path": str(path)})
    rep = r.ex.execute(goal("mf(30);tc(45);mf(30);"))
    assert rep.code == ResultCode.TIMEOUT and rep.error.endswith("drone hovering (stop sent)")
    time.sleep(0.1)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(e["cmd"], e["dropped"]) for e in lines if e["cmd"] != "command"] == [
        ("takeoff", False), ("forward 30", False), ("cw 45", True), ("stop", False)]
    assert r.motion_sent() == ["takeoff", "forward 30", "cw 45"]  # cw 45 once; the last mf never sent


# ---------------------------------------------------------------- the executor defends the robot (issue 26)

MF500 = (SkillCall("move_forward", "mf", (500,)),)


def test_thirty_foreign_goals_fly_at_most_the_flight_envelope(rig):
    """30 `mf(500)` goals, each under a fresh request id (no planner: what a foreign node on the
    domain can send): the executor flies what the flight envelope allows since takeoff (5,000 cm:
    10 goals) and refuses the rest with the reason, before any command."""
    r = rig()
    reps = [r.ex.execute(SegmentGoal(f"foreign-{i}", "drone1", "tello", 0, "mf(500);", MF500, 1.0, False))
            for i in range(30)]
    assert [x.code for x in reps[:10]] == [ResultCode.OK] * 10
    for x in reps[10:]:
        assert x.code is ResultCode.REJECTED
        assert x.error == ("outside the flight envelope: this flight (since takeoff) would command distance_cm "
                           "5500 (envelope 5000) (already flown: 5000 cm, 0 deg); nothing sent"), x.error
    assert [c for c in r.motion_sent() if c != "takeoff"] == ["forward 500"] * 10


def test_a_multi_call_goal_is_checked_as_a_whole_before_its_first_command(rig):
    r = rig()
    rep = r.ex.execute(goal("mf(500);mf(500);mf(500);"))  # two used to fly before the third was refused
    assert rep.code is ResultCode.REJECTED
    assert "goal would command distance_cm 1500 (envelope 1000); nothing sent" in rep.error, rep.error
    assert r.motion_sent() == []  # not even the takeoff
    for i in range(9):
        assert r.ex.execute(goal("mf(500);", rid=f"f{i}")).code is ResultCode.OK
    rep = r.ex.execute(goal("mf(300);mf(300);", rid="last"))  # 600 > the 500 cm left in this flight
    assert rep.code is ResultCode.REJECTED and "would command distance_cm 5100 (envelope 5000)" in rep.error
    assert r.motion_sent().count("forward 300") == 0


def test_goal_text_and_calls_must_agree(rig):
    r = rig()
    rep = r.ex.execute(SegmentGoal("r1", "drone1", "tello", 0, "tc(90);", MF500, 1.0, False))
    assert rep.code is ResultCode.REJECTED
    assert rep.error == "goal calls [mf(500)] differ from the calls in the text [tc(90)]; nothing sent"
    rep = r.ex.execute(SegmentGoal("r1", "drone1", "tello", 0, "tc(90);", (), 1.0, False))
    assert rep.code is ResultCode.REJECTED and "goal calls [] differ" in rep.error
    assert r.motion_sent() == []
