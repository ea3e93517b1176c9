"""The planner's plan_task action over DDS (planner and executor as separate processes):
accepted goals get feedback and end with the terminal status and the plan; refused requests end
at once with the reason; cancel; a resent id is one request (idempotent); a burst over the
plan_requests topic is answered in full (smaller than benchmarks/burst.py --ros)."""

from __future__ import annotations

import threading
import time

import pytest

from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
from timelyllm_ros.nodes.plan_task import request_plan
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.transport.base import GoalStatus
from timelyllm_ros.transport.rclpy_transport import RclpyTransport

from nodeproc import NodeProcess, wait_for

NS = "/pt"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    logs = tmp_path_factory.mktemp("plan_task")
    procs = [NodeProcess("planner", ["-r", f"__ns:={NS}", "-p", "server_wait_s:=6.0"], logs, "planner"),
             NodeProcess("executor", ["-r", "__ns:=/drone_pt", "-p", "time_scale:=0.2"], logs, "drone_pt")]
    t = None
    try:
        for p in procs:
            p.serving()
        t = RclpyTransport("test_plan_task")
        ac = t.action_client(f"{NS}/plan_task", ifc.PLAN_TASK)
        assert wait_for(ac.server_is_ready, 20)
        yield t, ac, procs
    finally:
        if t is not None:
            t.close()
        for p in procs:
            p.kill()


def _goal(rid, plan="mf(50);tc(90);", **kw):
    return {"request": plan_request_fields(request_id=rid, robot_id="drone_pt", robot_type="tello", task="t",
                                           plan=plan, **kw)}


def _send(ac, goal):
    out, fb, done = [], [], threading.Event()
    h = ac.send_goal(goal, on_result=lambda o: (out.append(o), done.set()), on_feedback=fb.append)
    return h, out, fb, done


def test_accepted_goal_feedback_result_and_plan(graph):
    t, ac, _ = graph
    rid = f"pt-ok-{time.monotonic_ns()}"
    _, out, fb, done = _send(ac, _goal(rid))
    assert done.wait(60), fb
    o = out[0]
    assert o.status == GoalStatus.SUCCEEDED, o
    assert o.result["status"]["state"] == "finished" and o.result["status"]["request_id"] == rid
    assert o.result["segments"] == ["mf(50);", "tc(90);"]
    states = [f["status"]["state"] for f in fb]
    assert states[0] == "queued" and "running" in states and all(not f["status"]["terminal"] for f in fb), states


def test_refused_request_ends_at_once_with_the_reason(graph):
    t, ac, _ = graph
    rid = f"pt-bad-{time.monotonic_ns()}"
    goal = _goal(rid)
    goal["request"]["robot_type"] = "submarine"
    _, out, _, done = _send(ac, goal)
    assert done.wait(30)
    assert out[0].status == GoalStatus.ABORTED
    st = out[0].result["status"]
    assert st["state"] == "rejected" and "unknown robot_type 'submarine'" in st["reason"], st
    _, out2, _, done2 = _send(ac, {"request": {"request_id": ""}})
    assert done2.wait(30) and out2[0].status == GoalStatus.ABORTED
    assert "missing 'request_id'" in out2[0].result["status"]["reason"]


def test_cancel_ends_the_goal_cancelled(graph):
    t, ac, _ = graph
    rid = f"pt-cancel-{time.monotonic_ns()}"
    h, out, fb, done = _send(ac, _goal(rid, plan="mf(300);mf(300);mf(300);"))
    assert wait_for(lambda: any(f["status"]["segments_dispatched"] for f in fb), 30), fb
    h.cancel()
    assert done.wait(30)
    assert out[0].status == GoalStatus.CANCELED and out[0].result["status"]["state"] == "cancelled", out[0]


def test_a_resent_id_is_one_request_and_both_goals_get_its_answer(graph):
    t, ac, procs = graph
    rid = f"pt-twice-{time.monotonic_ns()}"
    _, out1, _, d1 = _send(ac, _goal(rid, plan="tc(30);"))
    _, out2, _, d2 = _send(ac, _goal(rid, plan="tc(30);"))
    assert d1.wait(60) and d2.wait(60)
    assert out1[0].status == out2[0].status == GoalStatus.SUCCEEDED, (out1, out2)
    assert out1[0].result["segments"] == out2[0].result["segments"] == ["tc(30);"]
    _, out3, _, d3 = _send(ac, _goal(rid, plan="tc(30);"))  # after the end: the same answer at once
    assert d3.wait(30) and out3[0].result["status"]["state"] == "finished"
    assert procs[1].text().count(f"executing {rid}/0") == 1  # one plan ran


def test_request_plan_client_follows_to_the_end(graph):
    t, _, _ = graph
    seen = []
    rid = f"pt-client-{time.monotonic_ns()}"
    ans = request_plan(t, NS, _goal(rid)["request"], timeout_s=60, discovery_timeout_s=20, on_status=seen.append)
    assert ans.status is not None and ans.status["state"] == "finished" and ans.sends == 1, ans.error
    assert ans.segments == ["mf(50);", "tc(90);"] and seen[0]["state"] == "queued"


def test_a_burst_on_the_topic_is_answered_in_full(graph):
    """1,200 requests from 40 agents as fast as they can be published (more than the 1,000 a
    keep-last history held): each gets a status (queued, or rejected with the reason), none is
    dropped (keep-all request topic and status reader)."""
    t, _, _ = graph
    client = RequestClient(t, NS)
    assert client.wait_for_planner(20)
    rids = []
    tag = time.monotonic_ns()
    for i in range(1200):
        rid = f"burst-{tag}-{i}"
        client.submit(plan_request_fields(request_id=rid, robot_id=f"agent{i % 40}", robot_type="chat",
                                          task="say hi", plan="Hello there."))
        rids.append(rid)
    assert wait_for(lambda: all(client.statuses(r) for r in rids), 120), \
        sum(1 for r in rids if not client.statuses(r))
    first = [client.statuses(r)[0] for r in rids]
    assert all(m["state"] in ("queued", "rejected") for m in first)
    assert all(m["reason"] for m in first if m["state"] == "rejected")
