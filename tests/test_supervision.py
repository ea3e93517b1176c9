"""Supervision lease on the executor side (nodes/supervision.py) over the in-process transport:
what happens to the running, queued and later goals of a planner whose heartbeats stop, per the
robot's on_planner_lost; goal records served by get_goal_states; allowed_planners; the YAML key.
(Over DDS with nodes as processes: tests_ros2/test_supervision_dds.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from timelyllm_ros.core.minispec import parse_program
from timelyllm_ros.core.robots import RobotSpecError, load_robots, parse_robot
from timelyllm_ros.core.types import ResultCode
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor
from timelyllm_ros.executors.simulated import SimulatedBackend
from timelyllm_ros.nodes.executor_node import ExecutorNode
from timelyllm_ros.nodes.supervision import (
    PLANNER_HEARTBEAT,
    ExecutorSupervisionConfig,
    Heartbeat,
    LeaseWatcher,
)
from timelyllm_ros.ros import convert as c
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.transport.base import GoalStatus
from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

ROBOTS = load_robots()


def calls(text):
    """The calls written in `text` (an executor runs a goal only if its calls are these)."""
    return tuple(parse_program(text, ROBOTS["tello"], check=False)[1])


LEASE = ExecutorSupervisionConfig(lease_s=0.4, heartbeat_period_s=0.1, first_contact_s=0.4)


def wait_for(pred, timeout_s=10.0):
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


class Rig:
    def __init__(self, on_planner_lost="hover", scale=1.0, config=LEASE):
        robot = dataclasses.replace(ROBOTS["tello"], on_planner_lost=on_planner_lost)
        self.backend = SimulatedBackend(robot, seed=0, time_scale=scale)
        self.bus = InProcessBus()
        ex = SegmentExecutor(robot, self.backend, ExecutorConfig(timeout_s=60))
        self.node = ExecutorNode(InProcessTransport(self.bus, "drone1"), ex, robot_id="drone1", supervision=config)
        self.t = InProcessTransport(self.bus)
        self.client = self.t.action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT)

    def goal_states(self, request):
        return self.t.call_service("/drone1/get_goal_states", ifc.GET_GOAL_STATES, request, timeout_s=5)

    def send(self, text, idx, pid="planner_a:h:1:abc", rid="r1"):
        out, fb = [], []
        self.client.send_goal({"request_id": rid, "robot_id": "drone1", "robot_type": "tello", "segment_index": idx,
                               "text": text, "est_exec_s": 1.0, "planner_id": pid,
                               "calls": [c.skill_call_to_fields(x) for x in calls(text)]},
                              on_result=out.append, on_feedback=fb.append)
        return out, fb

    def close(self):
        self.node.close()
        self.t.close()


@pytest.mark.parametrize("mode,where", [("hover", "stopped (hover)"), ("land", "landed (simulated)")])
def test_lost_planner_running_goal_stopped_queued_aborted_later_refused(mode, where):
    rig = Rig(mode)
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
    try:
        run, fb = rig.send("mf(500);", 0)  # ~11 s simulated at time scale 1
        queued, _ = rig.send("tc(90);", 1)
        assert wait_for(lambda: fb)
        beat.close()  # the planner dies: no cancel, no more heartbeats
        assert wait_for(lambda: run and queued, 5)
        assert run[0].status == GoalStatus.ABORTED, run
        err = run[0].result["error_message"]
        assert "planner planner_a:h:1:abc lost: no heartbeat" in err and where in err, err
        assert queued[0].status == GoalStatus.ABORTED
        assert "queued goal aborted, nothing sent" in queued[0].result["error_message"]
        assert queued[0].result["calls_done"] == 0
        later, _ = rig.send("tc(10);", 2)
        assert wait_for(lambda: later)
        assert later[0].status == GoalStatus.ABORTED and "lost" in later[0].result["error_message"]
        assert later[0].result["calls_done"] == 0
        # another planner instance is not affected
        beat2 = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:2:def", 0.05)
        try:
            other, _ = rig.send("tc(10);", 0, pid="planner_a:h:2:def", rid="r2")
            assert wait_for(lambda: other, 10)
            assert other[0].status == GoalStatus.SUCCEEDED, other[0]
        finally:
            beat2.close()
        resp = rig.goal_states({"request_id": "r1"})
        got = {g["segment_index"]: (g["state"], g["planner_id"]) for g in resp["goals"]}
        # the queued goal never ran, nothing of it was sent: "refused" (a restarted planner may redo it)
        assert got == {0: ("stopped", "planner_a:h:1:abc"), 1: ("refused", "planner_a:h:1:abc"),
                       2: ("refused", "planner_a:h:1:abc")}
        assert len(rig.goal_states({"request_id": ""})["goals"]) == 4
    finally:
        beat.close()
        rig.close()


def test_finish_goal_lets_the_running_segment_end_and_aborts_the_queued_ones():
    rig = Rig("finish_goal", scale=0.3)  # mf(100) ~ 1 s wall: ends after the lease ran out
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
    try:
        run, fb = rig.send("mf(100);", 0)
        queued, _ = rig.send("tc(90);", 1)
        assert wait_for(lambda: fb)
        beat.close()
        assert wait_for(lambda: run and queued, 10)
        assert run[0].status == GoalStatus.SUCCEEDED, run
        assert queued[0].status == GoalStatus.ABORTED and "lost" in queued[0].result["error_message"]
    finally:
        beat.close()
        rig.close()


def test_a_live_planner_keeps_its_goals_and_an_idle_silence_is_no_loss():
    rig = Rig(scale=0.3)
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
    try:
        run, _ = rig.send("mf(100);tc(30);", 0)
        assert wait_for(lambda: run, 15) and run[0].status == GoalStatus.SUCCEEDED, run
        beat.close()  # silent while it has nothing here: not supervised, not lost
        import time

        time.sleep(0.8)
        beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
        again, _ = rig.send("tc(10);", 1)
        assert wait_for(lambda: again, 10) and again[0].status == GoalStatus.SUCCEEDED, again
    finally:
        beat.close()
        rig.close()


def test_a_planner_never_heard_is_lost_after_its_first_contact_time():
    rig = Rig()
    try:
        run, _ = rig.send("mf(500);", 0, pid="ghost:h:1:x")
        assert wait_for(lambda: run, 5)
        assert run[0].status == GoalStatus.ABORTED and "never heard" in run[0].result["error_message"]
    finally:
        rig.close()


def test_goals_without_a_planner_id_are_not_supervised_unless_planners_are_allowed():
    rig = Rig(scale=0.05)
    try:
        out, _ = rig.send("tc(10);", 0, pid="")
        assert wait_for(lambda: out, 10) and out[0].status == GoalStatus.SUCCEEDED
    finally:
        rig.close()
    rig = Rig(scale=0.05, config=dataclasses.replace(LEASE, allowed_planners=("/timelyllm/planner",)))
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "/timelyllm/planner:h:1:a", 0.05)
    try:
        bad, _ = rig.send("tc(10);", 0, pid="")
        foreign, _ = rig.send("tc(10);", 1, pid="/intruder:h:1:a")
        good, _ = rig.send("tc(10);", 2, pid="/timelyllm/planner:h:1:a")
        assert wait_for(lambda: bad and foreign and good, 10)
        for out in (bad, foreign):
            assert out[0].status == GoalStatus.ABORTED and "not allowed" in out[0].result["error_message"]
            assert out[0].result["error_code"] == int(ResultCode.REJECTED)
        assert good[0].status == GoalStatus.SUCCEEDED
    finally:
        beat.close()
        rig.close()


def _checks_until(w: LeaseWatcher, now: list[float], t: float, every: float = 0.05) -> list[str]:
    """The watcher's checks at its poll period from now[0] up to t (what its thread does)."""
    gone: list[str] = []
    while now[0] < t - 1e-9:
        now[0] = round(min(t, now[0] + every), 9)
        gone += w.check()
    return gone


