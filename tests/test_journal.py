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
    from timelyllm_ros.nodes.params import ConfigError
    from timelyllm_ros.nodes.wiring import build_planner

    path = tmp_path / "planner.db"
    j = Journal(path)
    j.on_request_update(gen("left-behind"))
    j.close()

    class NullDispatcher:
        def dispatch(self, goal):
            pass

        def cancel(self, request_id):
            pass

    started = build_planner({"journal_path": str(path)})
    planner = started.make_planner(NullDispatcher(), [])
    try:
        assert "left-behind" in planner.generations  # recovered at start
        assert not planner.generations["left-behind"].state.terminal
    finally:
        started.shutdown()
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
    from timelyllm_ros.nodes.params import ConfigError
    from timelyllm_ros.nodes.wiring import build_planner

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
    assert sorted(asked) == ["d1", "d2"]  # one question per robot (asked at once: any order)
    assert "d1: drone hovering (stop sent), after 1 of 3 dispatched statement(s): segment 1 stopped" in why["cut"]
    assert "after 2 of 2 dispatched statement(s): all of them ran" in why["ran"]
    assert "segment 1 still running there" in why["open"]
    assert "no record of them" in why["unknown"]
    assert "d2 did not answer get_goal_states: robot state unknown" in why["silent"]
    assert {r for r, s, _ in j.rows() if s == "failed"} == set(plans)


def test_recovery_asks_every_robot_at_once(tmp_path):
    """A restarted planner asks each robot's executor where it was left; a robot whose executor
    is gone costs the query's timeout (10 s over DDS): the robots are asked at once, not one
    timeout after another. Each question here waits until the other robot was asked too."""
    import threading

    from timelyllm_ros.journal import RobotAccount

    j = Journal(tmp_path / "j.db")
    for rid, robot in (("a", "d1"), ("b", "d2"), ("c", "d2")):
        g = gen(rid)
        g.request = PlanRequest(rid, robot, "tello", "t", "", NORMAL, 0.0)
        j.on_request_update(g)
        j.on_segment_dispatched(g, Segment(0, "mf(50);", (), False, 3, 0.0, 0.1, 2.0))
    both = threading.Barrier(2, timeout=20)
    asked = []

    def goal_states(robot):
        asked.append(robot)
        both.wait()  # breaks (and fails the test) if the other robot is only asked after this one
        return RobotAccount("hovering", {("a", 0): "stopped", ("b", 0): "stopped", ("c", 0): "stopped"})

    rep = recover(j, RecordingPlanner(), goal_states)
    assert sorted(asked) == ["d1", "d2"]
    assert {rid for rid, _ in rep.failed} == {"a", "b", "c"}
    assert all("hovering" in why and "segment 0 stopped" in why for _, why in rep.failed), rep.failed


def test_a_journaled_request_id_is_answered_from_the_journal_never_run_twice(tmp_path):
    """After a restart the planner node answers a resent id with its journaled outcome."""
    import threading

    from timelyllm_ros.nodes.planner_node import PlannerNode
    from timelyllm_ros.nodes.wiring import build_planner
    from timelyllm_ros.ros import convert as c
    from timelyllm_ros.ros import interfaces as ifc
    from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

    path = tmp_path / "planner.db"
    j = Journal(path)
    done = gen("done-before", GenState.FINISHED)
    done.reason = "plan executed"
    j.on_request_update(done)
    j.close()
    started = build_planner({"journal_path": str(path)})
    bus = InProcessBus()
    node = PlannerNode(InProcessTransport(bus, "timelyllm"), started.make_planner, clock=started.clock,
                       config=started.node_config).start()
    client = InProcessTransport(bus)
    got, ev = [], threading.Event()
    client.subscribe("/timelyllm/request_status", ifc.REQUEST_STATUS, lambda m: (got.append(m), ev.set()))
    try:
        body = {"request_id": "done-before", "robot_id": "d1", "robot_type": "tello", "task": "t",
                "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0, "reference_plan": "mf(50);"}
        client.publish("/timelyllm/plan_requests", ifc.PLAN_REQUEST, body)
        assert ev.wait(10)
        assert got[0]["state"] == "finished" and got[0]["terminal"] and "journaled outcome" in got[0]["reason"]
        assert node.planner.submitted == 0
    finally:
        node.close()
        client.close()
        started.shutdown()


# ------------------------------------------------------------------ resume after a restart (issue 26)

def _planner(journal, clock=None):
    """A planner on a fresh simulated engine (a restarted process: nothing of the old one) whose
    engine records every add, with the journal as its listener."""
    from timelyllm_ros.core.clock import VirtualClock
    from timelyllm_ros.core.exec_time import ExecTimeEstimator
    from timelyllm_ros.core.planner import Planner
    from timelyllm_ros.core.policies import make_policy
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.engines.simulated import SimulatedEngine
    from timelyllm_ros.sim.prompts import SimPromptSource

    class Engine(SimulatedEngine):
        def add(self, gen_id, prompt_ids, max_tokens, priority=0):
            self.adds.append((gen_id, list(prompt_ids)))
            return super().add(gen_id, prompt_ids, max_tokens, priority)

    from test_planner import RecordingDispatcher as Dispatcher

    robots = load_robots()
    clock = clock or VirtualClock()
    engine = Engine(clock)
    engine.adds = []
    disp = Dispatcher()
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=robots, policy=make_policy("timelyllm"),
                      estimator=ExecTimeEstimator(robots), prompts=SimPromptSource(engine, robots=robots),
                      listeners=[journal])
    return planner, engine, disp


