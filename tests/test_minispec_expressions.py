"""Variables and expressions as skill arguments: static checks (parser, guard with plan state),
run-time checks (interpreter, executor), and the flight envelope from the robot YAML."""

from __future__ import annotations

import pytest
import yaml

from timelyllm_ros.core.flight import EnvelopeTracker
from timelyllm_ros.core.guard import PlanState, check_segment
from timelyllm_ros.core.minispec import (ArgumentError, BinOp, Call, MiniSpecRuntimeError, Var, parse_statement,
                                         run_statement)
from timelyllm_ros.core.robots import RobotSpecError, load_robots, parse_robot
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception
from timelyllm_ros.executors.simulated import SimulatedBackend

TELLO = load_robots()["tello"]


def calls(text):
    return parse_statement(text, TELLO).calls


def test_computed_arguments_parse_with_none_in_the_static_call():
    stmt, cs = parse_statement("tc(_3*30)", TELLO)
    assert cs == (SkillCall("turn_cw", "tc", (None,)),)
    assert isinstance(stmt.call.args[0], BinOp) and isinstance(stmt.call.args[0].left, Var)
    stmt, cs = parse_statement("mf((ox('x')-0.5)*-100+20)", TELLO)
    assert [c.abbr for c in cs] == ["ox", "mf"] and cs[1].args == (None,)
    assert isinstance(stmt.call, Call) and parse_statement("_1=-2", TELLO).stmt.value.value == -2


def test_precedence_and_short_circuit_at_run_time():
    seen = []

    def skill(c):
        seen.append(str(c))
        return {"iv": False, "ox": 0.25}.get(c.abbr)

    env: dict = {}
    assert run_statement("_1=2+3*4-10/5", TELLO, skill, env) == 12.0
    assert run_statement("_2=(2+3)*4", TELLO, skill, env) == 20
    assert run_statement("?iv('a')&iv('b'){tp}", TELLO, skill, env) is None and seen == ["iv('a')"]
    assert run_statement("_3=ox('a')<0.5|iv('c')", TELLO, skill, env) is True and seen[-1] == "ox('a')"
    run_statement("tc(_2*_2/4)", TELLO, skill, env)  # 100.0: whole -> int 100
    assert seen[-1] == "tc(100)"
    run_statement("l(_1)", TELLO, skill, env)  # a number logged as its text (TypeFly's l(_2))
    assert seen[-1] == "l('12.0')"


@pytest.mark.parametrize("setup, text, fragment", [
    ("_1=0", "tc(90/_1)", "division by zero"),
    ("_1=1000000", "_1=_1*_1*_1", "out of range"),
    ("_1=0.333", "mf(_1*100)", "whole number"),
    ("_1=600", "mf(_1)", "above maximum 500"),
    ("_1=True", "mf(_1)", "must be a number"),
    ("_1='far'", "tc(_1)", "must be a number"),
    ("_1=5", "tc(-_1)", "below minimum 1"),
    ("_2='a'", "?_2>3{tp}", "both sides must be numbers"),
])
def test_run_time_refusals(setup, text, fragment):
    env: dict = {}
    sent = []
    run_statement(setup, TELLO, lambda c: sent.append(c), env)
    with pytest.raises(MiniSpecRuntimeError, match=fragment):
        run_statement(text, TELLO, lambda c: sent.append(c), env)
    assert sent == []  # nothing was called


def test_argument_error_is_a_rejection_and_nothing_is_sent():
    backend = SimulatedBackend(TELLO, time_scale=0.0, perception=SimulatedPerception(("x",), seed=1))
    ex = SegmentExecutor(TELLO, backend, ExecutorConfig(timeout_s=5))
    g = lambda text, i: SegmentGoal("r", "d", "tello", i, text, calls(text), 1.0, False)  # noqa: E731
    assert ex.execute(g("_1=ox('x')", 0)).code is ResultCode.OK
    rep = ex.execute(g("mf(_1*10000)", 1))
    assert rep.code is ResultCode.REJECTED and "refused at run time" in rep.error
    assert [c.abbr for c, _ in backend.calls] == ["ox"]
    with pytest.raises(ArgumentError):
        run_statement("mf(_1*1000)", TELLO, lambda c: None, {"_1": 0.55})


