"""End to end over the in-process port: plan requests in, the planner (simulated engine, paced to
the wall clock) cuts segments, ExecuteSegment goals reach simulated executor nodes, results come
back, RequestStatus / PlannerStatus / diagnostics / planned paths go out."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rosbags")

from timelyllm_ros.core.clock import VirtualClock  # noqa: E402
from timelyllm_ros.core.exec_time import ExecTimeEstimator  # noqa: E402
from timelyllm_ros.core.planner import Planner  # noqa: E402
from timelyllm_ros.core.policies import make_policy  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import ResultCode  # noqa: E402
from timelyllm_ros.engines.simulated import SimulatedEngine  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.simulated import SimulatedBackend  # noqa: E402
from timelyllm_ros.nodes.executor_node import ExecutorNode  # noqa: E402
from timelyllm_ros.nodes.dispatcher import DispatcherConfig  # noqa: E402
from timelyllm_ros.nodes.planner_node import PlannerNode, PlannerNodeConfig  # noqa: E402
from timelyllm_ros.ros import interfaces as ifc  # noqa: E402
from timelyllm_ros.sim.prompts import SimPromptSource  # noqa: E402
from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport  # noqa: E402

ROBOTS = load_robots()


class World:
    def __init__(self, *, executors=(("drone1", "tello", 0.01), ("arm1", "arm", 0.01)), dispatcher=None,
                 visible=("cat",), ended_status_kept=10_000, allowed_robots=()):
        self.bus = InProcessBus()
        self.clock = VirtualClock()
        engine = SimulatedEngine(self.clock)
        prompts = SimPromptSource(engine, robots=ROBOTS)

        def make_planner(dispatcher, listeners):
            p = Planner(clock=self.clock, engine=engine, dispatcher=dispatcher, robots=ROBOTS,
                        policy=make_policy("timelyllm"), estimator=ExecTimeEstimator(ROBOTS), prompts=prompts,
                        listeners=listeners)
            p.batcher = p.latency_guided(64)
            return p

        cfg = PlannerNodeConfig(status_period_s=0.05, ended_status_kept=ended_status_kept, allowed_robots=allowed_robots,
                                dispatcher=dispatcher or DispatcherConfig(server_wait_s=0.2))
        self.planner_node = PlannerNode(InProcessTransport(self.bus, "timelyllm"), make_planner,
                                        clock=self.clock, config=cfg).start()
        self.backends = {}
        self.executors = []
        for rid, rtype, scale in executors:
            be = SimulatedBackend(ROBOTS[rtype], seed=1, time_scale=scale,
                                  perception=SimulatedPerception(visible))
            ex = SegmentExecutor(ROBOTS[rtype], be, ExecutorConfig(timeout_s=30))
            self.executors.append(ExecutorNode(InProcessTransport(self.bus, rid), ex, robot_id=rid))
            self.backends[rid] = be
        self.client = InProcessTransport(self.bus, "drone_app")
        self.status: dict[str, list[dict]] = {}
        self.topics: dict[str, list[dict]] = {"planner_status": [], "diag": [], "paths": []}
        self._cv = threading.Condition()
        self.client.subscribe("/timelyllm/request_status", ifc.REQUEST_STATUS, self._on_status, qos="reliable_deep")
        self.client.subscribe("/timelyllm/planner_status", ifc.PLANNER_STATUS, self.topics["planner_status"].append)
        self.client.subscribe("/diagnostics", ifc.DIAGNOSTIC_ARRAY, self.topics["diag"].append)
        self.client.subscribe("/timelyllm/planned_paths", ifc.MARKER_ARRAY, self.topics["paths"].append,
                              qos="latched")

    def _on_status(self, m):
        with self._cv:
            self.status.setdefault(m["request_id"], []).append(m)
            self._cv.notify_all()

    def request(self, rid, robot_id, robot_type, plan, **kw):
        fields = {"request_id": rid, "robot_id": robot_id, "robot_type": robot_type, "task": "do it",
                  "scene": "cat", "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0, "reference_plan": plan}
        fields.update(kw)
        self.client.publish("/timelyllm/plan_requests", ifc.PLAN_REQUEST, fields, qos="reliable_deep")

    def final(self, rid, timeout=20.0):
        end = time.monotonic() + timeout
        with self._cv:
            while time.monotonic() < end:
                if any(m["terminal"] for m in self.status.get(rid, [])):
                    return [m for m in self.status[rid] if m["terminal"]][-1]
                self._cv.wait(0.05)
        raise AssertionError(f"no terminal status for {rid}: {self.status.get(rid)}")

    def close(self):
        self.planner_node.close()
        for e in self.executors:
            e.close()
        self.client.close()


@pytest.fixture
def world():
    worlds = []

    def make(**kw):
        w = World(**kw)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.close()


def test_plans_run_end_to_end_on_two_robots(world):
    w = world()
    w.request("d1", "drone1", "tello", "mf(50);tc(90);_1 = iv('cat');?_1 == True{mu(30)};")
    w.request("a1", "arm1", "arm", "og();pk('cup');pl('bin');hm();")
    d1, a1 = w.final("d1"), w.final("a1")
    assert d1["state"] == "finished" and a1["state"] == "finished", (d1, a1)
    assert d1["segments_dispatched"] == d1["segments_done"] == 4
    assert a1["segments_done"] == 4
    assert [(call.abbr, call.args) for call, _ in w.backends["drone1"].calls] == [
        ("mf", (50,)), ("tc", (90,)), ("iv", ("cat",)), ("mu", (30,))]
    assert [call.abbr for call, _ in w.backends["arm1"].calls] == ["og", "pk", "pl", "hm"]
    states = [m["state"] for m in w.status["d1"]]
    assert states[0] == "queued" and "waiting" in states  # iv is blocking: the plan waited for it
    assert d1["response_time_s"] > 0 and d1["utility"] > 0
    # the planner learned execution times from the executors' measured durations
    gen = w.planner_node.planner.generations["d1"]
    assert all(s.ok and len(s.measured_s) == len(s.calls) for s in gen.segments)
    time.sleep(0.15)
    assert w.topics["planner_status"] and w.topics["planner_status"][-1]["finished"] == 2
    names = {s["name"] for d in w.topics["diag"] for s in d["status"]}
    assert {"timelyllm: planner", "timelyllm: executor drone1", "timelyllm: executor arm1"} <= names
    path = w.topics["paths"][-1]["markers"]
    assert [m["ns"] for m in path] == ["drone1"]
    pts = path[0]["points"]  # start, forward 0.5 m, then (after a 90 deg cw turn) up 0.3 m
    assert pts[0] == pytest.approx({"x": 0.0, "y": 0.0, "z": 0.8})
    assert pts[1]["x"] == pytest.approx(0.5) and pts[-1]["z"] == pytest.approx(1.1)


@pytest.mark.parametrize("patch,why", [
    ({"tuf_beta": 0.0}, "beta"),
    ({"robot_type": "submarine"}, "unknown robot_type"),
    ({"request_id": "bad id!"}, "request_id"),
])
def test_malformed_requests_are_answered_not_dropped(world, patch, why):
    w = world(executors=())
    args = {"rid": "m1", "robot_id": "drone1", "robot_type": "tello", "plan": "mf(50);"}
    extra = dict(patch)
    if "robot_type" in extra:
        args["robot_type"] = extra.pop("robot_type")
    if "request_id" in extra:
        args["rid"] = extra.pop("request_id")
    w.request(**args, **extra)
    rid = args["rid"]
    st = w.final(rid, timeout=5)
    assert st["state"] == "rejected" and why in st["reason"]
    assert w.planner_node.rejected and w.planner_node.planner.generations == {}


def test_duplicate_request_id_is_rejected(world):
    w = world()
    w.request("dup", "drone1", "tello", "mf(50);")
    assert w.final("dup")["state"] == "finished"
    w.status.pop("dup")
    w.request("dup", "drone1", "tello", "mf(60);")
    st = w.final("dup", timeout=5)
    assert st["state"] == "rejected" and "duplicate" in st["reason"]


def test_no_executor_fails_the_request_with_the_reason(world):
    w = world(executors=())
    w.request("n1", "drone9", "tello", "mf(50);")
    st = w.final("n1")
    assert st["state"] == "failed" and "no executor" in st["reason"] and "/drone9/execute_segment" in st["reason"]


def test_invalid_robot_namespace_fails_cleanly(world):
    w = world(executors=())
    w.request("n2", "drone-1", "tello", "mf(50);")
    st = w.final("n2")
    assert st["state"] == "failed" and "not a valid ROS namespace" in st["reason"]


def test_watchdog_times_out_a_silent_executor_and_cancels_its_goal(world):
    # real-time executor (mf(400) ~ 9 s) but a watchdog of 0.3 s
    w = world(executors=(("drone1", "tello", 1.0),),
              dispatcher=DispatcherConfig(server_wait_s=0.2, timeout_factor=0.0, timeout_margin_s=0.3))
    t0 = time.monotonic()
    w.request("t1", "drone1", "tello", "mf(400);mf(400);")
    st = w.final("t1")
    assert st["state"] == "failed" and "timeout" in st["reason"] and time.monotonic() - t0 < 5
    node = w.executors[0]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not node.reports:
        time.sleep(0.02)
    assert node.reports and node.reports[0][2].code == ResultCode.CANCELLED  # the robot was stopped


def test_cancel_request_topic_cancels_the_plan(world):
    w = world(executors=(("drone1", "tello", 0.5),))
    w.request("c1", "drone1", "tello", "mf(300);mf(300);mf(300);")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(m["segments_dispatched"] for m in w.status.get("c1", [])):
        time.sleep(0.02)
    w.client.publish("/timelyllm/cancel_requests", "std_msgs/msg/String", {"data": "c1"})
    st = w.final("c1")
    assert st["state"] == "cancelled" and "cancelled" in st["reason"]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not w.executors[0].reports:
        time.sleep(0.02)
    assert w.executors[0].reports[0][2].code == ResultCode.CANCELLED
    time.sleep(0.3)  # the executor's CANCELLED result has come back by now
    terminal = [m for m in w.status["c1"] if m["terminal"]]
    assert len(terminal) == 1, terminal  # one terminal status per request, not one per late result


def test_status_memory_is_bounded_to_live_and_recently_ended_requests(world):
    """The node remembers each request's last published status (so a late result after the
    terminal status publishes nothing) — only for live requests and the `ended_status_kept`
    most recently ended ones, not for every request it ever served."""
    w = world(ended_status_kept=2)
    ids = [f"s{i}" for i in range(6)]
    for rid in ids:
        w.request(rid, "drone1", "tello", "mf(50);")
    for rid in ids:
        assert w.final(rid)["state"] == "finished"
    node = w.planner_node
    assert len(node._last_status) == 2 and len(node._ended) == 2
    assert set(node._last_status) <= set(ids)
    assert all(len([m for m in w.status[rid] if m["terminal"]]) == 1 for rid in ids)
    with pytest.raises(ValueError):
        PlannerNodeConfig(ended_status_kept=-1)


def test_executor_failure_fails_the_request(world):
    w = world()
    w.executors[0].executor.config.timeout_s = 0.0  # the drone's executor times every segment out
    w.request("f1", "drone1", "tello", "mf(50);tc(90);")
    st = w.final("f1")
    assert st["state"] == "failed" and "segment 0 timeout" in st["reason"]


def test_live_parameters_take_effect_at_the_next_scheduling_point(world):
    """A policy swap with plans live: they all finish; the new policy and batching schedule the
    rest; admission limits apply to the next request."""
    w = world()
    for i in range(4):
        w.request(f"p{i}", "drone1", "tello", "mf(50);tc(90);mf(50);")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(w.planner_node.planner.generations) < 4:
        time.sleep(0.01)
    assert not any(m["terminal"] for i in range(4) for m in w.status.get(f"p{i}", []))  # live at the swap
    w.planner_node.apply_parameters({"policy": make_policy("fcfs"), "max_batch": 2, "max_per_agent": 1,
                                     "status_period_s": 0.1, "goal_timeout_margin_s": 20.0})
    assert all(w.final(f"p{i}")["state"] == "finished" for i in range(4))
    p = w.planner_node.planner
    assert p.policy.name == "fcfs" and p.batcher.max_batch == 2 and p.config.max_per_agent == 1
    assert w.planner_node.dispatcher.config.timeout_margin_s == 20.0
    time.sleep(0.3)
    values = {kv["key"]: kv["value"] for s in w.topics["diag"][-1]["status"] if s["name"] == "timelyllm: planner"
              for kv in s["values"]}
    assert values["policy"] == "fcfs" and values["batching"] == "fixed(2)"
    w.request("q1", "drone1", "tello", "mf(400);")
    w.request("q2", "drone1", "tello", "mf(50);")
    q2 = w.final("q2")
    assert q2["state"] == "rejected" and "1 unfinished requests" in q2["reason"]
    w.planner_node.apply_parameters({"max_batch": 0})  # back to the policy's own batching
    assert w.final("q1")["state"] == "finished"
    p = w.planner_node.planner  # the policy's own batching again
    assert type(p.batcher).__name__ == ("LatencyGuidedBatch" if p.policy.batching() == "latency-guided"
                                        else "FixedBatch") and p.batcher.max_batch == 256


def test_not_accepting_rejects_new_requests_while_admitted_plans_finish(world):
    w = world()
    w.request("run", "drone1", "tello", "mf(50);tc(90);")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "run" not in w.planner_node.planner.generations:
        time.sleep(0.01)
    w.planner_node.set_accepting(False, "planner inactive (test)")
    w.request("new", "drone1", "tello", "mf(50);")
    assert w.final("new")["state"] == "rejected" and w.final("new")["reason"] == "planner inactive (test)"
    assert w.final("run")["state"] == "finished"


def test_get_request_state_answers_late_joiners_and_is_bounded(world):
    w = world(ended_status_kept=2)
    w.request("s1", "drone1", "tello", "mf(50);tc(90);")
    w.request("bad", "drone1", "submarine", "mf(50);")
    assert w.final("s1")["state"] == "finished"
    ans = w.client.call_service("/timelyllm/get_request_state", ifc.GET_REQUEST_STATE, {"request_id": "s1"})
    assert ans["found"] and ans["status"]["state"] == "finished" and ans["segments"] == ["mf(50);", "tc(90);"]
    bad = w.client.call_service("/timelyllm/get_request_state", ifc.GET_REQUEST_STATE, {"request_id": "bad"})
    assert bad["found"] and bad["status"]["state"] == "rejected" and "submarine" in bad["status"]["reason"]
    assert not w.client.call_service("/timelyllm/get_request_state", ifc.GET_REQUEST_STATE,
                                     {"request_id": "never"})["found"]
    for i in range(3):  # only the 2 newest ended requests are kept
        w.request(f"n{i}", "drone1", "tello", "mf(20);")
        w.final(f"n{i}")
    assert not w.client.call_service("/timelyllm/get_request_state", ifc.GET_REQUEST_STATE,
                                     {"request_id": "s1"})["found"]
    assert len(w.planner_node._state) <= 2


def test_action_clients_of_unknown_robots_are_not_kept(world):
    w = world(executors=())
    for i in range(5):
        w.request(f"u{i}", f"ghost{i}", "tello", "mf(50);")
    for i in range(5):
        assert "no executor" in w.final(f"u{i}")["reason"]
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and w.planner_node.dispatcher.robots():
        time.sleep(0.02)
    assert w.planner_node.dispatcher.robots() == []
def test_allowed_robots_refuses_requests_for_other_robots_with_the_reason(world):
    w = world(allowed_robots=("drone1",))
    w.request("ok1", "drone1", "tello", "tc(10);")
    w.request("no1", "arm1", "arm", "og();")
    assert w.final("ok1")["state"] == "finished"
    st = w.final("no1")
    assert st["state"] == "rejected" and "not in this planner's allowed_robots" in st["reason"]


def test_plan_task_action_in_process_feedback_result_and_idempotent_ids(world):
    """The plan_task action on the in-process transport (over DDS: tests_ros2/test_plan_task.py)."""
    from timelyllm_ros.transport.base import GoalStatus

    w = world()
    ac = w.client.action_client("/timelyllm/plan_task", ifc.PLAN_TASK)
    goal = {"request": {"request_id": "pt1", "robot_id": "drone1", "robot_type": "tello", "task": "t",
                        "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0, "reference_plan": "mf(50);tc(90);"}}
    outs, fbs, done = [], [], threading.Event()
    ac.send_goal(goal, on_result=lambda o: (outs.append(o), done.set()), on_feedback=fbs.append)
    assert done.wait(20)
    assert outs[0].status == GoalStatus.SUCCEEDED and outs[0].result["segments"] == ["mf(50);", "tc(90);"]
    assert fbs[0]["status"]["state"] == "queued"
    again, done2 = [], threading.Event()
    ac.send_goal(goal, on_result=lambda o: (again.append(o), done2.set()))
    assert done2.wait(10) and again[0].result["status"]["state"] == "finished"
    assert w.planner_node.planner.submitted == 1  # one request, answered twice
    bad = dict(goal, request=dict(goal["request"], request_id="pt2", robot_type="submarine"))
    out3, done3 = [], threading.Event()
    ac.send_goal(bad, on_result=lambda o: (out3.append(o), done3.set()))
    assert done3.wait(10) and out3[0].status == GoalStatus.ABORTED
    assert "unknown robot_type" in out3[0].result["status"]["reason"]


def test_live_parameter_changes_are_journaled(world, tmp_path):
    """Issue 27: a live change is applied at the next scheduling point and written to the planner's
    request journal (with the point and the planner's incarnation), so a restart can tell what ran
    under which settings."""
    from timelyllm_ros.journal import Journal

    w = world()
    j = Journal(tmp_path / "j.db")
    try:
        w.planner_node.on_journal(j)
        w.planner_node.apply_parameters({"policy": make_policy("fcfs"), "max_per_agent": 3})
        w.request("r", "drone1", "tello", "mf(50);")
        assert w.final("r")["state"] == "finished"
        (inc, point, changes), = j.parameter_changes()
        assert inc == j.incarnation and point >= 0 and changes == {"policy": "fcfs", "max_per_agent": 3}
    finally:
        j.close()