def _succeed(planner, goal, dur=0.5, value=None):
    from timelyllm_ros.core.types import ResultCode, SegmentResult

    t = planner.clock.now()
    planner.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, t, t + dur,
                                      (dur,) * len(goal.calls), len(goal.calls), value))


def _until(planner, cond, limit=20_000):
    for _ in range(limit):
        if cond():
            return
        planner.step()
        planner.clock.advance(0.01)
    raise AssertionError("condition not reached")


def _crash_after_first_segment(path, plan="mf(100);tc(90);mf(50);"):
    """A planner dispatches the plan's first segment, which succeeds (journaled), then dies
    before dispatching the second."""
    t = [1000.0]
    j = Journal(path, wall=lambda: t[0])
    p1, e1, d1 = _planner(j)
    p1.submit(PlanRequest("r1", "d1", "tello", "patrol", "", NORMAL, p1.clock.now(), reference_plan=plan))
    _until(p1, lambda: d1.goals)
    assert [g.segment_index for g in d1.goals] == [0]
    _succeed(p1, d1.goals[0])
    p1._drain_inbox()  # the result is journaled; the planner dies before its next step
    g1 = p1.generations["r1"]
    assert g1.segments[0].ok and not g1.state.terminal
    old_ids = list(g1.prompt_ids) + list(g1.output_ids[:g1.segments[0].out_len])
    j.close()
    t[0] += 30.0  # down for 30 s
    return old_ids, t


def test_a_plan_whose_dispatched_segments_all_ran_resumes_from_its_journaled_token_ids(tmp_path):
    """Issue 26 item 2: restarted on its journal, the planner goes on generating the plan from
    its token ids (the engine gets the old prompt + output ids as its prompt), dispatches the next
    segments numbered after the old ones, and the plan FINISHES with every segment; its arrival
    is kept, so the 30 s the planner was down count in its utility."""
    from timelyllm_ros.core.metrics import plan_terms

    path = tmp_path / "j.db"
    old_ids, t = _crash_after_first_segment(path)
    j = Journal(path, wall=lambda: t[0])
    p2, e2, d2 = _planner(j)
    rep = recover(j, p2)
    assert rep.resumed == ["r1"] and rep.failed == [] and rep.resubmitted == []
    g = p2.generations["r1"]
    assert g.recovered and [s.index for s in g.segments] == [0] and g.segments[0].ok
    assert g.request.arrival == pytest.approx(p2.clock.now() - 30.0)
    _until(p2, lambda: d2.goals)
    first_add = next(ids for gid, ids in e2.adds if gid == "r1")
    assert first_add == old_ids  # generation goes on from the journaled token ids
    while not g.state.terminal:
        _until(p2, lambda: len(d2.goals) > sum(1 for s in g.segments if s.ok) - 1 or g.state.terminal)
        for goal in d2.goals:
            if g.segments[goal.segment_index].ok is None:
                _succeed(p2, goal)
        p2.step()
        p2.clock.advance(0.01)
    assert g.state is GenState.FINISHED and "resumed after a planner restart" in g.reason
    assert [s.text for s in g.segments] == ["mf(100);", "tc(90);", "mf(50);"]
    assert [goal.segment_index for goal in d2.goals] == [1, 2]  # segment 0 is never flown again
    # the 30 s down (less the half second segment 0 still ran) are segment 1's wait: they count
    assert plan_terms(g).continuation_waits_s[0] == pytest.approx(29.5, abs=0.1)
    assert dict((r, s) for r, s, _ in j.rows())["r1"] == "finished"
    j.close()


