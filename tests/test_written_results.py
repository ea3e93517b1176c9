"""Unsegmented policies (STREAM / WHOLE) never give the model the robot's result of a blocking
statement: what the model generates after it was generated under a result of its own (written as
`#True`, or assumed without a word: the bundled model writes the all-True plan).  The planner's one
rule (core/speculation.py): such a continuation is held until the robot answers and, if the answer
differs, rolled back to the blocking statement, the real result appended and generation resumed —
as a wrong speculation of the segmenting default.  The simulator's model of what is written:
sim/prompts.py `WrittenResults`."""

from collections import Counter

import pytest

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner, PlannerConfig
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.speculation import written_value
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import GenState, PlanRequest, ResultCode, SegmentResult
from timelyllm_ros.engines.simulated import SimulatedEngine
from timelyllm_ros.sim.prompts import SimPromptSource, WrittenResults
from timelyllm_ros.sim.runner import run_simulation
from timelyllm_ros.core.tokenizer import SimTokenizer

from test_planner import RecordingDispatcher as Dispatcher  # the planner tests' dispatcher port

ROBOTS = load_robots()
PLAN = "s('cat');g('cat');tp;"


def make(policy, written=None, **cfg):
    clock = VirtualClock()
    tok = SimTokenizer()
    pol = make_policy(policy)
    engine = SimulatedEngine(clock, tokenizer=tok, kind="stock", scheduling_policy=pol.engine_scheduling)
    disp = Dispatcher()
    prompts = SimPromptSource(engine, tok, robots=ROBOTS, written=WrittenResults(written, seed=1))
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=ROBOTS, policy=pol,
                      estimator=ExecTimeEstimator(ROBOTS), prompts=prompts, config=PlannerConfig(**cfg))
    return planner, disp, clock


def submit(planner, plan=PLAN, rid="r"):
    assert planner.submit(PlanRequest(rid, "d1", "tello", "find the cat", "sofa", NORMAL, 0.0,
                                      reference_plan=plan)).accepted
    return planner.generations[rid]


def steps(planner, n=60):
    for _ in range(n):
        planner.step()


def answer(planner, goal, clock, value=None):
    t = clock.now()
    planner.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, t, t + 0.5,
                                      (0.5,) * len(goal.calls), len(goal.calls), value))


def finish(planner, disp, clock, g, value_of=lambda goal: None):
    """Answer every goal in order until g ends."""
    done = 0
    for _ in range(5_000):
        if g.state.terminal:
            return
        if done < len(disp.goals):
            answer(planner, disp.goals[done], clock, value_of(disp.goals[done]))
            done += 1
        planner.step()
    raise AssertionError(f"{g.gen_id} did not end: {g.state}")


@pytest.mark.parametrize("policy", ["vllm-stream", "andes", "vllm-priority"])
def test_written_result_the_robot_contradicts_is_rolled_back_and_never_executed(policy):
    planner, disp, clock = make(policy, written=1.0)  # the model writes `#True` after s('cat')
    g = submit(planner)
    steps(planner)
    # the scan went out; what the model generated after it, under its own `#True`, is held
    assert [x.text for x in disp.goals] == ["s('cat');"]
    assert g.state is GenState.WAITING and "#True" in g.text and g.text.endswith("g('cat');")
    answer(planner, disp.goals[0], clock, False)  # the robot did not find the cat
    planner.step()
    assert g.spec_misses == 1 and g.spec_hits == 0
    assert g.text.startswith("s('cat');") and "#" not in g.text  # rolled back, generating on
    finish(planner, disp, clock, g)
    assert g.state is GenState.FINISHED
    # regenerated after the real result (the simulator's plan text is the same; no `#` any more):
    # every statement the robot ran was generated after the robot's own answer
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');", "tp;"]
    assert g.text == PLAN and g.segments[1].gen_start >= g.segments[0].exec_start  # (answered at exec_start here)


def test_written_result_the_robot_confirms_is_dispatched_at_once():
    planner, disp, clock = make("vllm-stream", written=1.0)
    g = submit(planner)
    steps(planner)
    assert [x.text for x in disp.goals] == ["s('cat');"] and g.state is GenState.WAITING
    answer(planner, disp.goals[0], clock, True)
    planner.step()
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');"] and g.spec_hits == 1
    finish(planner, disp, clock, g)
    assert g.state is GenState.FINISHED and g.spec_misses == 0
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');", "tp;"]


@pytest.mark.parametrize("value, misses", [(True, 0), (False, 1)])
def test_unwritten_result_counts_as_true_and_is_checked(value, misses):
    """The bundled model writes no annotation: its continuation is the all-True plan."""
    planner, disp, clock = make("vllm-stream")  # written=None: nothing written
    g = submit(planner)
    steps(planner)
    assert [x.text for x in disp.goals] == ["s('cat');"] and "#" not in g.text
    assert g.state is GenState.WAITING and g.text == PLAN[:len("s('cat');g('cat');")]
    answer(planner, disp.goals[0], clock, value)
    finish(planner, disp, clock, g)
    assert g.state is GenState.FINISHED and (g.spec_hits, g.spec_misses) == (1 - misses, misses)
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');", "tp;"]
    if misses:
        assert g.segments[1].gen_start >= g.segments[0].exec_start


def test_robot_answering_before_the_continuation_is_cut_rolls_back_at_once():
    planner, disp, clock = make("vllm-stream")
    g = submit(planner)
    while not disp.goals:
        planner.step()
    answer(planner, disp.goals[0], clock, False)  # answered before g('cat') is complete
    finish(planner, disp, clock, g)
    assert g.state is GenState.FINISHED and g.spec_misses == 1
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');", "tp;"]


