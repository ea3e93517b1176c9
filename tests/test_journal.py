"""Request journal: durable records, recovery semantics, clear errors for bad files."""

import pytest

from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment
from timelyllm_ros.journal import Journal, JournalError, recover, request_from_body


def gen(rid, state=GenState.QUEUED):
    g = Generation(request=PlanRequest(rid, "d1", "tello", "find the cat", "cat, sofa", NORMAL, 0.0,
                                       task_type="T1", reference_plan="s('cat');tp;"))
    g.state = state
    return g


class FakeClock:
    def now(self):
        return 5.0


class RecordingPlanner:
    """Stands in for the submit() entry of a fresh planner (recover only calls submit)."""

    def __init__(self, accept=True):
        self.clock, self.accept, self.submitted = FakeClock(), accept, []

    def submit(self, req):
        from timelyllm_ros.core.planner import SubmitResult

        self.submitted.append(req)
        return SubmitResult(self.accept, req.request_id, "" if self.accept else "planner full")


def test_records_survive_reopen_and_recovery_is_defined(tmp_path):
    path = tmp_path / "j.db"
    j = Journal(path)
    a, b, c = gen("a"), gen("b"), gen("c")
    for g in (a, b, c):
        j.on_request_update(g)
    seg = Segment(0, "s('cat');", (), True, 5, 0.0, 0.1, 2.8)
    j.on_segment_dispatched(b, seg)
    c.state, c.reason = GenState.FINISHED, "plan executed"
    j.on_request_update(c)
    j.close()  # the process "dies" here

    j2 = Journal(path)
    assert j2.incarnation == 2
    unfinished = {u.request["request_id"]: u for u in j2.unfinished()}
    assert set(unfinished) == {"a", "b"} and unfinished["b"].segments_dispatched == 1
    planner = RecordingPlanner()
    rep = recover(j2, planner)
    assert rep.resubmitted == ["a"]  # nothing dispatched: safe to start over
    assert [r for r, _ in rep.failed] == ["b"] and "robot state unknown" in rep.failed[0][1]
    req = planner.submitted[0]
    assert (req.request_id, req.task, req.reference_plan, req.arrival) == ("a", "find the cat", "s('cat');tp;", 5.0)
    assert dict((r, s) for r, s, _ in j2.rows())["b"] == "failed"


def test_refused_resubmission_fails_with_reason(tmp_path):
    j = Journal(tmp_path / "j.db")
    j.on_request_update(gen("a"))
    rep = recover(j, RecordingPlanner(accept=False))
    assert rep.failed == [("a", "planner restarted; resubmission refused: planner full")]


def test_corrupt_or_unusable_journal_gives_clear_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match="unreadable|corrupt"):
        Journal(bad)
    with pytest.raises(JournalError, match="directory"):
        Journal(tmp_path)


def test_retention_prunes_only_old_terminal_requests(tmp_path):
    t = [1000.0]
    j = Journal(tmp_path / "j.db", retention_s=10, wall=lambda: t[0])
    done, live = gen("done", GenState.FINISHED), gen("live")
    j.on_request_update(done)
    j.on_request_update(live)
    t[0] = 1020.0
    assert j.prune() == 1
    assert [r[0] for r in j.rows()] == ["live"]


def test_body_round_trip():
    g = gen("x")
    from timelyllm_ros.journal import request_body

    assert request_from_body(request_body(g.request), 0.0) == g.request


def test_ros_planner_wiring_recovers_from_its_journal(tmp_path):
    """`journal_path` of the planner node: a request journaled by a crashed planner is resubmitted
    by the next one, which journals what it does."""
    from timelyllm_ros.nodes.wiring import ConfigError, build_planner

    path = tmp_path / "planner.db"
    j = Journal(path)
    j.on_request_update(gen("left-behind"))
    j.close()

    class NullDispatcher:
        def dispatch(self, goal):
            pass

        def cancel(self, request_id):
            pass

    make_planner, clock, cfg, shutdown = build_planner({"journal_path": str(path)})
    planner = make_planner(NullDispatcher(), [])
    try:
        assert "left-behind" in planner.generations  # recovered at start
        assert not planner.generations["left-behind"].state.terminal
    finally:
        shutdown()
    with pytest.raises(ConfigError, match="journal_path"):
        build_planner({"journal_path": str(tmp_path)})  # a directory: clear error at start


