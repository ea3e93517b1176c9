"""timelyllm_ros/assembly.py: the one place a planner is assembled (simulator, in-process serving,
the planner node): the parts are wired — a request submitted through the assembled planner is
dispatched through its dispatcher, its results come back through the builder's result port, the
journal records it, a journal's unfinished requests are recovered and the node told."""

from __future__ import annotations

import pytest

from timelyllm_ros.assembly import PlannerBuilder, PlannerParts, ServingEngines
from timelyllm_ros.core.clock import VirtualClock, WallClock
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import GenState, PlanRequest, ResultCode, SegmentResult
from timelyllm_ros.engines.simulated import SimulatedEngine
from timelyllm_ros.journal import Journal
from timelyllm_ros.sim.prompts import SimPromptSource
from timelyllm_ros.sim.robots import SimulatedRobots
from timelyllm_ros.sim.runner import EventLoop, RequestLanes

ROBOTS = load_robots()
PLAN = "mf(100);tc(90);mf(50);"


class Recording:
    """A dispatcher in front of another (None: none): records every goal it passes on."""

    def __init__(self, inner=None):
        self.inner, self.goals, self.cancelled = inner, [], []

    def dispatch(self, goal):
        self.goals.append(goal)
        if self.inner is not None:
            self.inner.dispatch(goal)

    def cancel(self, request_id):
        self.cancelled.append(request_id)
        if self.inner is not None:
            self.inner.cancel(request_id)


class InstantRobot:
    """In-process robots that finish every goal at once, answering through `post_result`."""

    def __init__(self, clock, post_result):
        self.clock, self.post_result = clock, post_result

    def dispatch(self, goal):
        t = self.clock.now()
        self.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, t, t,
                                       (0.0,) * len(goal.calls), len(goal.calls), None))

    def cancel(self, request_id):
        pass


def _run(clock, loop, planner, advance):
    for _ in range(50_000):
        loop.fire_due()
        ran = planner.step()
        if not planner.busy() and loop.next_time() is None:
            return
        if not ran:
            advance(loop.next_time())
    raise AssertionError("the assembled planner did not finish")


@pytest.mark.parametrize("mode", ["simulator", "in-process"])
def test_a_request_goes_through_the_assembled_dispatcher_robots_and_journal(tmp_path, mode):
    """Simulator (virtual clock and simulated robots, as sim/runner.py) and in-process serving (wall
    clock, as serve.py; robots that answer at once):
    the goals go out through the dispatcher given to `build`, the robots' results come back
    through `builder.post_result`, and the journal given in the parts records the outcome."""
    sim_clock = VirtualClock()
    clock = sim_clock if mode == "simulator" else WallClock()
    engine = SimulatedEngine(sim_clock)  # in-process: the engine's own virtual clock, the loop's wall clock
    loop = EventLoop(clock)
    journal = Journal(tmp_path / "j.db")
    builder = PlannerBuilder(PlannerParts(clock=clock, engine=engine, robots=ROBOTS, policy=make_policy("default"),
                                          prompts=SimPromptSource(engine, robots=ROBOTS), max_batch=4,
                                          journal=journal))
    if mode == "simulator":  # as sim/runner.py: simulated robots on the event loop, one lane per request
        robots = RequestLanes(SimulatedRobots(loop.view, ROBOTS, builder.post_result, loop.schedule, seed=1))
    else:
        robots = InstantRobot(clock, builder.post_result)
    built = builder.build(Recording(robots))
    planner = built.planner
    assert built.batcher == "fixed(4)" and planner.batcher.max_batch == 4
    assert built.journal is journal and built.recovery is not None and built.recovery.resubmitted == []
    assert built.engine is engine and built.policy is planner.policy and planner.dispatcher is built.dispatcher
    assert planner.submit(PlanRequest("r1", "d1", "tello", "patrol", "", NORMAL, clock.now(),
                                      reference_plan=PLAN)).accepted

    def advance(t):
        if mode == "simulator":
            sim_clock.advance_to(t)
    _run(clock, loop, planner, advance)
    g = planner.generations["r1"]
    assert g.state is GenState.FINISHED, g.reason
    assert [goal.segment_index for goal in built.dispatcher.goals] == [s.index for s in g.segments]
    assert built.dispatcher.goals and all(goal.robot_id == "d1" for goal in built.dispatcher.goals)
    assert all(s.ok for s in g.segments)  # every result came back through builder.post_result
    assert journal.lookup("r1") == ("finished", g.reason, "d1")
    with pytest.raises(RuntimeError, match="built its planner already"):
        builder.build(built.dispatcher)
    journal.close()


def test_a_result_before_the_planner_exists_is_refused():
    engine = SimulatedEngine(VirtualClock())
    builder = PlannerBuilder(PlannerParts(clock=engine.clock, engine=engine, robots=ROBOTS,
                                          policy=make_policy("fcfs"), prompts=SimPromptSource(engine, robots=ROBOTS)))
    with pytest.raises(RuntimeError, match="before the planner was built"):
        builder.post_result(None)  # type: ignore[arg-type]


def test_the_node_assembly_recovers_its_journal_and_tells_the_node(tmp_path):
    """nodes/wiring.py: `build_planner(params).make_planner(dispatcher, [node])` is the same
    assembly: a journaled unfinished request is resubmitted and the node gets the report and the
    journal; the batch cap parameter is installed."""
    from timelyllm_ros.nodes.wiring import build_planner

    path = tmp_path / "planner.db"
    old = Journal(path)
    from timelyllm_ros.core.types import Generation

    old.on_request_update(Generation(request=PlanRequest("left", "d1", "tello", "t", "", NORMAL, 0.0,
                                                         reference_plan=PLAN)))
    old.close()

    class Node:
        def __init__(self):
            self.updates, self.reports, self.journals = [], [], []

        def on_request_update(self, g):
            self.updates.append(g.gen_id)

        def on_segment_dispatched(self, g, seg):
            pass

        def on_segment_result(self, g, seg):
            pass

        def on_recovery(self, report):
            self.reports.append(report)

        def on_journal(self, journal):
            self.journals.append(journal)

    node = Node()
    started = build_planner({"journal_path": str(path), "max_batch": 3})
    try:
        planner = started.make_planner(Recording(), [node])  # type: ignore[arg-type]
        assert planner.batcher.max_batch == 3 and started.clock is planner.clock
        assert [r.resubmitted for r in node.reports] == [["left"]] and len(node.journals) == 1
        assert "left" in planner.generations and "left" in node.updates  # the node heard the resubmission
        assert node.journals[0].lookup("left")[0] == "queued"
    finally:
        started.shutdown()


def test_serving_engines_restart_rebuilds_keeps_the_step_log_and_shuts_down_the_current_one():
    class Fake:
        def __init__(self, n):
            self.n, self.step_log, self.down = n, None, False

        def shutdown(self):
            self.down = True

    built, said = [], []

    def rebuild():
        built.append(Fake(len(built)))
        return built[-1]
    engines = ServingEngines(rebuild(), rebuild, on_restart=lambda: said.append("restart"))
    first = engines.engine
    first.step_log = log = []
    new = engines.restart(first)
    assert first.down and new is engines.engine and new is built[1] and new.step_log is log and said == ["restart"]
    engines.shutdown()
    assert new.down