def test_unchecked_config_keeps_streaming_blind():
    planner, disp, clock = make("vllm-stream", unwritten_result=None)
    g = submit(planner)
    steps(planner)
    assert [x.text for x in disp.goals] == ["s('cat');", "g('cat');", "tp;"]  # as before the rule
    finish(planner, disp, clock, g, lambda goal: False)
    assert g.state is GenState.FINISHED and g.spec_misses == g.spec_hits == 0


def test_whole_plans_go_out_up_to_the_blocking_statement_then_wait_for_its_result():
    planner, disp, clock = make("vllm", written=1.0)
    g = submit(planner, "mf(50);s('cat');g('cat');tp;")
    steps(planner)
    assert [x.text for x in disp.goals] == ["mf(50);", "s('cat');"] and g.state is GenState.WAITING
    answer(planner, disp.goals[0], clock)
    answer(planner, disp.goals[1], clock, False)
    finish(planner, disp, clock, g)
    assert g.state is GenState.FINISHED and g.spec_misses == 1
    assert [x.text for x in disp.goals] == ["mf(50);", "s('cat');", "g('cat');", "tp;"]
    assert g.segments[2].dispatched_at == g.segments[3].dispatched_at  # the rest: whole, after the result


def test_an_annotation_not_after_a_blocking_statement_fails_the_request():
    planner, disp, clock = make("vllm-stream")
    g = submit(planner, "mf(50);#True\ntp;")
    steps(planner)
    assert g.state is GenState.FAILED and "result annotation '#True'" in g.reason
    assert [x.text for x in disp.goals] == ["mf(50);"]


def test_written_values_parse_as_the_prompts_write_them():
    assert [written_value(t) for t in ("True", "False", "None", "3", "0.42", " yes ")] == \
        [True, False, None, 3, 0.42, "yes"]


def test_written_results_are_drawn_seeded_and_placed_after_blocking_statements():
    w = WrittenResults(0.8, seed=7)
    draws = [w.value(f"r{i}", j) for i in range(1000) for j in range(3)]
    share = sum(draws) / len(draws)
    assert 0.77 < share < 0.83  # True with probability true_p
    assert draws == [WrittenResults(0.8, seed=7).value(f"r{i}", j) for i in range(1000) for j in range(3)]
    assert draws != [WrittenResults(0.8, seed=8).value(f"r{i}", j) for i in range(1000) for j in range(3)]
    text, spans = WrittenResults(1.0).annotate(ROBOTS["tello"], "r", "mf(50);s('cat');g('cat');iv('cat');")
    assert text == "mf(50);s('cat');#True\ng('cat');iv('cat');#True\n"
    assert [text[a:b] for a, b in spans] == ["#True\n", "#True\n"]
    assert WrittenResults(None).annotate(ROBOTS["tello"], "r", PLAN) == (PLAN, [])
    for bad in (1.5, -0.1, True, float("nan")):
        with pytest.raises(ValueError):
            WrittenResults(bad)


def test_written_results_are_independent_of_the_robots_answers():
    """In a whole run (WID1, vllm-stream, stock engine): whether the model's written value
    matched the robot's sampled answer is as often as independence predicts, and the same seeds give
    the same run."""
    runs = [run_simulation("workloads/WID1.yaml", "vllm-stream", engine_kind="stock", written_true_p=0.8)
            for _ in range(2)]
    assert [r.to_dict(timeline=False) for r in runs][0] == runs[1].to_dict(timeline=False)
    w = WrittenResults(0.8, runs[0].seed)
    joint = Counter()
    for g in runs[0].generations:
        assert g.state is GenState.FINISHED
        # the statement index of each blocking segment in the plan = its segment index here
        for s in g.segments:
            if s.blocking:
                joint[(w.value(g.gen_id, s.index), s.result)] += 1
    n = sum(joint.values())
    assert n > 100 and sum(g.spec_misses for g in runs[0].generations) == joint[(True, False)] + joint[(False, True)]
    p_w_robot_true = joint[(True, True)] / (joint[(True, True)] + joint[(False, True)])
    p_w_robot_false = joint[(True, False)] / (joint[(True, False)] + joint[(False, False)])
    assert abs(p_w_robot_true - 0.8) < 0.12 and abs(p_w_robot_false - 0.8) < 0.2


def test_engine_drops_a_written_annotation_only_when_rolled_back_to_it():
    """A resume that keeps everything (a preemption just before the `#`) leaves the annotation to
    be written; a resume whose prompt was cut back to its start (the planner's rollback) drops it."""
    clock, tok = VirtualClock(), SimTokenizer()
    e = SimulatedEngine(clock, tokenizer=tok)
    text, spans = WrittenResults(0.0).annotate(ROBOTS["tello"], "g", PLAN)
    assert text == "s('cat');#False\ng('cat');tp;"
    e.set_script("g", text, spans)
    prompt = tok.encode("plan: ")
    head = len(tok.encode("s('cat');"))

    def run(ids, n):
        e.add("g", ids, 64)
        out = []
        for _ in range(n):
            out += [t for o in e.step() for t in o.token_ids]
        e.abort("g", "cache")
        return out

    out = run(prompt, head)  # up to the statement end, then preempted
    out += run(prompt + out, len(tok.encode("#False\n")))  # resumed with everything: it writes `#False\n`
    assert tok.decode(out) == "s('cat');#False\n"
    out += run(prompt + out, 2)
    kept = out[:head]  # the planner rolls back to the statement end (appends nothing here)
    rest = run(prompt + kept, 64)
    assert tok.decode(kept + rest).startswith("s('cat');g('cat');tp;") and "#" not in tok.decode(rest)