def test_a_plan_whose_last_segment_ran_after_the_crash_resumes_from_the_executors_account(tmp_path):
    """The result never reached the journal (the planner died first): the executor's goal record
    says it succeeded, so the plan resumes; without an account it fails saying the state is unknown."""
    from timelyllm_ros.journal import RobotAccount

    path = tmp_path / "j.db"
    t = [1000.0]
    j = Journal(path, wall=lambda: t[0])
    p1, _e1, d1 = _planner(j)
    p1.submit(PlanRequest("r1", "d1", "tello", "patrol", "", NORMAL, 0.0, reference_plan="mf(100);tc(90);"))
    _until(p1, lambda: d1.goals)
    j.close()  # dies with segment 0 running
    j = Journal(path, wall=lambda: t[0])
    p2, _e2, d2 = _planner(j)
    rep = recover(j, p2, lambda robot: RobotAccount("drone hovering", {("r1", 0): "succeeded"}))
    assert rep.resumed == ["r1"]
    _until(p2, lambda: d2.goals)
    assert [goal.segment_index for goal in d2.goals] == [1] and d2.goals[0].text == "tc(90);"
    j.close()


def test_a_blocking_result_the_executor_kept_lets_the_plan_resume(tmp_path):
    """The planner died while its blocking `s('cat')` ran: the result never reached the journal.
    The executor's goal record (GoalState value) gives it, so the plan resumes under the robot's
    real answer; without the value the plan cannot continue (nothing to condition on) and fails."""
    from timelyllm_ros.journal import RobotAccount

    for values, resumed in (({("r1", 0): True}, True), ({}, False)):
        path = tmp_path / f"j{int(resumed)}.db"
        t = [1000.0]
        j = Journal(path, wall=lambda: t[0])
        p1, _e1, d1 = _planner(j)
        p1.submit(PlanRequest("r1", "d1", "tello", "find the cat", "", NORMAL, 0.0,
                              reference_plan="s('cat');g('cat');tp;"))
        _until(p1, lambda: d1.goals)
        assert d1.goals[0].blocking and d1.goals[0].text == "s('cat');"
        j.close()  # dies while s('cat') runs
        j = Journal(path, wall=lambda: t[0])
        p2, _e2, d2 = _planner(j)
        rep = recover(j, p2, lambda robot: RobotAccount("drone hovering", {("r1", 0): "succeeded"}, values))
        if resumed:
            assert rep.resumed == ["r1"]
            _until(p2, lambda: d2.goals)
            assert [goal.segment_index for goal in d2.goals] == [1] and d2.goals[0].text == "g('cat');"
            assert p2.generations["r1"].segments[0].result is True
            assert j.segment_rows("r1")[0].value is True  # journaled now: a second crash keeps it
        else:
            assert rep.resumed == [] and "r1" not in p2.generations, rep
        j.close()


def test_a_resumed_plan_is_refused_when_its_prompt_changed(tmp_path):
    path = tmp_path / "j.db"
    _old, t = _crash_after_first_segment(path)
    j = Journal(path, wall=lambda: t[0])
    with j._lock:
        j._db.execute("UPDATE tokens SET prompt_digest='0' WHERE request_id='r1'")
    p2, _e2, d2 = _planner(j)
    rep = recover(j, p2)
    assert rep.resumed == [] and "r1" not in p2.generations
    assert "after 1 of 1 dispatched statement(s): all of them ran; plan not resumed: its prompt is not" in \
        rep.failed[0][1]
    j.close()