def test_journal_path_under_a_file_or_in_a_missing_folder_is_a_one_line_error(tmp_path):
    """Issue 26: a path under a file was a traceback (mkdir's NotADirectoryError); a mistyped
    folder was created silently, and the empty journal in it recovered nothing."""
    from timelyllm_ros.inputs import InputError, check_journal_path

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError) as ei:
        check_journal_path(f / "j.db")
    assert str(ei.value) == f"journal_path '{f / 'j.db'}': '{f}' is a file, not a folder"
    with pytest.raises(JournalError, match="is a file, not a folder"):
        Journal(f / "j.db")
    typo = tmp_path / "jornals" / "j.db"
    with pytest.raises(InputError, match=r"folder '.*jornals' does not exist \(a mistyped path"):
        check_journal_path(typo)
    with pytest.raises(JournalError, match="does not exist"):
        Journal(typo)
    assert not typo.parent.exists()  # nothing created
    j = Journal(typo, create_dir=True)  # explicitly asked for
    assert j.created and typo.exists()
    j.close()
    assert not Journal(typo).created  # reopened: the journal it had
    assert check_journal_path(typo, arg="--journal") == typo
    with pytest.raises(InputError, match="is a directory"):
        check_journal_path(tmp_path)


def test_ros_planner_journal_path_in_a_missing_folder_is_a_one_line_config_error(tmp_path):
    from timelyllm_ros.nodes.wiring import ConfigError, build_planner

    f = tmp_path / "file"
    f.write_text("x")
    for bad, words in ((tmp_path / "jornal" / "j.db", "does not exist"), (f / "j.db", "is a file, not a folder")):
        with pytest.raises(ConfigError, match=words) as ei:
            build_planner({"journal_path": str(bad)})
        assert "\n" not in str(ei.value)
    assert not (tmp_path / "jornal").exists()
def test_recovery_says_where_each_robot_was_left_from_its_executors_account(tmp_path):
    from timelyllm_ros.journal import RobotAccount

    j = Journal(tmp_path / "j.db")
    plans = {"cut": 3, "ran": 2, "open": 2, "unknown": 1, "silent": 1}
    for rid, n in plans.items():
        g = gen(rid)
        if rid == "silent":
            g.request = PlanRequest(rid, "d2", "tello", "t", "", NORMAL, 0.0)
        j.on_request_update(g)
        for i in range(n):
            j.on_segment_dispatched(g, Segment(i, "mf(50);", (), False, 3, 0.0, 0.1, 2.0))
    goals = {("cut", 0): "succeeded", ("cut", 1): "stopped", ("cut", 2): "aborted",
             ("ran", 0): "succeeded", ("ran", 1): "succeeded", ("open", 0): "succeeded", ("open", 1): "running"}
    asked = []

    def goal_states(robot):
        asked.append(robot)
        return RobotAccount("drone hovering (stop sent)", goals) if robot == "d1" else None

    rep = recover(j, RecordingPlanner(), goal_states)
    why = dict(rep.failed)
    assert asked == ["d1", "d2"]  # one question per robot
    assert "d1: drone hovering (stop sent), after 1 of 3 dispatched statement(s): segment 1 stopped" in why["cut"]
    assert "after 2 of 2 dispatched statement(s): all of them ran" in why["ran"]
    assert "segment 1 still running there" in why["open"]
    assert "no record of them" in why["unknown"]
    assert "d2 did not answer get_goal_states: robot state unknown" in why["silent"]
    assert {r for r, s, _ in j.rows() if s == "failed"} == set(plans)


def test_a_journaled_request_id_is_answered_from_the_journal_never_run_twice(tmp_path):
    """After a restart the planner node answers a resent id with its journaled outcome."""
    import threading

    from timelyllm_ros.nodes.planner_node import PlannerNode
    from timelyllm_ros.nodes.wiring import build_planner
    from timelyllm_ros.ros import convert as c
    from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

    path = tmp_path / "planner.db"
    j = Journal(path)
    done = gen("done-before", GenState.FINISHED)
    done.reason = "plan executed"
    j.on_request_update(done)
    j.close()
    make_planner, clock, cfg, shutdown = build_planner({"journal_path": str(path)})
    bus = InProcessBus()
    node = PlannerNode(InProcessTransport(bus, "timelyllm"), make_planner, clock=clock, config=cfg).start()
    client = InProcessTransport(bus)
    got, ev = [], threading.Event()
    client.subscribe("/timelyllm/request_status", c.REQUEST_STATUS, lambda m: (got.append(m), ev.set()))
    try:
        body = {"request_id": "done-before", "robot_id": "d1", "robot_type": "tello", "task": "t",
                "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0, "reference_plan": "mf(50);"}
        client.publish("/timelyllm/plan_requests", c.PLAN_REQUEST, body)
        assert ev.wait(10)
        assert got[0]["state"] == "finished" and got[0]["terminal"] and "journaled outcome" in got[0]["reason"]
        assert node.planner.submitted == 0
    finally:
        node.close()
        client.close()
        shutdown()
