"""Executors: the segment runner with simulated robots, and the executor node over the port."""

from __future__ import annotations

import random
import threading
import time

import pytest

from timelyllm_ros.core.minispec import MiniSpecError, parse_program
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception
from timelyllm_ros.executors.simulated import SimulatedBackend

ROBOTS = load_robots()
SCALE = 0.002  # robot seconds -> test seconds


def goal(text, idx=0, rid="r1", robot="tello", calls=None, est=1.0):
    """A goal as the planner sends it: its calls are the ones written in its text."""
    if calls is None:
        try:
            calls = parse_program(text, ROBOTS[robot], check=False)[1]
        except MiniSpecError:
            calls = ()
    return SegmentGoal(rid, "drone1", robot, idx, text, tuple(calls), est, False)


def make(robot="tello", seed=0, visible=("cat",), config=None, scale=SCALE):
    be = SimulatedBackend(ROBOTS[robot], seed=seed, time_scale=scale,
                          perception=SimulatedPerception(visible, seed=seed))
    return SegmentExecutor(ROBOTS[robot], be, config or ExecutorConfig(timeout_s=30)), be


def test_durations_follow_the_exec_time_model_with_a_seeded_rng():
    ex, be = make()
    rep = ex.execute(goal("mf(100);tc(90);"))
    assert rep.code == ResultCode.OK and rep.calls_done == 2
    rng = random.Random(0)
    spec_mf, spec_tc = ROBOTS["tello"].skills["move_forward"], ROBOTS["tello"].skills["turn_cw"]
    want = [spec_mf.exec_time.sample(rng, {"distance": 100}), spec_tc.exec_time.sample(rng, {"degrees": 90})]
    assert [s for _, s in be.calls] == pytest.approx(want)
    # measured wall time is the scaled sample (plus scheduling noise, never less)
    for measured, robot_s in zip(rep.call_durations_s, want):
        assert robot_s * SCALE <= measured < robot_s * SCALE + 0.05
    ex2, be2 = make()
    ex2.execute(goal("mf(100);tc(90);"))
    assert [s for _, s in be2.calls] == [s for _, s in be.calls]


def test_perception_values_and_plan_variables_across_segments():
    ex, be = make(visible=("cat",))
    r0 = ex.execute(goal("_1 = iv('cat');", 0))
    assert r0.code == ResultCode.OK and r0.value is True
    r1 = ex.execute(goal("?_1 == True{mf(50)};", 1))  # uses the variable set by segment 0
    assert r1.code == ResultCode.OK and r1.calls_done == 1
    r2 = ex.execute(goal("?iv('dog') == True{mf(50)};", 2))
    assert r2.code == ResultCode.OK and r2.calls_done == 1  # only iv ran
    x = ex.execute(goal("ox('cat');", 3)).value
    assert isinstance(x, float) and 0.3 <= x <= 0.7
    assert ex.execute(goal("ox('dog');", 4)).value == -1.0
    # another plan does not see r1's variables
    other = ex.execute(goal("?_1 == True{mf(50)};", 0, rid="r2"))
    assert other.code == ResultCode.ABORTED and "not defined" in other.error


def test_return_value_and_return_stops_the_plan():
    ex, _ = make()
    assert ex.execute(goal("->True;", 0)).value is True
    rep = ex.execute(goal("mf(50);", 1))  # after `->` nothing runs
    assert rep.code == ResultCode.OK and rep.calls_done == 0


@pytest.mark.parametrize("text,why", [
    ("mf(600);", "above maximum"),
    ("mf(50.5);", "int"),
    ("zz(3);", "zz"),
    ("mf(50", ""),
    ("", "no statement"),
])
def test_invalid_segment_is_rejected_before_anything_runs(text, why):
    ex, be = make()
    rep = ex.execute(goal("tc(90);" + text if text else text))
    assert rep.code == ResultCode.REJECTED and why in rep.error
    assert be.calls == [] and rep.calls_done == 0  # not even the valid tc(90) before it


def test_goal_for_another_robot_type_is_rejected():
    ex, be = make()
    rep = ex.execute(goal("pk('cup');", robot="arm"))
    assert rep.code == ResultCode.REJECTED and "arm" in rep.error and be.calls == []


def test_cancel_mid_segment():
    ex, be = make(scale=0.05)  # mf(100): ~3.2 robot s -> ~0.16 s
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    t0 = time.monotonic()
    rep = ex.execute(goal("mf(100);mf(100);mf(100);"), cancel_requested=flag.is_set)
    assert rep.code == ResultCode.CANCELLED and rep.calls_done == 0
    assert time.monotonic() - t0 < 0.15
    assert be.halts == ["cancel requested"]


