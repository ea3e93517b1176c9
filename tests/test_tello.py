"""The djitellopy Tello backend against the Tello emulator, over real UDP on loopback.

djitellopy binds local UDP 8889 (replies) and 8890 (state) once per process; each test uses its
own emulator address 127.0.0.N:9889 so replies are told apart by source IP, as with real drones.
Those host-wide ports may be held by another process, so the module runs in a network namespace
of its own (tests/netns.py) where it can; where it cannot and the ports are taken, it is skipped
with the reason.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

djitellopy = pytest.importorskip("djitellopy")
djitellopy.Tello.LOGGER.setLevel(logging.WARNING)

from netns import own_udp_ports  # noqa: E402
from timelyllm_ros.core.minispec import MiniSpecError, parse_program  # noqa: E402
from timelyllm_ros.core.robots import load_robots, parse_robot  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.tello import TelloBackend, TelloConfig  # noqa: E402
from timelyllm_ros.executors.tello_emulator import TelloEmulator  # noqa: E402

TELLO = load_robots()["tello"]
_next_host = iter(range(10, 250))


def fresh_host() -> str:
    return f"127.0.0.{next(_next_host)}"


def wait_for(pred, timeout=2.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.01)
    return pred()


def _calls(text):
    """The calls written in the text (what the planner's goals carry; executors refuse others)."""
    try:
        return parse_program(text, TELLO, check=False)[1]
    except MiniSpecError:
        return ()


def goal(text, idx=0, est=1.0):
    return SegmentGoal("r1", "drone1", "tello", idx, text, _calls(text), est, False)


class Rig:
    def __init__(self, *, emu=None, robot=TELLO, visible=(), exec_timeout=10.0, **cfg):
        self.host = fresh_host()
        self.emu = TelloEmulator(self.host, **(emu or {})).start()
        conf = dict(host=self.host, control_port=9889, response_timeout_s=1, retry_count=1,
                    keepalive_s=0, move_settle_s=0, turn_settle_s=0)
        conf.update(cfg)
        self.backend = TelloBackend(robot, TelloConfig(**conf), perception=SimulatedPerception(visible))
        self.ex = SegmentExecutor(robot, self.backend, ExecutorConfig(timeout_s=exec_timeout))

    def close(self):
        self.ex.close()
        self.emu.close()


@pytest.fixture(scope="module", autouse=True)
def _own_udp_ports():
    yield from own_udp_ports()


@pytest.fixture
def rig_factory():
    rigs = []

    def make(**kw):
        r = Rig(**kw)
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def test_segment_becomes_exactly_these_sdk_commands(rig_factory):
    rig = rig_factory()
    rep = rig.ex.execute(goal("mf(50);tc(90)"))
    assert rep.code == ResultCode.OK and rep.calls_done == 2 and len(rep.call_durations_s) == 2
    assert rig.emu.commands() == ["command", "takeoff", "forward 50", "cw 90"]
    assert rig.emu.state.flying and rig.emu.state.yaw == 90
    rep = rig.ex.execute(goal("mb(30);tu(45);mu(20);md(20);ml(20);mr(20);", 1))
    assert rep.code == ResultCode.OK
    assert rig.emu.commands()[4:] == ["back 30", "ccw 45", "up 20", "down 20", "left 20", "right 20"]
    assert rig.backend.tello.get_battery() == 87  # state lines reached djitellopy


@pytest.mark.parametrize("text", ["mf(600);", "mf(19);", "tc(0);", "tc(361);", "mf(50.0);", "zz(3);",
                                  "mf('far');", "mf(50);mf(501);"])
def test_invalid_segment_sends_no_sdk_command(rig_factory, text):
    rig = rig_factory()
    rig.ex.start()  # connected: the drone is listening
    rep = rig.ex.execute(goal(text))
    assert rep.code == ResultCode.REJECTED and rep.error
    time.sleep(0.15)
    assert rig.emu.commands() == ["command"]  # connect only: no takeoff, no motion


def test_tello_limits_apply_even_if_the_yaml_allows_more(rig_factory):
    import yaml

    data = yaml.safe_load(open(TELLO.source))
    data["skills"]["move_forward"]["args"][0]["max"] = 1000
    lax = parse_robot(data, "lax-tello")
    rig = rig_factory(robot=lax)
    rig.ex.start()
    rep = rig.ex.execute(goal("mf(700);"))
    assert rep.code == ResultCode.REJECTED and "20..500" in rep.error
    assert rig.emu.commands() == ["command"]


def test_silent_drone_fails_within_the_timeout_then_recovers(rig_factory):
    rig = rig_factory()
    assert rig.ex.execute(goal("mf(50);")).code == ResultCode.OK
    rig.emu.responding = False
    t0 = time.monotonic()
    rep = rig.ex.execute(goal("tc(90);", 1))
    elapsed = time.monotonic() - t0
    assert rep.code == ResultCode.TIMEOUT and "did not answer" in rep.error
    assert elapsed < 3.0  # response_timeout_s=1, one attempt: not djitellopy's 7 s x 3
    rig.emu.responding = True
    rep = rig.ex.execute(goal("mb(40);", 2))
    assert rep.code == ResultCode.OK
    assert rig.emu.commands()[-3:] == ["cw 90", "stop", "back 40"]  # stop after the failure


def test_no_drone_at_all_is_a_failed_result(rig_factory):
    backend = TelloBackend(TELLO, TelloConfig(host=fresh_host(), control_port=9889, response_timeout_s=1,
                                              retry_count=1, keepalive_s=0))
    ex = SegmentExecutor(TELLO, backend, ExecutorConfig(timeout_s=10))
    t0 = time.monotonic()
    rep = ex.execute(goal("mf(50);"))
    assert rep.code == ResultCode.DISCONNECTED and time.monotonic() - t0 < 3.0


def test_cancel_stops_the_drone_at_once(rig_factory):
    rig = rig_factory(emu={"move_s_per_cm": 0.02})  # forward 200 takes 4 s on the emulator
    assert rig.ex.execute(goal("tc(10);")).code == ResultCode.OK
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    rep = rig.ex.execute(goal("mf(200);mf(200);", 1), cancel_requested=cancel.is_set)
    assert rep.code == ResultCode.CANCELLED
    assert time.monotonic() - t0 < 1.0
    assert wait_for(lambda: rig.emu.commands()[-2:] == ["forward 200", "stop"])
    # the next segment is not confused by the interrupted command's late reply
    rep = rig.ex.execute(goal("mb(20);", 2))
    assert rep.code == ResultCode.OK and rig.emu.commands()[-1] == "back 20"


def test_goal_timeout_stops_the_drone(rig_factory):
    rig = rig_factory(emu={"move_s_per_cm": 0.02}, exec_timeout=0.5, response_timeout_s=5)
    t0 = time.monotonic()
    rep = rig.ex.execute(goal("mf(300);"))
    assert rep.code == ResultCode.TIMEOUT and time.monotonic() - t0 < 1.5
    assert wait_for(lambda: rig.emu.commands()[-1:] == ["stop"])


def test_keepalive_keeps_an_idle_drone_flying(rig_factory):
    alive = rig_factory(emu={"auto_land_s": 1.0}, keepalive_s=0.3)
    idle = rig_factory(emu={"auto_land_s": 1.0}, keepalive_s=0)
    for rig in (alive, idle):
        assert rig.ex.execute(goal("mf(20);")).code == ResultCode.OK
    time.sleep(1.8)
    assert alive.emu.state.flying and "keepalive" in alive.emu.commands()
    assert not idle.emu.state.flying and idle.emu.state.auto_landed == 1


def test_perception_and_scan_macro(rig_factory):
    rig = rig_factory(visible=("cat",))
    rep = rig.ex.execute(goal("s('cat');"))
    assert rep.code == ResultCode.OK and rep.value is True
    assert rig.emu.commands() == ["command", "takeoff"]  # seen at once: no turning
    rep = rig.ex.execute(goal("s('dog');", 1))
    assert rep.value is False and rig.emu.commands()[2:] == ["cw 45"] * 8
    rep = rig.ex.execute(goal("_1 = iv('cat');", 2))
    assert rep.value is True
    rep = rig.ex.execute(goal("?_1 == True{mf(40)};", 3))
    assert rep.code == ResultCode.OK and rig.emu.commands()[-1] == "forward 40"


def test_executor_node_with_tello_over_the_inprocess_port(rig_factory):
    pytest.importorskip("rosbags")
    from timelyllm_ros.nodes.executor_node import ExecutorNode
    from timelyllm_ros.ros import convert as c
    from timelyllm_ros.ros import interfaces as ifc
    from timelyllm_ros.transport.base import GoalStatus
    from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

    rig = rig_factory()
    bus = InProcessBus()
    node = ExecutorNode(InProcessTransport(bus, "drone1"), rig.ex, robot_id="drone1")
    client = InProcessTransport(bus).action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT)
    done, out = threading.Event(), []
    client.send_goal(c.segment_goal_to_fields(goal("mf(50);tc(90)")),
                     on_result=lambda o: (out.append(o), done.set()))
    assert done.wait(10)
    assert out[0].status == GoalStatus.SUCCEEDED and out[0].result["calls_done"] == 2
    assert rig.emu.commands() == ["command", "takeoff", "forward 50", "cw 90"]
    node._server.close()