def test_lease_watcher_reports_each_supervised_id_once():
    now = [0.0]
    lost = []
    w = LeaseWatcher(None, PLANNER_HEARTBEAT, 1.0, lambda i, s: lost.append((i, s)), clock=lambda: now[0],
                     poll_s=3600)
    try:
        w.heard("a")
        w.heard("b")
        w.supervise("a")
        now[0] = 0.9
        w.heard("a")
        assert _checks_until(w, now, 1.9) == [] and lost == []  # a heard at 0.9; b is not supervised
        assert _checks_until(w, now, 2.0) == ["a"] and lost == [("a", pytest.approx(1.0, abs=0.051))]
        assert _checks_until(w, now, 5.0) == []
    finally:
        w.close()


def test_a_stalled_watcher_reads_waiting_heartbeats_before_it_judges_but_is_not_silenced():
    """A check that comes late (this process got no CPU) gives a supervised id half a lease to be
    heard — once per silence: a watcher late at every check still reports a dead sender."""
    now = [0.0]
    lost = []
    w = LeaseWatcher(None, PLANNER_HEARTBEAT, 1.0, lambda i, s: lost.append(i), clock=lambda: now[0], poll_s=3600)
    try:
        w.heard("a")
        w.supervise("a")
        assert _checks_until(w, now, 0.5) == []
        now[0] = 1.4  # the watcher's thread stalled 0.9 s: a's lease (1.0) ran out meanwhile
        assert w.check() == [] and lost == []  # not judged yet: half a lease to read a's beats
        now[0] = 1.5
        w.heard("a")  # the beat that was waiting in the transport
        assert _checks_until(w, now, 2.4) == []  # heard at 1.5: lease to 2.5
        assert _checks_until(w, now, 2.55) == ["a"]  # a sender really silent is still lost on time
        # starved at every check: the grace is given once per silence, then the loss is reported
        w.heard("a")
        w.supervise("a")
        for t in (3.0, 3.6, 4.2, 4.8):
            now[0] = t
            gone = w.check()
        assert lost == ["a", "a"] and gone == [] and _checks_until(w, now, 6.0) == []
    finally:
        w.close()


