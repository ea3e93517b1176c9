"""The same node code over real rclpy (Fast DDS), several nodes in this one process.
(`make env` installs rclpy and builds the `timelyllm` interfaces into .venv; the tests with
nodes in separate processes are in test_ros_processes.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.engines.simulated import SimulatedEngine
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception
from timelyllm_ros.executors.simulated import SimulatedBackend
from timelyllm_ros.nodes.executor_node import ExecutorNode
from timelyllm_ros.nodes.dispatcher import DispatcherConfig
from timelyllm_ros.nodes.planner_node import PlannerNode, PlannerNodeConfig
from timelyllm_ros.ros import convert as c
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.sim.prompts import SimPromptSource
from timelyllm_ros.transport.base import GoalStatus
from timelyllm_ros.transport.rclpy_transport import RclpyTransport

ROBOTS = load_robots()


@pytest.fixture
def transports():
    made = []

    def make(name, ns=""):
        t = RclpyTransport(name, ns)
        made.append(t)
        return t

    yield make
    for t in reversed(made):
        t.close()


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.02)
    return pred()


def test_topic_roundtrip(transports):
    a, b = transports("a"), transports("b")
    got = []
    b.subscribe("/timelyllm_test/requests", ifc.PLAN_REQUEST, got.append, qos="reliable_deep")
    pub = a.publisher("/timelyllm_test/requests", ifc.PLAN_REQUEST, qos="reliable_deep")
    fields = {"request_id": "r1", "robot_id": "drone1", "robot_type": "tello", "task": "t",
              "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0, "stamp": c.time_fields(5.5)}
    assert wait_for(lambda: (pub.publish(fields) or got), 10)
    assert got[0]["request_id"] == "r1" and got[0]["tuf_beta"] == 1.0 and got[0]["stamp"]["sec"] == 5


def test_action_feedback_result_and_cancel(transports):
    server, client = transports("srv", "drone_t"), transports("cli")
    started = threading.Event()

    def execute(h):
        h.publish_feedback(c.feedback_fields(0, "mf(50)", 0.0))
        if h.request["segment_index"] == 1:
            started.set()
            while not h.is_cancel_requested:
                time.sleep(0.01)
            h.canceled()
            return c.execute_result_fields(code=4, error="cancelled")
        h.succeed()
        return c.execute_result_fields(code=0, call_durations_s=[0.25], calls_done=1, value=True)

    server.action_server("execute_segment", ifc.EXECUTE_SEGMENT, execute)
    ac = client.action_client("/drone_t/execute_segment", ifc.EXECUTE_SEGMENT)
    assert wait_for(ac.server_is_ready)
    goal = {"request_id": "r", "robot_id": "drone_t", "robot_type": "tello", "segment_index": 0,
            "text": "mf(50);", "calls": [{"name": "move_forward", "abbr": "mf", "args": ["50"],
                                          "arg_types": ["int"]}], "est_exec_s": 1.0, "blocking": False}
    out, fb = [], []
    ac.send_goal(goal, on_result=out.append, on_feedback=fb.append)
    assert wait_for(lambda: out)
    assert out[0].status == GoalStatus.SUCCEEDED and out[0].result["call_durations_s"] == [0.25]
    assert out[0].result["value"] == "true" and fb and fb[0]["current_call"] == "mf(50)"
    out2 = []
    h = ac.send_goal(dict(goal, segment_index=1), on_result=out2.append)
    assert started.wait(10)
    h.cancel()
    assert wait_for(lambda: out2) and out2[0].status == GoalStatus.CANCELED


class _SlowToRecord(dict):
    """rclpy records a request's sequence number after sending it: this widens that window."""

    def __setitem__(self, key, value):
        time.sleep(0.5)
        super().__setitem__(key, value)


def test_a_response_faster_than_rclpy_records_its_request_is_not_lost(transports):
    """ros2/rclpy#1123: a goal or result response handled before rclpy has recorded the request's
    sequence number was dropped ("Ignoring unexpected goal response") and the goal never got its
    result (once in CI: a plan_task goal left waiting after its plan ended).  The window is widened
    to 0.5 s here; the answer must still arrive."""
    server, client = transports("srv_race", "drone_race"), transports("cli_race")
    server.action_server("execute_segment", ifc.EXECUTE_SEGMENT,
                         lambda h: (h.succeed(), c.execute_result_fields(code=0, calls_done=1))[1])
    ac = client.action_client("/drone_race/execute_segment", ifc.EXECUTE_SEGMENT)
    assert wait_for(ac.server_is_ready)
    raw = ac._client
    raw._pending_goal_requests = _SlowToRecord()
    raw._pending_result_requests = _SlowToRecord()
    goal = {"request_id": "r", "robot_id": "drone_race", "robot_type": "tello", "segment_index": 0,
            "text": "tc(30);", "calls": [{"name": "turn_cw", "abbr": "tc", "args": ["30"], "arg_types": ["int"]}],
            "est_exec_s": 1.0, "blocking": False}
    outs = []
    for i in range(3):
        ac.send_goal(dict(goal, segment_index=i), on_result=outs.append)
    assert wait_for(lambda: len(outs) == 3, 20), outs
    assert all(o.status == GoalStatus.SUCCEEDED and o.result["calls_done"] == 1 for o in outs), outs