def test_timeout_per_goal():
    ex, be = make(scale=0.05, config=ExecutorConfig(timeout_s=0.1))
    rep = ex.execute(goal("mf(500);"))
    assert rep.code == ResultCode.TIMEOUT and "time limit" in rep.error
    assert 0.09 <= rep.exec_duration_s < 0.2
    cfg = ExecutorConfig(timeout_s=100, timeout_factor=2.0, timeout_min_s=0.5)
    assert cfg.limit_for(1.0) == 2.0 and cfg.limit_for(0.1) == 0.5 and cfg.limit_for(80) == 100


def test_feedback_reports_each_call():
    ex, _ = make()
    fb = []
    rep = ex.execute(goal("mf(50);tc(90);mu(20);"), on_feedback=lambda n, cur, el: fb.append((n, cur)))
    assert rep.code == ResultCode.OK
    assert fb == [(0, "mf(50)"), (1, "tc(90)"), (2, "mu(20)"), (3, "")]


def test_flat_calls_fallback_and_chat_reading_time():
    ex, be = make(config=ExecutorConfig(use_interpreter=False))
    rep = ex.execute(goal("mf(50);tc(30);", calls=[SkillCall("move_forward", "mf", (50,)),
                                                   SkillCall("turn_cw", "tc", (30,))]))
    assert rep.code == ResultCode.OK and [c.abbr for c, _ in be.calls] == ["mf", "tc"]
    bad = ex.execute(goal("mf(5);", 1, calls=[SkillCall("move_forward", "mf", (5,))]))
    assert bad.code == ResultCode.REJECTED
    chat, cbe = make("chat")
    sentence = "The cat is on the red chair by the window."
    rep = chat.execute(SegmentGoal("c1", "bot", "chat", 0, sentence,
                                   (SkillCall("say", "say", (sentence,)),), 2.0, False))
    assert rep.code == ResultCode.OK
    assert cbe.calls[0][1] == pytest.approx(0.2 * len(sentence.split()))  # 300 words/min


def test_arm_backend_runs_arm_skills():
    ex, be = make("arm", visible=("cup",))
    rep = ex.execute(goal("?dt('cup')==True{pk('cup')};", robot="arm"))
    assert rep.code == ResultCode.OK and [c.abbr for c, _ in be.calls] == ["dt", "pk"]


# ------------------------------------------------------------------ the executor node


pytest.importorskip("rosbags")
from timelyllm_ros.nodes.executor_node import ExecutorNode  # noqa: E402
from timelyllm_ros.ros import convert as c  # noqa: E402
from timelyllm_ros.ros import interfaces as ifc  # noqa: E402
from timelyllm_ros.transport.base import GoalStatus  # noqa: E402
from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport  # noqa: E402


@pytest.fixture
def graph():
    bus = InProcessBus()
    ex, be = make(scale=0.02)
    node = ExecutorNode(InProcessTransport(bus, "drone1"), ex, robot_id="drone1")
    client = InProcessTransport(bus).action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT)
    yield node, be, client
    node.close()


def send(client, g, results, feedback=None):
    done = threading.Event()

    def on_result(o):
        results.append((g.segment_index, o))
        done.set()

    h = client.send_goal(c.segment_goal_to_fields(g), on_result=on_result,
                         on_feedback=None if feedback is None else feedback.append)
    return h, done


def test_node_runs_goals_in_acceptance_order_with_feedback(graph):
    node, be, client = graph
    results, fb = [], []
    waits = [send(client, goal(f"mf({20 + 10 * i});", i), results, fb)[1] for i in range(4)]
    assert all(w.wait(5) for w in waits)
    assert [i for i, _ in results] == [0, 1, 2, 3]
    assert [c.args[0] for c, _ in be.calls] == [20, 30, 40, 50]
    for _, o in results:
        assert o.status == GoalStatus.SUCCEEDED and o.result["success"] and len(o.result["call_durations_s"]) == 1
    assert any(f["current_call"] == "mf(20)" for f in fb)