def test_emulator_speaks_the_protocol_to_a_plain_socket():
    host = fresh_host()
    with TelloEmulator(host) as emu:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        s.bind(("127.0.0.1", 0))

        def ask(cmd):
            s.sendto(cmd.encode(), (host, 9889))
            return s.recvfrom(1024)[0].decode()

        assert ask("takeoff") == "error not in SDK mode"
        assert ask("command") == "ok"
        assert ask("battery?") == "87"
        assert ask("forward 50") == "error not flying"
        assert ask("takeoff") == "ok"
        assert ask("forward 10") == "error out of range"
        assert ask("cw 90") == "ok"
        assert ask("flip x").startswith("unknown command")
        assert ask("land") == "ok"
        assert emu.commands()[:3] == ["takeoff", "command", "battery?"]
        s.close()


# ---------------------------------------------------------------- TypeFly's current skill names (issue 27)

TYPEFLY = load_robots()["tello_typefly"]


def tf_goal(text, idx=0):
    return SegmentGoal("tf", "drone1", "tello_typefly", idx, text, parse_program(text, TYPEFLY, check=False)[1],
                       1.0, False)


def test_typefly_skills_become_these_sdk_commands(rig_factory):
    """robots/tello_typefly.yaml on djitellopy + the emulator: signed move / rotate / lift become
    one SDK command per nonzero amount (TypeFly's signs: +forward/+left, +left turn, +up)."""
    rig = rig_factory(robot=TYPEFLY, visible=("cup",))
    rep = rig.ex.execute(tf_goal("m(80,-30);r(-45);r(90);li(40);li(-20);m(0,25);m(-20,0);d(0.05);tp()"))
    assert rep.code == ResultCode.OK, rep.error
    assert rig.emu.commands() == ["command", "takeoff", "forward 80", "right 30", "cw 45", "ccw 90", "up 40",
                                  "down 20", "left 25", "back 20"]
    rep = rig.ex.execute(tf_goal("?_1=sd('Which object is on the table?'){l(_1)}", 1))  # served by perception
    assert rep.code == ResultCode.OK and rig.backend.log_lines[-1] == "cup"
    before = rig.emu.commands()
    for bad in ("m(10,0)", "r(0)", "li(0)", "m(600,0)", "r(45.5)"):
        assert rig.ex.execute(tf_goal(bad, 2)).code == ResultCode.REJECTED, bad
    assert rig.emu.commands() == before  # nothing sent