def test_guard_accepts_computed_args_and_uses_the_plan_state():
    v1 = check_segment(TELLO, "_1=p('How far?');", calls("_1=p('How far?');"))
    assert v1.ok and v1.plan.var_types["_1"] == frozenset({"str"})
    assert check_segment(TELLO, "mf(_1);", calls("mf(_1);")).ok  # alone: _1 may be anything
    v2 = check_segment(TELLO, "mf(_1);", calls("mf(_1);"), v1.plan)  # after p(): a str into mf
    assert not v2.ok and "needs a number, but _1 is a str value" in v2.reason
    v3 = check_segment(TELLO, "_1=ox('x');", calls("_1=ox('x');"), v1.plan)
    assert check_segment(TELLO, "mf(_1*100);", calls("mf(_1*100);"), v3.plan).ok


def test_guard_refuses_a_value_smuggled_into_a_computed_argument():
    assert not check_segment(TELLO, "mf(_1)", (SkillCall("move_forward", "mf", (50,)),)).ok
    v = check_segment(TELLO, "mf(_1)", (SkillCall("move_forward", "mf", (None,)),))
    assert v.ok
    assert not check_segment(TELLO, "mf(50)", (SkillCall("move_forward", "mf", (None,)),)).ok


def test_envelope_per_segment_and_per_plan_statically():
    v = check_segment(TELLO, "10{100{mf(500)}}", (SkillCall("move_forward", "mf", (500,)),))
    assert not v.ok and "distance_cm 500000" in v.reason
    plan = PlanState()
    for i in range(5):  # 5 x 1000 cm: exactly the plan's 5000 cm
        v = check_segment(TELLO, "2{mf(500)}", (SkillCall("move_forward", "mf", (500,)),), plan)
        assert v.ok, (i, v.reason)
        plan = v.plan
    v = check_segment(TELLO, "mf(20)", (SkillCall("move_forward", "mf", (20,)),), plan)
    assert not v.ok and "plan would command distance_cm 5020" in v.reason
    # worst path: the costlier branch of an if/else; the least legal amount for computed values
    v = check_segment(TELLO, "60{mf(_1)}", (SkillCall("move_forward", "mf", (None,)),))
    assert v.reason.endswith("distance_cm 1200 (envelope 1000)")
    v = check_segment(TELLO, "?iv('a'){mf(500);mf(500)};", (SkillCall("is_visible", "iv", ("a",)),
                                                             SkillCall("move_forward", "mf", (500,)),
                                                             SkillCall("move_forward", "mf", (500,))))
    assert v.ok and v.plan.travel.distance_cm == 1000


def test_envelope_tracker_at_run_time():
    t = EnvelopeTracker(TELLO)
    mu = TELLO.skills["move_up"]
    md = TELLO.skills["move_down"]
    assert t.charge(SkillCall("move_up", "mu", (200,)), mu) is None
    assert t.charge(SkillCall("move_down", "md", (100,)), md) is None
    assert "climb_cm 400" in t.charge(SkillCall("move_up", "mu", (300,)), mu)  # peak 100+300 > 300 per segment
    assert t.charge(SkillCall("move_up", "mu", (200,)), mu) is None  # peak 300: at the limit
    t.begin_segment()
    assert "plan would command climb_cm 420" in t.charge(SkillCall("move_up", "mu", (120,)), mu)


@pytest.mark.parametrize("patch, fragment", [
    ({"envelope": {"segment": {"distance_cm": -1}}}, "must be a positive number"),
    ({"envelope": {"segment": {"distance": 100}}}, "unknown keys ['distance']"),
    ({"envelope": {"mission": {}}}, "unknown keys ['mission']"),
    ({"envelope": [1]}, "envelope must be a mapping"),
    ({"skills.move_forward.travel": {"distance_cm": "speed"}}, "numeric argument's name"),
    ({"skills.move_forward.travel": {"height": "distance"}}, "unknown axis 'height'"),
    ({"skills.move_forward.travl": {}}, "unknown keys ['travl']"),
])
def test_envelope_yaml_errors_are_clear(patch, fragment):
    data = yaml.safe_load(open(TELLO.source))
    for key, value in patch.items():
        if key.startswith("skills."):
            _, skill, field = key.split(".")
            data["skills"][skill][field] = value
        else:
            data[key] = value
    with pytest.raises(RobotSpecError) as ei:
        parse_robot(data, "t.yaml")
    assert fragment in str(ei.value) and "t.yaml" in str(ei.value)