def test_planner_and_executor_nodes_end_to_end(transports):
    clock = VirtualClock()
    engine = SimulatedEngine(clock)
    prompts = SimPromptSource(engine, robots=ROBOTS)

    def make_planner(dispatcher, listeners):
        p = Planner(clock=clock, engine=engine, dispatcher=dispatcher, robots=ROBOTS,
                    policy=make_policy("timelyllm"), estimator=ExecTimeEstimator(ROBOTS), prompts=prompts,
                    listeners=listeners)
        p.batcher = p.latency_guided(64)
        return p

    planner = PlannerNode(transports("planner", "timelyllm_e2e"), make_planner, clock=clock,
                          config=PlannerNodeConfig(dispatcher=DispatcherConfig(server_wait_s=10.0))).start()
    be = SimulatedBackend(ROBOTS["tello"], time_scale=0.01, perception=SimulatedPerception(["cat"]))
    ex = ExecutorNode(transports("executor", "drone_e2e"),
                      SegmentExecutor(ROBOTS["tello"], be, ExecutorConfig(timeout_s=30)), robot_id="drone_e2e")
    client = transports("app")
    status = []
    client.subscribe("/timelyllm_e2e/request_status", ifc.REQUEST_STATUS, status.append, qos="reliable_deep")
    fields = {"request_id": "e1", "robot_id": "drone_e2e", "robot_type": "tello", "task": "find the cat",
              "scene": "cat", "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0,
              "reference_plan": "mf(50);_1 = iv('cat');?_1 == True{tc(90)};"}
    pub = client.publisher("/timelyllm_e2e/plan_requests", ifc.PLAN_REQUEST, qos="reliable_deep")
    time.sleep(1.0)  # discovery
    pub.publish(fields)
    assert wait_for(lambda: any(m["terminal"] for m in status), 30), status
    final = [m for m in status if m["terminal"]][-1]
    assert final["state"] == "finished", final
    assert [call.abbr for call, _ in be.calls] == ["mf", "iv", "tc"]
    planner.close()
    ex.close()


def test_a_failing_callback_does_not_make_the_node_deaf(transports):
    """rclpy's executor re-raises a callback's exception from spin(): the spin thread used to
    end there, leaving a node that was up but never called back again."""
    a, b = transports("pub_f"), transports("sub_f")
    got = []

    def flaky(m):
        got.append(m["data"])
        if m["data"] == "boom":
            raise RuntimeError("a callback bug")

    b.subscribe("/timelyllm_test/flaky", "std_msgs/msg/String", flaky, qos="reliable_deep")
    ticks = []
    b.timer(0.05, lambda: ticks.append(1) or (len(ticks) == 2 and 1 / 0))  # raises once
    pub = a.publisher("/timelyllm_test/flaky", "std_msgs/msg/String", qos="reliable_deep")
    assert wait_for(lambda: (pub.publish({"data": "boom"}) or "boom" in got), 10)
    n = len(ticks)
    pub.publish({"data": "after"})
    assert wait_for(lambda: "after" in got, 10), got
    assert wait_for(lambda: len(ticks) > n + 3, 10)  # the timer keeps firing too
    assert b._spin.is_alive()


def test_close_joins_the_spin_thread(transports):
    t = transports("closer")
    spin = t._spin
    assert spin.is_alive()
    t.close()
    assert not spin.is_alive()
    t.close()  # idempotent


def test_a_destroy_queued_as_the_spin_thread_stops_still_runs(transports):
    """`_between_spins` queues a destroy for the spin thread; where that thread stops after its
    last drain (close, in another thread), the destroy ran nowhere and its caller waited out its
    timeout.  Now the caller runs what is left once the thread is gone."""
    t = transports("late_destroy")
    t._stopping.set()  # the real spin thread ends its loop, drains, and exits
    t.executor.wake()
    t._spin.join(5)
    release = threading.Event()
    t._spin = threading.Thread(target=release.wait, daemon=True)  # alive at the check, drains nothing
    t._spin.start()
    ran = []
    threading.Timer(0.2, release.set).start()  # ... and stops once the destroy is queued
    t._between_spins(lambda: ran.append(threading.current_thread()), timeout_s=30.0)
    assert ran == [threading.current_thread()]  # run by the caller, not lost
    assert t._destroys == []