def test_the_backend_refuses_typefly_amounts_the_sdk_must_never_see_whoever_calls(rig_factory):
    from timelyllm_ros.core.types import SkillCall

    rig = rig_factory(robot=TYPEFLY)
    for name, args in (("move", (10, 0)), ("move", (0, 501)), ("move", (50.0, 0)), ("move", (True, 0)),
                       ("rotate", (0,)), ("rotate", (361,)), ("rotate", (-90.5,)), ("lift", (0,)),
                       ("lift", (-19,)), ("delay", (11,)), ("delay", (True,))):
        spec = TYPEFLY.skills[name]
        assert rig.backend.validate(SkillCall(name, spec.abbr, args), spec), (name, args)
    for name, args in (("move", (0, 0)), ("move", (-500, 20)), ("rotate", (-360,)), ("lift", (20,)),
                       ("delay", (0.5,))):
        spec = TYPEFLY.skills[name]
        assert rig.backend.validate(SkillCall(name, spec.abbr, args), spec) is None, (name, args)
@pytest.mark.parametrize("mode,last,where", [("hover", "stop", "drone hovering (stop sent)"),
                                             ("land", "land", "drone landed")])
def test_a_lost_planner_stops_a_flying_tello_the_robots_way(rig_factory, mode, last, where):
    """Supervision (nodes/supervision.py) with the djitellopy backend and the emulator: the
    planner's heartbeats stop mid-motion; on_planner_lost hover sends `stop`, land lands."""
    import dataclasses

    from timelyllm_ros.nodes.executor_node import ExecutorNode
    from timelyllm_ros.nodes.supervision import PLANNER_HEARTBEAT, ExecutorSupervisionConfig, Heartbeat
    from timelyllm_ros.ros import convert as c
    from timelyllm_ros.ros import interfaces as ifc
    from timelyllm_ros.transport.base import GoalStatus
    from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

    rig = rig_factory(robot=dataclasses.replace(TELLO, on_planner_lost=mode), emu={"move_s_per_cm": 0.02})
    bus = InProcessBus()
    node = ExecutorNode(InProcessTransport(bus, "drone1"), rig.ex, robot_id="drone1",
                        supervision=ExecutorSupervisionConfig(lease_s=0.4, heartbeat_period_s=0.1))
    t = InProcessTransport(bus)
    beat = Heartbeat(t, PLANNER_HEARTBEAT, "/p:h:1:a", 0.05)
    try:
        out, fb = [], []
        t.action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT).send_goal(
            {"request_id": "r1", "robot_id": "drone1", "robot_type": "tello", "segment_index": 0,
             "text": "mf(400);", "est_exec_s": 9.0, "planner_id": "/p:h:1:a",
             "calls": [c.skill_call_to_fields(x) for x in parse_program("mf(400);", TELLO, check=False)[1]]},
            on_result=out.append,
            on_feedback=fb.append)
        assert wait_for(lambda: "forward 400" in rig.emu.commands(), 10)
        beat.close()  # the planner dies mid-motion (400 cm at 0.02 s/cm: 8 s)
        assert wait_for(lambda: out, 10)
        assert out[0].status == GoalStatus.ABORTED
        err = out[0].result["error_message"]
        assert "planner /p:h:1:a lost" in err and where in err, err
        # (`stop` goes out without waiting for a reply: the emulator's UDP thread logs it a moment
        # later — under a loaded CI run, after the goal's result had arrived)
        assert wait_for(lambda: rig.emu.commands()[-1] == last, 5), rig.emu.commands()
        assert rig.emu.state.flying == (mode == "hover")
    finally:
        beat.close()
        node.supervisor.close()
        t.close()
