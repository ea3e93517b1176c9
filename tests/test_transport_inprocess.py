"""The in-process transport: rclpy-like semantics for topics, actions and timers."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rosbags")

from timelyllm_ros.ros import cdr  # noqa: E402
from timelyllm_ros.ros import interfaces as ifc  # noqa: E402
from timelyllm_ros.transport.base import GoalStatus, join_name  # noqa: E402
from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport, TransportError  # noqa: E402


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


@pytest.fixture
def bus():
    return InProcessBus()


@pytest.fixture
def nodes(bus):
    made = []

    def make(ns=""):
        t = InProcessTransport(bus, ns)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def status(i):
    return {"request_id": f"r{i}", "state": "queued"}


def test_join_name():
    assert join_name("drone1", "execute_segment") == "/drone1/execute_segment"
    assert join_name("/drone1/", "execute_segment") == "/drone1/execute_segment"
    assert join_name("", "plan_requests") == "/plan_requests"
    assert join_name("drone1", "/abs") == "/abs"


def test_publish_subscribe_in_order_and_only_to_the_topic(nodes):
    a, b = nodes(), nodes("ns")
    got, other = [], []
    a.subscribe("/request_status", ifc.REQUEST_STATUS, got.append)
    a.subscribe("/elsewhere", ifc.REQUEST_STATUS, other.append)
    pub = b.publisher("/request_status", ifc.REQUEST_STATUS)
    for i in range(50):
        pub.publish(status(i))
    assert wait_for(lambda: len(got) == 50)
    assert [m["request_id"] for m in got] == [f"r{i}" for i in range(50)]
    assert got[0]["robot_id"] == "" and got[0]["terminal"] is False  # defaults filled like ROS
    assert other == []


def test_relative_topics_resolve_in_the_namespace(nodes):
    a, b = nodes("drone1"), nodes()
    got = []
    b.subscribe("/drone1/request_status", ifc.REQUEST_STATUS, got.append)
    a.publish("request_status", ifc.REQUEST_STATUS, status(1))
    assert wait_for(lambda: len(got) == 1)


def test_subscribers_do_not_share_messages(nodes):
    a = nodes()
    seen1, seen2 = [], []

    def mutate(m):
        m["request_id"] = "changed"
        seen1.append(m)

    a.subscribe("/s", ifc.REQUEST_STATUS, mutate)
    a.subscribe("/s", ifc.REQUEST_STATUS, seen2.append)
    sent = status(7)
    a.publish("/s", ifc.REQUEST_STATUS, sent)
    assert wait_for(lambda: seen1 and seen2)
    assert seen2[0]["request_id"] == "r7" and sent["request_id"] == "r7"


def test_wire_check_rejects_what_ros_would(nodes):
    a = nodes()
    with pytest.raises(TransportError, match=r"RequestStatus has no field\(s\) \[.request.\]"):
        a.publish("/s", ifc.REQUEST_STATUS, {"request": "x"})
    with pytest.raises(TransportError):
        a.publish("/s", ifc.REQUEST_STATUS, {"segments_done": "three"})
    with pytest.raises(TransportError, match="carries"):
        a.publish("/s", ifc.PLANNER_STATUS, {})
    with pytest.raises(TransportError, match="unknown message type"):
        a.publish("/t", "timelyllm/msg/Nope", {})


def test_latched_topic_reaches_late_subscriber(nodes):
    a, b = nodes(), nodes()
    a.publish("/planner_status", ifc.PLANNER_STATUS, {"queued": 4}, qos="latched")
    got = []
    b.subscribe("/planner_status", ifc.PLANNER_STATUS, got.append, qos="latched")
    assert wait_for(lambda: got) and got[0]["queued"] == 4


def test_slow_subscriber_does_not_block_others(nodes):
    a = nodes()
    gate = threading.Event()
    fast = []
    a.subscribe("/s", ifc.REQUEST_STATUS, lambda m: gate.wait(5))
    a.subscribe("/s", ifc.REQUEST_STATUS, fast.append)
    for i in range(3):
        a.publish("/s", ifc.REQUEST_STATUS, status(i))
    assert wait_for(lambda: len(fast) == 3, 2)
    gate.set()


def test_callback_exception_does_not_stop_delivery(nodes):
    a = nodes()
    got = []

    def cb(m):
        if m["request_id"] == "r0":
            raise RuntimeError("boom")
        got.append(m)

    a.subscribe("/s", ifc.REQUEST_STATUS, cb)
    a.publish("/s", ifc.REQUEST_STATUS, status(0))
    a.publish("/s", ifc.REQUEST_STATUS, status(1))
    assert wait_for(lambda: len(got) == 1)


def test_closed_subscription_gets_nothing(nodes):
    a = nodes()
    got = []
    h = a.subscribe("/s", ifc.REQUEST_STATUS, got.append)
    h.close()
    a.publish("/s", ifc.REQUEST_STATUS, status(0))
    time.sleep(0.1)
    assert got == []


GOAL = {"request_id": "r1", "robot_id": "drone1", "robot_type": "tello", "segment_index": 0,
        "text": "mf(50);", "calls": [{"name": "move_forward", "abbr": "mf", "args": ["50"], "arg_types": ["int"]}],
        "est_exec_s": 1.0, "blocking": False}


class Outcomes:
    def __init__(self):
        self.results, self.feedback, self.accepted = [], [], []
        self.done = threading.Event()

    def on_result(self, o):
        self.results.append(o)
        self.done.set()


def test_action_success_with_feedback(nodes):
    server, client = nodes("drone1"), nodes()

    def execute(h):
        assert h.request["text"] == "mf(50);"
        for i in range(3):
            h.publish_feedback({"calls_done": i, "current_call": "mf(50)", "elapsed_s": 0.1 * i})
        h.succeed()
        return {"success": True, "calls_done": 1, "call_durations_s": [0.5], "value": "", "value_type": "none"}

    server.action_server("execute_segment", ifc.EXECUTE_SEGMENT, execute)
    ac = client.action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT)
    assert ac.server_is_ready()
    o = Outcomes()
    ac.send_goal(GOAL, on_result=o.on_result, on_feedback=o.feedback.append, on_accepted=o.accepted.append)
    assert o.done.wait(5)
    (res,) = o.results
    assert res.status == GoalStatus.SUCCEEDED and res.result["call_durations_s"] == [0.5]
    assert [f["calls_done"] for f in o.feedback] == [0, 1, 2]  # feedback arrives before the result
    assert o.accepted == [True]


def test_no_server_and_rejected_goals_still_get_one_result(nodes):
    a = nodes()
    ac = a.action_client("/nobody/execute_segment", ifc.EXECUTE_SEGMENT)
    assert not ac.server_is_ready()
    o = Outcomes()
    ac.send_goal(GOAL, on_result=o.on_result)
    assert o.done.wait(2) and o.results[0].status == GoalStatus.REJECTED and "no action server" in o.results[0].error
    a.action_server("/picky", ifc.EXECUTE_SEGMENT, lambda h: {}, goal_callback=lambda req: req["segment_index"] > 0)
    o2 = Outcomes()
    a.action_client("/picky", ifc.EXECUTE_SEGMENT).send_goal(GOAL, on_result=o2.on_result,
                                                          on_accepted=o2.accepted.append)
    assert o2.done.wait(2) and o2.results[0].status == GoalStatus.REJECTED and o2.accepted == [False]


def test_cancel_while_executing(nodes):
    a = nodes()
    started = threading.Event()

    def execute(h):
        started.set()
        while not h.is_cancel_requested:
            time.sleep(0.005)
        h.canceled()
        return {"error_code": 4, "error_message": "cancelled"}

    a.action_server("/x", ifc.EXECUTE_SEGMENT, execute)
    o = Outcomes()
    g = a.action_client("/x", ifc.EXECUTE_SEGMENT).send_goal(GOAL, on_result=o.on_result)
    assert started.wait(2)
    g.cancel()
    assert o.done.wait(2)
    assert o.results[0].status == GoalStatus.CANCELED and o.results[0].result["error_code"] == 4


def test_rcl_state_machine_rules(nodes):
    a = nodes()
    errors = []

    def no_terminal(h):
        return {"success": True}

    def bad_cancel(h):
        try:
            h.canceled()  # not allowed: nobody asked to cancel
        except RuntimeError as e:
            errors.append(str(e))
        h.abort()
        try:
            h.succeed()  # not allowed: already terminal
        except RuntimeError as e:
            errors.append(str(e))
        return {}

    def raises(h):
        raise ValueError("backend bug")

    def bad_result(h):
        h.succeed()
        return {"success": "very"}

    for name, fn in (("/a", no_terminal), ("/b", bad_cancel), ("/c", raises), ("/d", bad_result)):
        a.action_server(name, ifc.EXECUTE_SEGMENT, fn)
    outs = {}
    for name in ("/a", "/b", "/c", "/d"):
        o = Outcomes()
        a.action_client(name, ifc.EXECUTE_SEGMENT).send_goal(GOAL, on_result=o.on_result)
        assert o.done.wait(2)
        outs[name] = o.results[0]
    assert outs["/a"].status == GoalStatus.ABORTED and "without a terminal state" in outs["/a"].error
    assert outs["/b"].status == GoalStatus.ABORTED and len(errors) == 2
    assert outs["/c"].status == GoalStatus.ABORTED and "backend bug" in outs["/c"].error
    assert outs["/c"].result["success"] is False  # an empty Result, as rclpy sends
    # a result that does not fit the message: rclpy sends an empty Result with the state the
    # callback set (here succeeded); the client can tell from success=False / the error
    assert outs["/d"].status == GoalStatus.SUCCEEDED and "field 'success' must be a bool" in outs["/d"].error
    assert outs["/d"].result == cdr.cdr_roundtrip(ifc.EXECUTE_SEGMENT_RESULT, {})


def test_cancel_rejected_by_server_lets_goal_finish(nodes):
    a = nodes()
    release = threading.Event()

    def execute(h):
        release.wait(2)
        h.succeed() if not h.is_cancel_requested else h.canceled()
        return {"success": True}

    a.action_server("/x", ifc.EXECUTE_SEGMENT, execute, cancel_callback=lambda h: False)
    o = Outcomes()
    g = a.action_client("/x", ifc.EXECUTE_SEGMENT).send_goal(GOAL, on_result=o.on_result)
    time.sleep(0.05)
    g.cancel()
    release.set()
    assert o.done.wait(2) and o.results[0].status == GoalStatus.SUCCEEDED


def test_goals_execute_concurrently(nodes):
    """MultiThreadedExecutor + ReentrantCallbackGroup semantics: one slow goal does not hold
    the server."""
    a = nodes()
    gate = threading.Event()

    def execute(h):
        if h.request["segment_index"] == 0:
            gate.wait(5)
        else:
            gate.set()
        h.succeed()
        return {"success": True}

    a.action_server("/x", ifc.EXECUTE_SEGMENT, execute)
    ac = a.action_client("/x", ifc.EXECUTE_SEGMENT)
    o0, o1 = Outcomes(), Outcomes()
    ac.send_goal(GOAL, on_result=o0.on_result)
    ac.send_goal(dict(GOAL, segment_index=1), on_result=o1.on_result)
    assert o1.done.wait(2) and o0.done.wait(2)


def test_duplicate_server_and_malformed_goal(nodes):
    a = nodes()
    a.action_server("/x", ifc.EXECUTE_SEGMENT, lambda h: {})
    with pytest.raises(TransportError, match="already exists"):
        a.action_server("/x", ifc.EXECUTE_SEGMENT, lambda h: {})
    with pytest.raises(TransportError):
        a.action_client("/x", ifc.EXECUTE_SEGMENT).send_goal({"segment_index": "zero"}, on_result=print)


def test_timer_ticks_and_stops(nodes):
    a = nodes()
    ticks = []
    h = a.timer(0.01, lambda: ticks.append(time.monotonic()))
    assert wait_for(lambda: len(ticks) >= 3, 2)
    h.close()
    n = len(ticks)
    time.sleep(0.05)
    assert len(ticks) <= n + 1
    with pytest.raises(TransportError):
        a.timer(0, lambda: None)