def test_a_schema_1_journal_is_migrated(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(str(path))
    db.executescript("""CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE segments (request_id TEXT NOT NULL, idx INTEGER NOT NULL, text TEXT NOT NULL,
      dispatched INTEGER NOT NULL DEFAULT 1, ok INTEGER, error TEXT NOT NULL DEFAULT '', value TEXT,
      PRIMARY KEY (request_id, idx));
    INSERT INTO meta VALUES ('schema', '1');""")
    db.commit()
    db.close()
    j = Journal(path)
    g = gen("a")
    j.on_request_update(g)
    j.on_segment_dispatched(g, Segment(0, "mf(50);", (), False, 3, 0.0, 0.1, 2.0, dispatched_at=1.0))
    assert j.segment_rows("a")[0].dispatched_at == 1.0
    j.close()


def _finish(planner, disp, g):
    """Let every goal the planner dispatches succeed until g ends."""
    done = set()
    for _ in range(20_000):
        if g.state.terminal:
            return
        for goal in disp.goals:
            if (goal.request_id, goal.segment_index) not in done:
                done.add((goal.request_id, goal.segment_index))
                _succeed(planner, goal)
        planner.step()
        planner.clock.advance(0.01)
    raise AssertionError("plan did not end")


def test_a_plan_whose_later_goals_were_never_sent_resumes_after_the_last_that_ran(tmp_path):
    """Segments dispatched ahead wait in the executor's queue; a lost planner's queued goals are
    aborted with nothing sent ("refused" in the executor's record).  The plan resumes after the
    last segment that ran, from the token ids journaled at its end: the never-sent segments are
    generated and flown anew, under the same indices; nothing the robot did is redone."""
    from timelyllm_ros.journal import RobotAccount

    path = tmp_path / "j.db"
    t = [1000.0]
    j = Journal(path, wall=lambda: t[0])
    p1, _e1, d1 = _planner(j)
    p1.submit(PlanRequest("r1", "d1", "tello", "patrol", "", NORMAL, 0.0,
                          reference_plan="mf(100);tc(90);mf(50);"))
    _until(p1, lambda: len(d1.goals) == 3)  # the whole plan dispatched, queued on the robot
    g1 = p1.generations["r1"]
    old_ids = list(g1.prompt_ids) + list(g1.output_ids[:g1.segments[0].out_len])
    assert len(old_ids) < len(g1.prompt_ids) + len(g1.output_ids)
    j.close()  # dies: segment 0 then ran to its end (within the lease), 1 and 2 were aborted unsent
    t[0] += 5.0
    j = Journal(path, wall=lambda: t[0])
    p2, e2, d2 = _planner(j)
    account = RobotAccount("idle", {("r1", 0): "succeeded", ("r1", 1): "refused", ("r1", 2): "refused"})
    rep = recover(j, p2, lambda robot: account)
    assert rep.resumed == ["r1"] and not rep.failed
    g = p2.generations["r1"]
    assert [s.index for s in g.segments] == [0]
    _finish(p2, d2, g)
    assert next(ids for gid, ids in e2.adds if gid == "r1") == old_ids
    assert g.state is GenState.FINISHED and [s.text for s in g.segments] == ["mf(100);", "tc(90);", "mf(50);"]
    assert [goal.segment_index for goal in d2.goals] == [1, 2]
    j.close()


def test_a_plan_none_of_whose_goals_was_sent_is_resubmitted_and_a_cut_one_fails(tmp_path):
    from timelyllm_ros.journal import RobotAccount

    path = tmp_path / "j.db"
    j = Journal(path)
    p1, _e1, d1 = _planner(j)
    for rid in ("queued-behind", "cut"):
        p1.submit(PlanRequest(rid, "d1", "tello", "patrol", "", NORMAL, 0.0, reference_plan="mf(100);tc(90);"))
    _until(p1, lambda: len(d1.goals) == 4)
    j.close()
    j = Journal(path)
    p2, _e2, d2 = _planner(j)
    goals = {("queued-behind", 0): "refused", ("queued-behind", 1): "refused",
             ("cut", 0): "stopped", ("cut", 1): "refused"}
    rep = recover(j, p2, lambda robot: RobotAccount("drone hovering (stop sent)", goals))
    assert rep.resubmitted == ["queued-behind"] and rep.resumed == []
    assert rep.failed == [("cut", "planner restarted after dispatching 2 segment(s); d1: drone hovering (stop sent), "
                                  "after 0 of 2 dispatched statement(s): segment 0 stopped")]
    assert not p2.generations["queued-behind"].segments and j.segment_rows("queued-behind") == []
    _finish(p2, d2, p2.generations["queued-behind"])
    assert p2.generations["queued-behind"].state is GenState.FINISHED
    j.close()