def test_on_planner_lost_is_checked_in_the_robot_yaml():
    base = {"robot_type": "x", "language": "minispec", "skills": {"s": {"abbr": "s"}}}
    assert parse_robot(base).on_planner_lost == "hover"
    assert parse_robot({**base, "on_planner_lost": "land"}).on_planner_lost == "land"
    with pytest.raises(RobotSpecError, match="on_planner_lost must be one of"):
        parse_robot({**base, "on_planner_lost": "fly_home"})
    assert {r.on_planner_lost for r in ROBOTS.values()} <= {"hover", "land", "finish_goal"}


def test_a_planner_its_executors_declared_lost_goes_on_as_a_new_instance():
    """Late heartbeats (an overloaded host): the executor stops and refuses the instance; the
    planner's later goals go out under a new instance id, which the executor accepts."""
    import threading

    from timelyllm_ros.core.clock import WallClock
    from timelyllm_ros.core.types import SegmentGoal
    from timelyllm_ros.nodes.dispatcher import ActionDispatcher, DispatcherConfig

    rig = Rig(scale=0.05)
    results, got = [], threading.Event()

    def post(res):
        results.append(res)
        got.set()

    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "/p:h:1:a", 0.05)
    beat.close()  # never heard again: the executor loses it at its first goal
    d = ActionDispatcher(rig.t, WallClock(), post, DispatcherConfig(planner_id="/p:h:1:a", server_wait_s=5.0),
                         beat)
    try:
        d.dispatch(SegmentGoal("r1", "drone1", "tello", 0, "mf(500);", calls("mf(500);"), 10.0, False))
        assert got.wait(10) and "planner /p:h:1:a lost" in results[0].error, results
        assert d.config.planner_id != "/p:h:1:a" and d.config.planner_id.startswith("/p:")
        assert beat.ident == d.config.planner_id
        live = Heartbeat(rig.t, PLANNER_HEARTBEAT, d.config.planner_id, 0.05)
        try:
            got.clear()
            d.dispatch(SegmentGoal("r2", "drone1", "tello", 0, "tc(10);", calls("tc(10);"), 1.0, False))
            assert got.wait(10) and results[1].ok, results[1]
        finally:
            live.close()
    finally:
        d.close()
        rig.close()


