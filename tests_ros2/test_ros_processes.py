"""The ROS graph for real: planner and executor nodes as separate processes
(`timelyllm ros planner|executor --ros-args ...`), this test process as the agent / operator,
everything over Fast DDS (domain and discovery range isolated per session by conftest.py).

One planner (simulated engine, paced to the wall clock) and two executors serve the module;
tests that kill or restart a node start their own."""

from __future__ import annotations

import math
import os
import re
import signal
import time

import pytest

from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.transport.base import GoalStatus
from timelyllm_ros.transport.rclpy_transport import RclpyTransport

from nodeproc import Collector, NodeProcess, retry_once, wait_for

NS = "/timelyllm"
# short watchdog so that a dead executor is noticed within seconds: factor x estimate + margin
PLANNER_ARGS = ["-r", f"__ns:={NS}", "-p", "engine:=simulated", "-p", "status_period_s:=0.2",
                "-p", "goal_timeout_factor:=1.5", "-p", "goal_timeout_margin_s:=2.0", "-p", "server_wait_s:=6.0"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ros_nodes")
    procs = [NodeProcess("planner", PLANNER_ARGS, logs, "planner"),
             # -p time_scale:=1 (an int for a float parameter) used to end in a traceback
             NodeProcess("executor", ["-r", "__ns:=/drone1", "-p", "time_scale:=1"], logs, "drone1"),
             NodeProcess("executor", ["-r", "__ns:=/arm1", "-p", "robot_type:=arm", "-p", "time_scale:=0.2"],
                         logs, "arm1")]
    t = None
    try:
        for p in procs:
            p.serving()
        t = RclpyTransport("test_agent")
        g = Graph(t, procs, logs)
        assert g.client.wait_for_planner(20), "planner not discovered"
        yield g
    finally:
        if t is not None:
            t.close()
        for p in procs:
            p.kill()


class Graph:
    def __init__(self, t: RclpyTransport, procs: list[NodeProcess], logs) -> None:
        self.t, self.procs, self.logs = t, procs, logs
        self.client = RequestClient(t, NS)
        # Every DDS endpoint of this process is made here, before any test starts or kills a node:
        # Fast DDS 2.14 (the PyPI Jazzy wheels) can deadlock creating a writer while a remote
        # participant goes away (eProsima/Fast-DDS#6502; it hung a CI run in the vLLM planner test's
        # RequestClient).  The tests below only use these.
        self.clients = {ns: RequestClient(t, ns) for ns in ("/vllm_planner", "/journaled", "/fleet_b")}
        self.diag, self.planner_status, self.paths = Collector(), Collector(), Collector()
        self.status_a, self.status_b = Collector(), Collector()
        t.subscribe("/diagnostics", ifc.DIAGNOSTIC_ARRAY, self.diag)
        t.subscribe(f"{NS}/planner_status", ifc.PLANNER_STATUS, self.planner_status, qos="latched")
        t.subscribe(f"{NS}/planned_paths", ifc.MARKER_ARRAY, self.paths, qos="latched")
        t.subscribe(f"{NS}/request_status", ifc.REQUEST_STATUS, self.status_a, qos="reliable_deep")
        t.subscribe("/fleet_b/request_status", ifc.REQUEST_STATUS, self.status_b, qos="reliable_deep")
        self._n = 0

    def request(self, robot: str, plan: str, robot_type: str = "tello", **kw) -> str:
        self._n += 1
        rid = kw.pop("request_id", f"{robot}-{self._n}-{time.monotonic_ns()}")
        self.client.submit(plan_request_fields(request_id=rid, robot_id=robot, robot_type=robot_type,
                                               task=kw.pop("task", "a test task"), plan=plan, **kw))
        return rid

    def final(self, rid: str, timeout_s: float = 30.0) -> dict:
        st = self.client.wait_terminal(rid, timeout_s)
        assert st is not None, (rid, self.client.statuses(rid))
        return st


def test_plan_requests_run_to_finished_across_processes(graph):
    a = graph.request("drone1", "mf(50);tc(90);")
    b = graph.request("arm1", "pick('cup');place('bin');", robot_type="arm")
    for rid in (a, b):
        st = graph.final(rid)
        assert st["state"] == "finished", st
        states = [m["state"] for m in graph.client.statuses(rid)]
        assert states[0] == "queued" and "running" in states
        assert st["segments_done"] == st["segments_dispatched"] == 2
    time.sleep(0.3)
    assert sum(m["terminal"] for m in graph.client.statuses(a)) == 1


@pytest.mark.parametrize("change,reason", [
    ({"robot_type": "submarine"}, "unknown robot_type 'submarine'"),
    ({"tuf_alpha": 2.0}, "alpha"),
    ({"tuf_beta": 0.0}, "beta"),
    ({"task": ""}, "missing 'task'"),
    ({"robot_id": ""}, "missing 'robot_id'"),
    ({"request_id": "x" * 300}, "request_id"),
    ({"task": "t" * 5000}, "task"),
    ({"request_id": "bad id with spaces"}, "request_id"),
])
def test_bad_requests_over_dds_are_rejected_with_a_reason(graph, change, reason):
    rid = change.get("request_id") or f"bad-{time.monotonic_ns()}"
    fields = {**plan_request_fields(request_id=rid, robot_id="drone1", robot_type="tello", task="t",
                                    plan="mf(50);"), **change}
    graph.client.submit(fields)
    st = graph.final(rid, 15)
    assert st["state"] == "rejected" and reason in st["reason"], st


def test_duplicate_id_rejected_and_the_planner_keeps_serving(graph):
    rid = graph.request("drone1", "tc(10);")
    assert graph.final(rid)["state"] == "finished"
    graph.client._status[rid] = []  # listen again for the same id
    graph.request("drone1", "tc(10);", request_id=rid)
    st = graph.final(rid, 15)
    assert st["state"] == "rejected" and "duplicate" in st["reason"]
    ok = graph.request("drone1", "tc(20);")
    assert graph.final(ok)["state"] == "finished"  # still serving after all the bad input


def test_unknown_robot_fails_with_a_reason(graph):
    rid = graph.request("drone77", "mf(50);")  # a tello nobody runs an executor for
    st = graph.final(rid, 30)
    assert st["state"] == "failed" and "no executor" in st["reason"], st


def test_cancel_over_dds_gives_one_terminal_status(graph):
    rid = graph.request("drone1", "mf(300);mf(300);mf(300);")
    assert wait_for(lambda: any(m["segments_dispatched"] for m in graph.client.statuses(rid)), 20)
    graph.client.cancel(rid)
    st = graph.final(rid)
    assert st["state"] == "cancelled", st
    time.sleep(1.0)  # the executor's CANCELLED result comes back after the terminal status
    assert [m["state"] for m in graph.client.statuses(rid) if m["terminal"]] == ["cancelled"]


def test_action_goal_feedback_result_and_cancel_across_processes(graph):
    """This process is the action client; the drone1 executor process is the server."""
    ac = graph.t.action_client("/drone1/execute_segment", ifc.EXECUTE_SEGMENT)
    assert wait_for(ac.server_is_ready, 20)
    goal = {"request_id": f"act-{time.monotonic_ns()}", "robot_id": "drone1", "robot_type": "tello",
            "segment_index": 0, "text": "tc(30);mf(20);",
            "calls": [{"name": "turn_cw", "abbr": "tc", "args": ["30"], "arg_types": ["int"]},
                      {"name": "move_forward", "abbr": "mf", "args": ["20"], "arg_types": ["int"]}],
            "est_exec_s": 3.0}
    out, fb = [], []
    ac.send_goal(goal, on_result=out.append, on_feedback=fb.append)
    assert wait_for(lambda: out, 30)
    assert out[0].status == GoalStatus.SUCCEEDED, out[0]
    res = out[0].result
    assert res["success"] and res["calls_done"] == 2 and len(res["call_durations_s"]) == 2
    assert fb and {f["current_call"] for f in fb} >= {"tc(30)"}
    # cancel a long goal once it runs
    long_goal = dict(goal, segment_index=1, text="mf(400);", calls=[goal["calls"][1] | {"args": ["400"]}],
                     est_exec_s=9.0)
    out2, fb2 = [], []
    h = ac.send_goal(long_goal, on_result=out2.append, on_feedback=fb2.append)
    assert wait_for(lambda: fb2, 20)
    h.cancel()
    assert wait_for(lambda: out2, 20)
    assert out2[0].status == GoalStatus.CANCELED and out2[0].result["error_code"] == 4  # CANCELLED


def test_diagnostics_planner_status_and_planned_paths_reach_a_subscriber(graph):
    rid = graph.request("drone1", "mf(100);tc(90);mf(50);")
    assert graph.final(rid)["state"] == "finished"

    def planner_diag(m):
        return {s["name"]: s for s in m["status"]}.get("timelyllm: planner")

    def finished_in(m):  # the periodic topics count the finished request once it has been published
        values = {kv["key"]: kv["value"] for kv in planner_diag(m)["values"]}
        return int(values["state_finished"]) >= 1

    assert wait_for(lambda: any(finished_in(m) for m in graph.diag.snapshot()), 10)
    assert wait_for(lambda: any(m["finished"] >= 1 for m in graph.planner_status.snapshot()), 10)
    diag = graph.diag.snapshot()[-1]
    names = {s["name"]: s for s in diag["status"]}
    planner = names["timelyllm: planner"]
    assert (planner["level"], planner["message"]) == (b"\x00", "serving") or \
        (planner["level"] == b"\x01" and planner["message"].endswith("first segments after their ERT")), planner
    assert wait_for(lambda: any({s["name"]: s for s in m["status"]}.get("timelyllm: executor drone1", {})
                                .get("message") == "action server available" for m in graph.diag.snapshot()), 10)
    ps = graph.planner_status.snapshot()[-1]
    assert ps["finished"] >= 1 and math.isfinite(ps["accrued_utility"])  # < 0 after a late start: TUF decays
    # mf(100), turn 90 deg clockwise, mf(50): 1 m, then 0.5 m at a right angle to the right
    # (the drone's heading at the start depends on the plans before this one).  The latched
    # MarkerArray may arrive after the terminal status: wait for the one with this plan's path.

    def this_plan(m):
        pts = {mk["ns"]: mk for mk in m["markers"]}.get("drone1", {}).get("points", [])
        if len(pts) < 3:
            return False
        start, p1, p2 = pts[-3:]
        v1 = (p1["x"] - start["x"], p1["y"] - start["y"])
        v2 = (p2["x"] - p1["x"], p2["y"] - p1["y"])
        return (math.isclose(math.hypot(*v1), 1.0, abs_tol=1e-6) and math.isclose(math.hypot(*v2), 0.5, abs_tol=1e-6)
                and math.isclose(v1[0] * v2[1] - v1[1] * v2[0], -0.5, abs_tol=1e-6))  # clockwise: cross < 0

    assert wait_for(lambda: any(this_plan(m) for m in graph.paths.snapshot()), 10), graph.paths.snapshot()[-1:]
    marker = {mk["ns"]: mk for mk in graph.paths.snapshot()[-1]["markers"]}["drone1"]
    assert marker["type"] == 4 and marker["header"]["frame_id"] == "map"  # LINE_STRIP


@retry_once
def test_executor_killed_mid_goal_fails_the_request_and_the_planner_keeps_serving(graph):
    ex = NodeProcess("executor", ["-r", "__ns:=/drone5"], graph.logs, "drone5").serving()
    try:
        rid = graph.request("drone5", "mf(100);mf(100);")  # ~3 s per segment at time_scale 1
        assert ex.wait_for_log(f"executing {rid}/0", 20), ex.text()
        ex.kill()  # SIGKILL mid-goal: no result will ever come
        st = graph.final(rid, 30)
        # its heartbeat stops: the executor lease (1 s) fails the goal, not the goal watchdog ("no
        # heartbeat for ..."; on a loaded host DDS may not have delivered its first heartbeat before
        # the kill: "never heard within its first-contact time", the same lease)
        assert st["state"] == "failed" and "executor drone5 lost: " in st["reason"], st
    finally:
        ex.kill()
    ok = graph.request("drone1", "tc(10);")
    assert graph.final(ok)["state"] == "finished"


def test_planner_restarted_on_its_journal_reports_every_accepted_request(graph, tmp_path):
    ns = "/journaled"
    db = tmp_path / "planner.db"
    args = ["-r", f"__ns:={ns}", "-p", f"journal_path:={db}", "-p", "server_wait_s:=6.0"]
    # its own drone: the crashed planner's goals stay queued on the executor (the default policy
    # streams all three statements at once), which must not delay the shared drone1 of later tests
    robot = NodeProcess("executor", ["-r", "__ns:=/drone_j", "-p", "time_scale:=1"], graph.logs, "drone_j").serving()
    planner = NodeProcess("planner", args, graph.logs, "journaled-1").serving()
    client = graph.clients[ns]
    restarted = None
    try:
        assert client.wait_for_planner(20)
        # two that get dispatched (the one cut mid-action fails saying where the robot was left; one
        # none of whose goals reached the robot is resubmitted) and two queued behind an engine kept
        # busy (resubmitted: they finish)
        rids = []
        for i in range(2):
            rid = f"j-run-{i}"
            client.submit(plan_request_fields(request_id=rid, robot_id="drone_j", robot_type="tello", task="t",
                                              plan="mf(300);" * 3))
            rids.append(rid)
        assert wait_for(lambda: all(any(m["segments_dispatched"] for m in client.statuses(r)) for r in rids), 20)
        for i in range(2):
            rid = f"j-later-{i}"
            client.submit(plan_request_fields(request_id=rid, robot_id="arm1", robot_type="arm", task="t",
                                              plan="pick('cup');"))
            rids.append(rid)
        assert wait_for(lambda: all(client.statuses(r) for r in rids), 10)
        accepted = [r for r in rids if client.statuses(r)[0]["state"] != "rejected"]
        assert accepted == rids
        planner.kill()  # SIGKILL: a crash, not a shutdown
        unfinished = [r for r in rids if not any(m["terminal"] for m in client.statuses(r))]
        assert unfinished, "everything finished before the crash; the test needs longer plans"
        restarted = NodeProcess("planner", args, graph.logs, "journaled-2").serving()
        for r in rids:
            st = client.wait_terminal(r, 40)
            assert st is not None and st["state"] in ("finished", "failed"), (r, client.statuses(r))
        failed = [client.wait_terminal(r, 0)["reason"] for r in unfinished
                  if client.wait_terminal(r, 0)["state"] == "failed"]
        assert all("planner restarted" in why for why in failed), failed
        # the restarted planner asked the executor (get_goal_states) where the robot was left; the
        # dead instance's goals had been stopped / aborted by the executor's lease
        # (or that the executor never received them: the crash may come before they were sent)
        assert failed and all("drone_j: " in why and "dispatched statement(s)" in why
                              or "drone_j's executor has no record of them" in why for why in failed), failed
        if any("drone_j: " in why for why in failed):  # the executor had the dead instance's goals
            # and stopped them by supervision: the dead instance's heartbeat stopped ("lost: no
            # heartbeat ..."), or — on a loaded machine, killed before its heartbeat had reached the
            # executor — it was never heard ("lost: never heard within its first-contact time")
            assert wait_for(lambda: re.search(r"drone_j: planner \S+ lost: (no heartbeat|never heard)", robot.text()),
                            5), robot.text()
    finally:
        planner.kill()
        if restarted is not None:
            restarted.kill()
        robot.kill()


def test_two_planners_in_different_namespaces_do_not_cross_talk(graph):
    other = NodeProcess("planner", ["-r", "__ns:=/fleet_b", "-p", "server_wait_s:=6.0"], graph.logs,
                        "fleet_b").serving()
    try:
        b, seen_a, seen_b = graph.clients["/fleet_b"], graph.status_a, graph.status_b
        assert b.wait_for_planner(20)
        rid_b = f"fleet-b-{time.monotonic_ns()}"
        b.submit(plan_request_fields(request_id=rid_b, robot_id="arm1", robot_type="arm", task="t",
                                     plan="pick('cup');"))
        rid_a = graph.request("drone1", "tc(15);")
        assert b.wait_terminal(rid_b, 30)["state"] == "finished"
        assert graph.final(rid_a)["state"] == "finished"
        time.sleep(0.5)
        assert {m["request_id"] for m in seen_b.snapshot()} == {rid_b}  # only its own request
        assert rid_b not in {m["request_id"] for m in seen_a.snapshot()}
    finally:
        other.kill()


# ----------------------------------------------------------------------------- node processes


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_idle_node_exits_cleanly_on_sigint_and_sigterm(tmp_path, sig):
    """close() did not join the spin thread: `terminate called without an active exception`,
    rc 134, on every SIGINT/SIGTERM of an idle executor."""
    p = NodeProcess("executor", ["-r", "__ns:=/drone_sig"], tmp_path, "sig").serving()
    time.sleep(0.5)
    rc = p.stop(sig)
    assert rc == 0, p.text()
    assert "terminate called" not in p.text() and "Traceback" not in p.text()


@pytest.mark.parametrize("args,message", [
    (["-p", "seed:=1.5"], "parameter 'seed' must be an integer, got 1.5"),
    (["-p", "time_scale:=fast"], "parameter 'time_scale' must be a number, got 'fast'"),
    (["-p", "robot_typ:=arm"], "unknown parameters ['robot_typ']"),
    (["-p", "robot_type:=submarine"], "robot_type 'submarine' is not one of"),
])
def test_bad_parameters_end_in_one_line_not_a_traceback(tmp_path, args, message):
    p = NodeProcess("executor", ["-r", "__ns:=/drone_bad", *args], tmp_path, "bad")
    rc = p.proc.wait(60)
    out = p.text()
    assert rc == 2 and message in out, out
    assert "Traceback" not in out and "InvalidParameterTypeException" not in out


@retry_once
def test_request_cli_prints_the_states_to_finished(graph, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "request", "--robot", "drone1",
                          "--robot-type", "tello", "--task", "find the cat", "--plan", "mf(50);tc(90);",
                          "--planner-ns", NS, "--wait", "--timeout", "60"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    states = [m.group(1) for m in re.finditer(r"^\s*\d+\.\d+s\s+\S+\s+(\w+)", out.stdout, re.M)]
    assert states and states[0] == "queued" and states[-1] == "finished" and "running" in states, out.stdout
    assert "plan (2 segments):\n  1. mf(50);\n  2. tc(90);" in out.stdout, out.stdout  # the PlanTask result
    bad = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "request", "--robot", "drone1",
                          "--robot-type", "submarine", "--task", "x", "--planner-ns", NS, "--wait"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "rejected" in bad.stdout and "unknown robot_type" in bad.stdout


@pytest.mark.vllm
@retry_once
def test_vllm_planner_node_plans_over_dds(graph, monkeypatch):
    """`timelyllm ros planner --ros-args -p engine:=vllm`: vLLM(-cpu) with the bundled model
    writes the plan (no reference_plan), its segments run on the drone1 executor process."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")  # as tests/vllm_fixtures.py
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    planner = NodeProcess("planner", ["-r", "__ns:=/vllm_planner", "-p", "engine:=vllm", "-p", "server_wait_s:=6.0"],
                          graph.logs, "vllm_planner")
    try:
        planner.serving(timeout_s=300)
        client = graph.clients["/vllm_planner"]
        assert client.wait_for_planner(30)
        rid = f"vllm-{time.monotonic_ns()}"
        client.submit(plan_request_fields(request_id=rid, robot_id="drone1", robot_type="tello",
                                          task="find the cat", scene="a cat behind the sofa"))
        st = client.wait_terminal(rid, 240)
        assert st is not None, client.statuses(rid)
        states = [m["state"] for m in client.statuses(rid)]
        assert st["state"] == "finished" and states[0] == "queued" and "running" in states, client.statuses(rid)
        assert st["segments_done"] == st["segments_dispatched"] >= 1
        assert graph.procs[1].wait_for_log(f"executing {rid}/0", 10)  # the model's statements ran there
        assert planner.stop(signal.SIGTERM, timeout_s=60) == 0, planner.text()[-2000:]
    finally:
        planner.kill()


def test_a_node_prints_its_thread_stacks_on_sigusr1_and_logs_the_signal_it_stops_on(tmp_path):
    """`kill -USR1 <node>`: every thread's stack goes to the node's stderr and it goes on serving
    (how to see where a node that does not answer stands); the signal that stops it is logged
    before the shutdown transitions, so a shutdown that hangs shows how far it got."""
    node = NodeProcess("executor", ["-r", "__ns:=/usr1_probe"], tmp_path, "usr1_probe").serving(60)
    try:
        node.proc.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: "Current thread" in node.text(), 10), node.text()[-2000:]
        assert "_spin_until_signal" in node.text()  # the main thread's stack, waiting for a signal
        assert node.proc.poll() is None  # still running
        assert node.stop(signal.SIGTERM, timeout_s=30) == 0, node.text()[-2000:]
        assert "SIGTERM received: shutting down" in node.text()
    finally:
        node.kill()