def test_messages_of_one_topic_are_handled_in_order(transports):
    """In one reentrant callback group, rclpy's MultiThreadedExecutor may run two callbacks of
    the same subscription at once: status messages were seen out of order ("finished" before
    the "draining" published just before it)."""
    a, b = transports("pub_o"), transports("sub_o")
    got = []

    def slow(m):
        if m["data"] == "0":
            time.sleep(0.2)  # the next messages arrive while this one is still being handled
        got.append(m["data"])

    b.subscribe("/timelyllm_test/order", "std_msgs/msg/String", slow, qos="reliable_deep")
    pub = a.publisher("/timelyllm_test/order", "std_msgs/msg/String", qos="reliable_deep")
    assert wait_for(lambda: pub.matched_count() > 0)
    for i in range(20):
        pub.publish({"data": str(i)})
    assert wait_for(lambda: len(got) == 20, 10), got
    assert got == [str(i) for i in range(20)]


def test_goals_waiting_their_turn_hold_no_executor_thread(transports):
    """A robot runs one goal at a time: the goals queued behind it wait inside their execute
    callback.  With more of them than the node's executor threads (16), the node must go on
    serving its services, subscriptions (heartbeats) and cancels: each goal waits on a thread of
    its own, ACCEPTED until it calls `executing()`.  (Before, 16 queued goals held every executor
    thread: the executor's heartbeat subscription starved and its planner was declared lost.)"""
    n = 40
    server, client = transports("srv_many", "drone_q"), transports("cli_many")
    release, lock, waiting = threading.Event(), threading.Lock(), []

    def execute(h):
        with lock:
            waiting.append(h.request["segment_index"])
        if not release.wait(60):
            h.abort()
            return c.execute_result_fields(code=2, error="never released")
        time.sleep(0.05 * h.request["segment_index"])  # then one after another, as a robot ends them
        h.executing()
        h.succeed()
        return c.execute_result_fields(code=0, calls_done=1)

    server.action_server("execute_segment", ifc.EXECUTE_SEGMENT, execute)
    server.service("get_goal_states", ifc.GET_GOAL_STATES, lambda req: {"goals": [], "robot_state": "idle"})
    ac = client.action_client("/drone_q/execute_segment", ifc.EXECUTE_SEGMENT)
    assert wait_for(ac.server_is_ready)
    goal = {"request_id": "r", "robot_id": "drone_q", "robot_type": "tello", "segment_index": 0, "text": "mf(50);",
            "calls": [{"name": "move_forward", "abbr": "mf", "args": ["50"], "arg_types": ["int"]}],
            "est_exec_s": 1.0, "blocking": False}
    results = []
    for i in range(n):  # one at a time (a burst of goal requests beyond the goal service's depth, 10, is lost)
        ac.send_goal(dict(goal, segment_index=i), on_result=results.append)
        assert wait_for(lambda: len(waiting) == i + 1, 10), f"goal {i} never reached execute ({len(waiting)} did)"
    answer = client.call_service("/drone_q/get_goal_states", ifc.GET_GOAL_STATES, {"request_id": ""}, timeout_s=10,
                                 resend_s=1.0)
    assert answer is not None and answer["robot_state"] == "idle"
    release.set()
    assert wait_for(lambda: len(results) == n, 30), f"{len(results)} of {n} results"
    assert all(r.status == GoalStatus.SUCCEEDED and r.result["calls_done"] == 1 for r in results)


def test_a_query_with_resend_s_is_sent_again_until_answered(transports):
    """`call_service(resend_s=)`: while no answer came the query is sent again (over DDS a new
    client's first answer can be lost: the planner's restart asks `get_goal_states` so); the first
    answer is returned.  A server that holds its first request 1.5 s sees the re-sent ones; without
    resend_s it sees one."""
    import threading

    from timelyllm_ros.ros import interfaces as ifc

    server, client = transports("srv_resend", "drone_rs"), transports("cli_resend")
    seen, lock = [], threading.Lock()

    def states(req):
        with lock:
            seen.append(time.monotonic())
            first = len(seen) == 1
        if first:
            time.sleep(1.5)
        return {"goals": [], "robot_state": f"answer {len(seen)}"}

    server.service("get_goal_states", ifc.GET_GOAL_STATES, states)
    answer = client.call_service("/drone_rs/get_goal_states", ifc.GET_GOAL_STATES, {"request_id": ""},
                                 timeout_s=10, resend_s=0.3)
    assert answer is not None and answer["robot_state"].startswith("answer ")
    assert len(seen) >= 2, seen  # sent again while the first was held
    time.sleep(1.6)  # let the held one finish
    seen.clear()
    once = client.call_service("/drone_rs/get_goal_states", ifc.GET_GOAL_STATES, {"request_id": ""}, timeout_s=10)
    # sent once (its answer may be the lost first one: then None, which is what resend_s is for)
    assert len(seen) == 1 and (once is None or once["robot_state"] == "answer 1"), (seen, once)