def test_planner_guard_keeps_plan_state_across_segments():
    """In the planner loop (simulated engine, vllm-stream: no suspension), a str variable from an
    earlier segment cannot reach mf, and the plan's envelope accumulates over its segments."""
    from timelyllm_ros.core.clock import VirtualClock
    from timelyllm_ros.core.exec_time import ExecTimeEstimator
    from timelyllm_ros.core.planner import Planner
    from timelyllm_ros.core.policies import make_policy
    from timelyllm_ros.core.tuf import NORMAL
    from timelyllm_ros.core.types import GenState, PlanRequest
    from timelyllm_ros.engines.simulated import SimulatedEngine
    from timelyllm_ros.sim.prompts import SimPromptSource
    from timelyllm_ros.core.tokenizer import SimTokenizer

    robots = load_robots()

    class Goals:
        def __init__(self):
            self.goals = []

        def dispatch(self, goal):
            self.goals.append(goal)

        def cancel(self, request_id):
            pass

    def run(plan):
        clock, tok = VirtualClock(), SimTokenizer()
        engine = SimulatedEngine(clock, tokenizer=tok)
        disp = Goals()
        p = Planner(clock=clock, engine=engine, dispatcher=disp, robots=robots, policy=make_policy("vllm-stream"),
                    estimator=ExecTimeEstimator(robots), prompts=SimPromptSource(engine, tok, robots=robots))
        p.submit(PlanRequest("r", "d1", "tello", "t", "s", NORMAL, 0.0, reference_plan=plan))
        for _ in range(5000):
            if p.generations["r"].engine_finished or p.generations["r"].state.terminal:
                break
            p.step()
        return p.generations["r"], [g.text for g in disp.goals]

    g, sent = run("_1=ox('cup');mf(_1*100);tc(_1*90);")
    assert g.state is not GenState.FAILED and sent == ["_1=ox('cup');", "mf(_1*100);", "tc(_1*90);"]
    g, sent = run("_1=p('How far?');mf(_1);tp;")
    assert g.state is GenState.FAILED and "needs a number, but _1 is a str value" in g.reason
    assert sent == ["_1=p('How far?');"]
    g, sent = run("2{mf(500)};2{mf(500)};2{mf(500)};2{mf(500)};2{mf(500)};mf(20);")
    assert g.state is GenState.FAILED and "plan would command distance_cm 5020" in g.reason and len(sent) == 5


def test_largest_accepted_expressions_need_a_bounded_stack():
    """The front end has no recursion whose depth the input controls (issue 26): the largest
    expression the parser accepts (MAX_OPERATORS operators under MAX_EXPR_DEPTH - 1 parentheses,
    in a statement nested MAX_DEPTH blocks deep) goes through parser, static checks, guard,
    envelope and interpreter with at most 400 frames of stack to spare."""
    import sys

    from timelyllm_ros.core.minispec import MAX_DEPTH, MAX_EXPR_DEPTH, MAX_OPERATORS

    chain = "(" * (MAX_EXPR_DEPTH - 2) + "+".join(["1"] * (MAX_OPERATORS + 1)) + ")" * (MAX_EXPR_DEPTH - 2)
    conj = "&".join(["iv('a')"] * 16 + ["1<2"] * 16) + "|" + "|".join(["True"] * (MAX_OPERATORS - 48))
    texts = ["1{" * (MAX_DEPTH - 1) + f"?{conj}{{mf({chain})}}" + "}" * (MAX_DEPTH - 1),
             f"_9={conj}", f"->{chain}"]
    frames = 0
    f = sys._getframe()
    while f is not None:
        frames, f = frames + 1, f.f_back
    old = sys.getrecursionlimit()
    sent = []
    try:
        sys.setrecursionlimit(frames + 400)
        for text in texts:
            parsed = parse_statement(text + " ", TELLO)  # a fresh text: not served from the parse cache
            verdict = check_segment(TELLO, text, parsed.calls)
            assert verdict.ok, verdict.reason
            env: dict = {}
            run_statement(parsed.stmt, TELLO, lambda c: sent.append(c) or (True if c.abbr == "iv" else None), env)
            hash(parsed.stmt), repr(parsed.stmt)
    finally:
        sys.setrecursionlimit(old)
    assert [str(c) for c in sent if c.abbr == "mf"] == ["mf(65)"]