def test_closing_the_executor_stops_its_goals_before_the_server_goes():
    """A goal still running when the node closes is stopped and answered (it used to end after
    rclpy's executor was shut down: "'NoneType' object has no attribute 'trigger'")."""
    rig = Rig(scale=1.0)
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
    try:
        run, fb = rig.send("mf(500);", 0)
        queued, _ = rig.send("tc(90);", 1)
        assert wait_for(lambda: fb)
        rig.node.close()
        assert wait_for(lambda: run and queued, 5)
        assert run[0].status == GoalStatus.ABORTED and "executor shutting down: goal stopped" in \
            run[0].result["error_message"]
        assert queued[0].status == GoalStatus.ABORTED and "nothing sent" in queued[0].result["error_message"]
    finally:
        beat.close()
        rig.t.close()


def test_supervision_parameters_are_declared_read_only_and_checked_at_configure():
    """The six supervision parameters are node parameters like the others (nodes/params.py: typed,
    ranged, read-only, in --help); a lease shorter than two heartbeats fails configure."""
    from timelyllm_ros.nodes import params as P
    from timelyllm_ros.nodes.params import ConfigError
    from timelyllm_ros.nodes.wiring import PlannerSetup, executor_supervision

    planner = {p.name: p for p in P.PLANNER_PARAMS}
    executor = {p.name: p for p in P.EXECUTOR_PARAMS}
    for specs, names in ((planner, ("heartbeat_period_s", "executor_lease_s", "allowed_robots")),
                         (executor, ("planner_lease_s", "heartbeat_period_s", "allowed_planners"))):
        for n in names:
            assert n in specs and not specs[n].live and specs[n].description
    assert "allowed_robots" in P.help_text("timelyllm ros planner", P.PLANNER_PARAMS, "")
    with pytest.raises(ConfigError, match="at most half of executor_lease_s"):
        PlannerSetup({"executor_lease_s": 0.3, "heartbeat_period_s": 0.2})
    PlannerSetup({"executor_lease_s": 0.0}).close()  # 0: executors not supervised
    with pytest.raises(ConfigError, match="at most half of planner_lease_s"):
        executor_supervision({"planner_lease_s": 0.3, "heartbeat_period_s": 0.2})
    cfg = executor_supervision({"allowed_planners": " /timelyllm/planner, /b/planner "})
    assert cfg.allowed_planners == ("/timelyllm/planner", "/b/planner")


def test_goal_states_carry_a_succeeded_goals_return_value_for_a_restarted_planner():
    """A blocking goal's return value is kept in its record (GoalState value / value_type), and
    `ask_goal_states` gives it back as a typed value: a planner that died before the result reached
    its journal can resume the plan under the robot's real answer (tests/test_journal.py)."""
    from timelyllm_ros.nodes.supervision import ask_goal_states

    rig = Rig(scale=0.01)
    beat = Heartbeat(rig.t, PLANNER_HEARTBEAT, "planner_a:h:1:abc", 0.05)
    try:
        out, _ = rig.send("s('cat');", 0)
        assert wait_for(lambda: out, 15) and out[0].status == GoalStatus.SUCCEEDED, out
        value = c.value_from_text(out[0].result["value"], out[0].result["value_type"])
        assert isinstance(value, bool)
        (g,) = rig.goal_states({"request_id": "r1"})["goals"]
        assert g["state"] == "succeeded" and (g["value"], g["value_type"]) == (out[0].result["value"], "bool")
        account = ask_goal_states(rig.t, "drone1")
        assert account.goals[("r1", 0)] == "succeeded" and account.values == {("r1", 0): value}
    finally:
        beat.close()
        rig.close()