def test_node_cancel_running_and_queued_goals(graph):
    node, be, client = graph
    results = []
    h0, d0 = send(client, goal("mf(500);mf(500);", 0), results)  # ~0.44 s at this scale
    h1, d1 = send(client, goal("tc(90);", 1), results)
    h2, d2 = send(client, goal("tc(45);", 2), results)
    time.sleep(0.05)
    h1.cancel()  # queued behind segment 0
    h0.cancel()  # running
    assert d0.wait(2) and d1.wait(2) and d2.wait(2)
    by = {i: o for i, o in results}
    assert by[0].status == GoalStatus.CANCELED and by[0].result["error_code"] == ResultCode.CANCELLED
    assert by[1].status == GoalStatus.CANCELED and by[1].result["calls_done"] == 0
    assert by[2].status == GoalStatus.SUCCEEDED
    assert [c.abbr for c, _ in be.calls] == ["mf", "tc"]  # the cancelled tc(90) never ran


def test_node_rejects_bad_goals_and_reports_failures(graph):
    node, be, client = graph
    results = []
    wrong_robot = SegmentGoal("r1", "drone2", "tello", 0, "mf(50);", (), 1.0, False)
    _, d = send(client, wrong_robot, results)
    assert d.wait(2) and results[-1][1].status == GoalStatus.REJECTED
    _, d = send(client, goal("mf(5);", 1), results)  # accepted, fails validation in the executor
    assert d.wait(2)
    o = results[-1][1]
    assert o.status == GoalStatus.ABORTED and o.result["error_code"] == ResultCode.REJECTED
    assert "below minimum" in o.result["error_message"] and be.calls == []
    r = c.segment_result_from_fields(o.result, request_id="r1", segment_index=1, received_at=0.0)
    assert r.code == ResultCode.REJECTED


# ---------------------------------------------------------------- flight envelope (issue 26)

class FlyingSim(SimulatedBackend):
    """A simulated drone that reports whether it is airborne (as the Tello backend does)."""

    flying = False

    def begin_goal(self, goal, ctx):
        self.flying = True  # takes off on its first goal


MF = lambda n: goal(f"mf({n});", rid=f"x{time.monotonic_ns()}")  # noqa: E731 - a fresh request id each


def test_flight_envelope_counts_every_goal_since_takeoff_and_restarts_after_landing():
    be = FlyingSim(ROBOTS["tello"], time_scale=0.0)
    ex = SegmentExecutor(ROBOTS["tello"], be, ExecutorConfig(timeout_s=30))
    assert [ex.execute(MF(500)).code for _ in range(11)] == [ResultCode.OK] * 10 + [ResultCode.REJECTED]
    be.flying = False  # landed: the next goal's takeoff starts a new flight
    assert ex.execute(MF(500)).code is ResultCode.OK


def test_flight_window_slides_and_a_simulated_robot_without_a_window_has_no_flight_account():
    now = [0.0]
    ex = SegmentExecutor(ROBOTS["tello"], SimulatedBackend(ROBOTS["tello"], time_scale=0.0),
                         ExecutorConfig(timeout_s=30, flight_window_s=1000.0), clock=lambda: now[0])
    codes = []
    for _ in range(12):
        codes.append(ex.execute(MF(500)).code)
        now[0] += 10.0
    assert codes == [ResultCode.OK] * 10 + [ResultCode.REJECTED] * 2  # 5,000 cm in the last 1,000 s
    assert "the last 1000 s of flight would command distance_cm 5500" in ex.execute(MF(500)).error
    now[0] = 1005.0  # the first goal (t = 0) left the window, the second (t = 10) not yet
    assert ex.execute(MF(500)).code is ResultCode.OK
    assert ex.execute(MF(500)).code is ResultCode.REJECTED
    plain = SegmentExecutor(ROBOTS["tello"], SimulatedBackend(ROBOTS["tello"], time_scale=0.0))
    assert plain.flight is None and all(plain.execute(MF(500)).code is ResultCode.OK for _ in range(20))
    with pytest.raises(ValueError, match="flight window"):
        SegmentExecutor(ROBOTS["tello"], SimulatedBackend(ROBOTS["tello"]), ExecutorConfig(flight_window_s=-1))


def test_flight_limits_from_the_robot_yaml():
    import yaml

    from timelyllm_ros.core.robots import parse_robot

    data = yaml.safe_load(open(ROBOTS["tello"].source))
    data["envelope"]["flight"] = {"distance_cm": 1200}
    robot = parse_robot(data, "t.yaml")
    be = FlyingSim(robot, time_scale=0.0)
    ex = SegmentExecutor(robot, be, ExecutorConfig(timeout_s=30))
    reps = [ex.execute(goal(f"mf(500);", rid=f"y{i}")) for i in range(3)]
    assert [r.code for r in reps] == [ResultCode.OK, ResultCode.OK, ResultCode.REJECTED]
    assert "this flight (since takeoff) would command distance_cm 1500 (envelope 1200)" in reps[2].error
