"""Supervision over DDS, nodes as separate processes (issue 26): a SIGKILLed planner's goals stop
within its lease and are refused afterwards; an executor SIGKILLed mid-goal fails its request
within the executor lease, not after the goal watchdog."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from timelyllm_ros.core.minispec import parse_program
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
from timelyllm_ros.nodes.supervision import GOAL_STATES_SERVICE
from timelyllm_ros.ros import convert as c
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.transport.base import GoalStatus
from timelyllm_ros.transport.rclpy_transport import RclpyTransport

from nodeproc import Collector, NodeProcess, wait_for

SUCCEEDED, CANCELED, ABORTED = 4, 5, 6  # action_msgs/GoalStatus
LEASE_S = 1.0


@pytest.fixture(scope="module")
def t():
    tr = RclpyTransport("test_supervision")
    yield tr
    tr.close()


@pytest.fixture(scope="module")
def ends(t):
    """The request clients, the goal-status subscription and the goal client of the first two
    tests, made at the first one's start, before any node is killed: Fast DDS 2.14 (the PyPI Jazzy wheels) can
    deadlock creating an endpoint while a remote participant goes away (eProsima/Fast-DDS#6502;
    test_ros_processes.py's Graph does the same)."""
    status = Collector()
    t.subscribe("/drone_sa/execute_segment/_action/status", "action_msgs/msg/GoalStatusArray", status,
                qos="latched")
    return SimpleNamespace(clients={ns: RequestClient(t, ns) for ns in ("/sup_a", "/sup_b")}, sup_a_status=status,
                           sup_a_goals=t.action_client("/drone_sa/execute_segment", ifc.EXECUTE_SEGMENT))


def _uuid(s: dict) -> bytes:
    return bytes(s["goal_info"]["goal_id"]["uuid"])


def test_killed_planner_goals_stop_within_the_lease_and_are_refused_later(t, ends, tmp_path):
    ns, robot = "/sup_a", "drone_sa"
    # time_scale 3: each mf(300) runs ~21 s, so the goal running at the kill still runs when the
    # lease runs out even on a slow, loaded machine
    ex = NodeProcess("executor", ["-r", f"__ns:=/{robot}", "-p", "time_scale:=3",
                                  "-p", f"planner_lease_s:={LEASE_S}"], tmp_path, robot).serving()
    planner = NodeProcess("planner", ["-r", f"__ns:={ns}", "-p", "server_wait_s:=6.0"], tmp_path, "planner").serving()
    status = ends.sup_a_status  # (f"/{robot}/execute_segment/_action/status")

    def terminal_at():
        last = {}
        for m in status.snapshot():
            for s in m["status_list"]:
                last[_uuid(s)] = s["status"]
        return last

    try:
        client = ends.clients[ns]
        assert client.wait_for_planner(20)
        rids = [f"sa-{i}-{time.monotonic_ns()}" for i in range(2)]
        for rid in rids:  # ~21 s per mf(300): both plans' goals are running / queued at the kill
            client.submit(plan_request_fields(request_id=rid, robot_id=robot, robot_type="tello", task="t",
                                              plan="mf(300);" * 3))
        # the robot's first goal may be either plan's (the two arrive together; the planner orders them)
        assert ex.wait_for_log("executing sa-", 30), ex.text()
        assert wait_for(lambda: sum(1 for r in rids for m in client.statuses(r) if m["segments_dispatched"]), 10)
        time.sleep(0.5)  # the dispatched goals reach the executor
        at_kill = terminal_at()
        planner.kill()  # SIGKILL: no cancel is ever sent
        assert SUCCEEDED not in at_kill.values(), at_kill  # the test's premise: the kill comes mid-goal

        # (how soon: benchmarks/crash_test.py --ros prints it; tests assert no timings) well before
        # the ~60 s the three 21 s statements would take to run out
        assert wait_for(lambda: terminal_at() and all(v in (SUCCEEDED, CANCELED, ABORTED)
                                                      for v in terminal_at().values()), 10)
        ended = terminal_at()
        time.sleep(2.0)  # nothing of the dead planner succeeds later
        assert terminal_at() == ended
        assert ABORTED in ended.values() and SUCCEEDED not in ended.values(), ended
        out = ex.text()
        assert "lost: no heartbeat" in out and "trigger" not in out, out[-3000:]

        # the executor's own account: the stopped goal, the aborted queued ones, the robot's state
        resp = t.call_service(f"/{robot}/{GOAL_STATES_SERVICE}", ifc.GET_GOAL_STATES, {"request_id": ""}, timeout_s=10,
                              resend_s=1.0)
        assert resp is not None
        states = {(g["request_id"], g["segment_index"]): g for g in resp["goals"]}
        mine = [g for k, g in states.items() if k[0] in rids]
        assert any(g["state"] == "stopped" and "planner" in g["reason"] and "lost" in g["reason"] for g in mine), mine
        assert not any(g["state"] in ("running", "queued") for g in mine), mine
        pid = mine[0]["planner_id"]
        assert pid.startswith(f"{ns}/planner:"), pid

        # a goal that claims the dead instance is refused with the reason
        ac = ends.sup_a_goals  # (f"/{robot}/execute_segment")
        assert wait_for(ac.server_is_ready, 10)
        out2: list = []
        ac.send_goal({"request_id": "late", "robot_id": robot, "robot_type": "tello", "segment_index": 0,
                      "text": "tc(10);", "est_exec_s": 1.0, "planner_id": pid,
                      "calls": [c.skill_call_to_fields(x) for x in
                                parse_program("tc(10);", load_robots()["tello"], check=False)[1]]},
                     on_result=out2.append)
        assert wait_for(lambda: out2, 10)
        assert out2[0].status == GoalStatus.ABORTED and "lost" in out2[0].result["error_message"], out2
        assert out2[0].result["calls_done"] == 0
    finally:
        planner.kill()
        ex.kill()


def test_executor_killed_mid_goal_fails_its_request_within_the_lease(ends, tmp_path):
    ns, robot = "/sup_b", "drone_sb"
    planner = NodeProcess("planner", ["-r", f"__ns:={ns}", "-p", "server_wait_s:=6.0",
                                      "-p", f"executor_lease_s:={LEASE_S}"], tmp_path, "planner_b").serving()
    ex = NodeProcess("executor", ["-r", f"__ns:=/{robot}", "-p", "time_scale:=1"], tmp_path, robot).serving()
    try:
        client = ends.clients[ns]
        assert client.wait_for_planner(20)
        # a reference run: the response time of the same plan on a live executor
        ref = f"sb-ref-{time.monotonic_ns()}"
        client.submit(plan_request_fields(request_id=ref, robot_id=robot, robot_type="tello", task="t",
                                          plan="tc(10);"))
        st_ref = client.wait_terminal(ref, 30)
        assert st_ref is not None and st_ref["state"] == "finished", client.statuses(ref)
        rid = f"sb-{time.monotonic_ns()}"
        client.submit(plan_request_fields(request_id=rid, robot_id=robot, robot_type="tello", task="t",
                                          plan="mf(200);mf(200);"))
        assert ex.wait_for_log(f"executing {rid}/0", 20), ex.text()
        assert wait_for(lambda: any(m["response_time_s"] >= 0 for m in client.statuses(rid)), 10)
        running = client.statuses(rid)
        ex.kill()
        st = client.wait_terminal(rid, 30)
        assert st is not None, client.statuses(rid)
        # the executor lease, not the goal watchdog (how soon: benchmarks/crash_test.py --ros)
        assert st["state"] == "failed" and f"executor {robot} lost" in st["reason"], st
        # the response time is the first segment's start, as before the kill (not the failure time)
        rts = [m["response_time_s"] for m in running if m["response_time_s"] >= 0]
        assert abs(st["response_time_s"] - rts[-1]) < 0.5, (st, running)
    finally:
        ex.kill()
        planner.kill()


def test_plan_task_requests_outlive_a_planner_crash_with_an_answer_each(t, tmp_path):
    """A smaller crash test (benchmarks/crash_test.py --ros is the full one): PlanTask requests in
    flight and one sent while the planner is down; SIGKILL, restart on the journal: every request
    gets one answer, those cut mid-plan say where the robot was left, none is lost."""
    import threading

    from timelyllm_ros.nodes.plan_task import PlannerWatch, request_plan

    ns, robot = "/sup_c", "drone_sc"
    args = ["-r", f"__ns:={ns}", "-p", f"journal_path:={tmp_path / 'j.db'}", "-p", "server_wait_s:=6.0"]
    ex = NodeProcess("executor", ["-r", f"__ns:=/{robot}", "-p", "time_scale:=0.3"], tmp_path, robot).serving()
    planner = NodeProcess("planner", args, tmp_path, "planner_c1").serving()
    restarted = None
    watch = PlannerWatch(t, ns)
    answers: dict = {}

    def ask(rid):
        req = plan_request_fields(request_id=rid, robot_id=robot, robot_type="tello", task="t",
                                  plan="mf(100);tc(90);mf(100);tc(90);")
        answers[rid] = request_plan(t, ns, req, timeout_s=120, discovery_timeout_s=60, watch=watch)

    try:
        threads = [threading.Thread(target=ask, args=(f"sc-{i}",)) for i in range(3)]
        for th in threads:
            th.start()
            time.sleep(0.3)
        assert ex.wait_for_log("executing sc-0/1", 30), ex.text()
        planner.kill()
        late = threading.Thread(target=ask, args=("sc-late",))  # sent while no planner runs
        late.start()
        time.sleep(2.0)
        restarted = NodeProcess("planner", args, tmp_path, "planner_c2").serving()
        for th in threads + [late]:
            th.join(150)
        assert set(answers) == {"sc-0", "sc-1", "sc-2", "sc-late"}
        lost = [r for r, a in answers.items() if a.status is None]
        assert not lost, {r: answers[r].error for r in lost}
        assert answers["sc-late"].status["state"] == "finished", answers["sc-late"].status
        # in flight at the kill: cut mid-action -> failed saying where the robot was left; between
        # two actions -> resumed from the journal and finished (which one depends on where the kill lands)
        outcomes = {r: (a.status["state"], a.status.get("reason", "")) for r, a in answers.items() if r != "sc-late"}
        assert all(state == "finished" or (state == "failed" and f"{robot}: " in reason
                                           and "dispatched statement(s)" in reason)
                   for state, reason in outcomes.values()), outcomes
    finally:
        watch.close()
        planner.kill()
        if restarted is not None:
            restarted.kill()
        ex.kill()


def test_a_restarted_planner_resumes_a_plan_from_its_journal_over_dds(t, tmp_path):
    """Issue 26 item 2 over DDS: a journal left by a planner that died after its plan's first
    segment ran (written by the node's own wiring, in this process); the planner node started on
    it as a process resumes the plan from the journaled token ids: the executor process gets
    segments 1 and 2 (never 0 again) from the new instance and the request ends finished."""
    from timelyllm_ros.core.tuf import NORMAL
    from timelyllm_ros.core.types import PlanRequest, ResultCode, SegmentResult
    from timelyllm_ros.nodes.wiring import build_planner
    from timelyllm_ros.transport.base import QOS_RELIABLE_ALL

    ns, robot, rid = "/sup_r", "drone_sr", "sr-resume"
    path = tmp_path / "j.db"

    class Held:  # the dead planner's dispatcher: its goal "ran" (reported below)
        def __init__(self):
            self.goals = []

        def dispatch(self, goal):
            self.goals.append(goal)

        def cancel(self, request_id):
            pass

    started = build_planner({"journal_path": str(path)})
    clock = started.clock
    held = Held()
    p = started.make_planner(held, [])
    p.submit(PlanRequest(rid, robot, "tello", "patrol", "", NORMAL, clock.now(),
                         reference_plan="mf(50);tc(90);mf(50);"))
    for _ in range(20_000):
        if held.goals:
            break
        p.step()
        clock.advance(0.01)
    assert [g.segment_index for g in held.goals] == [0]
    now = clock.now()
    p.post_result(SegmentResult(rid, 0, ResultCode.OK, now, now + 0.5, (0.5,), 1))
    p._drain_inbox()  # journaled; the planner "dies" here
    started.shutdown()

    status = Collector()
    t.subscribe(f"{ns}/request_status", ifc.REQUEST_STATUS, status, qos=QOS_RELIABLE_ALL)
    ex = NodeProcess("executor", ["-r", f"__ns:=/{robot}", "-p", "time_scale:=0.1"], tmp_path, robot).serving()
    planner = NodeProcess("planner", ["-r", f"__ns:={ns}", "-p", f"journal_path:={path}", "-p", "server_wait_s:=6.0",
                                      "-p", f"executors:={robot}"], tmp_path, "planner_r").serving()
    try:
        assert planner.wait_for_log(f"recovered request {rid} resumed from its journaled token ids", 10), \
            planner.text()
        assert wait_for(lambda: any(m["request_id"] == rid and m["state"] == "finished"
                                    for m in status.snapshot()), 60), (planner.text(), ex.text())
        final = next(m for m in status.snapshot() if m["request_id"] == rid and m["state"] == "finished")
        assert "resumed after a planner restart" in final["reason"]
        log = ex.text()
        assert f"executing {rid}/1: tc(90);" in log and f"executing {rid}/2: mf(50);" in log, log
        assert f"executing {rid}/0" not in log  # what the robot did is not done again
    finally:
        planner.kill()
        ex.kill()
