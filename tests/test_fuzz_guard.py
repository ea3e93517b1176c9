"""Property tests: the guard never raises and never lets a schema-breaking call through; the
segmenter never crashes, is split-invariant, and never emits a valid segment the guard rejects.

Deterministic (derandomized) with a fixed number of examples per property:
TIMELYLLM_FUZZ_EXAMPLES (default 2000).  Each test prints the number of inputs it tried
(`pytest -s`) and fails if fewer than that ran.  `benchmarks/fuzz_guard.py` runs a larger count.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.guard import check_segment
from timelyllm_ros.core.minispec import MiniSpecError, parse_statement
from timelyllm_ros.core.robots import RobotSpec, load_robots
from timelyllm_ros.core.segmenter import Segmenter, segment_text
from timelyllm_ros.core.types import SkillCall

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fuzz_guard import oracle_problem  # noqa: E402  (one independent oracle for tests and benchmark)

ROBOTS = load_robots()
TELLO, ARM, CHAT = ROBOTS["tello"], ROBOTS["arm"], ROBOTS["chat"]
TYPEFLY = ROBOTS["tello_typefly"]  # TypeFly's current skill names (issue 27)
N = int(os.environ.get("TIMELYLLM_FUZZ_EXAMPLES", "2000"))
PROFILE = settings(max_examples=N, derandomize=True, deadline=None, database=None, print_blob=True,
                   suppress_health_check=list(HealthCheck))

INJECTIONS = ["'; rm -rf /", "\\'; mf(500); '", "');mf(500);l('", "}{", "?", ":{", "\x00", "\n", "\r\n",
              "\t", "\u202e", "\u200b", "\u00a0", "NaN", "1e999", "🐈", "猫", "'", "\\", "\\\\'", "$(reboot)",
              "%s%n", "\x1b[2J", "\ud7ff", "{{{{", "))))", ";;;", "-> True"]
SPECIALS = ";{}()'\\?:_=-<>&|,. \n0123456789\u202e\x00é🐈"


# ------------------------------------------------------------------ generators

def quote(s: str, escape: bool) -> str:
    if escape:
        s = s.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{s}'"


def render(v) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    return repr(v) if isinstance(v, float) else str(v)


strings = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
    st.sampled_from(INJECTIONS),
    st.lists(st.sampled_from(INJECTIONS + ["cat", "red box", " "]), max_size=4).map("".join),
    st.integers(0, 300).map(lambda n: "x" * n),
)
numbers = st.one_of(
    st.integers(-600, 600), st.integers(), st.integers(-10**30, 10**30),
    st.sampled_from([0, -1, 1, 19, 20, 21, 499, 500, 501, 359, 360, 361, -80, 80, 81, 90, 91, 10**25]),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-1000, 1000),
)
literal_text = st.one_of(
    numbers.map(render), st.booleans().map(render),
    st.tuples(strings, st.booleans()).map(lambda t: quote(*t)),
    st.sampled_from(["_1", "nan", "inf", "1e5", "-", "None", "''", "'\\'"]),
)


VARS = ["_1", "_2", "_x"]


def expr_text(robot: RobotSpec):
    """Numeric-looking expressions: literals, variables, value skills, + - * /, (), unary minus."""
    value_calls = [f"{s.abbr}({','.join(repr('cat') if a.type == 'str' else '1' for a in s.args)})"
                   for s in robot.skills.values() if s.returns != "none"]
    leaf = st.one_of(numbers.map(render), st.sampled_from(VARS), st.sampled_from(value_calls))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from("+-*/"), inner).map("".join),
        inner.map(lambda e: f"({e})"), inner.map(lambda e: f"-{e}")), max_leaves=4)


@st.composite
def call_text(draw, robot: RobotSpec) -> str:
    spec = draw(st.sampled_from(list(robot.skills.values())))
    name = draw(st.sampled_from([spec.abbr, spec.abbr, spec.name, "zz", spec.abbr + "x", "say", "pk"]))
    if draw(st.integers(0, 9)) < 8:
        args = []
        for a in spec.args:
            k = draw(st.integers(0, 5))
            if a.type == "str":
                args.append(draw(st.sampled_from(VARS)) if k == 5 else quote(draw(strings), k < 4))
            elif k <= 2 and a.min is not None and a.max is not None:
                args.append(str(draw(st.integers(int(a.min), int(a.max)))))
            elif k == 3:
                args.append(draw(expr_text(robot)))
            else:
                args.append(draw(literal_text))
    else:
        args = draw(st.lists(literal_text, max_size=3))
    if not args and draw(st.booleans()):
        return name
    return f"{name}({','.join(args)})"


@st.composite
def cond_text(draw, operand) -> str:
    parts = [draw(st.sampled_from(["", "", "", "_1=", "_2="]))]  # TypeFly: ?_1=sd('x'){g(_1)}
    for k in range(draw(st.integers(1, 3))):
        if k:
            parts.append(draw(st.sampled_from(["&", "|", "&&", "||"])))
        if draw(st.booleans()):
            parts.append(draw(operand))
        else:
            parts += [draw(operand), draw(st.sampled_from(["==", "!=", "<", ">", "<=", ">="])), draw(operand)]
    return "".join(parts)


def statements(robot: RobotSpec):
    call = call_text(robot)
    operand = st.one_of(call, literal_text, st.sampled_from(VARS), expr_text(robot))
    simple = st.one_of(
        call, call,
        st.tuples(st.sampled_from(VARS), operand).map(lambda t: f"{t[0]}={t[1]}"),
        operand.map(lambda o: "->" + o),
    )
    test = cond_text(operand)

    def extend(inner):
        body = st.lists(inner, max_size=3).map(";".join)
        return st.one_of(
            st.tuples(st.sampled_from(["1", "2", "8", "10", "11", "100", "101", "0", "-1", "2.5"]), body)
            .map(lambda t: f"{t[0]}{{{t[1]}}}"),
            st.tuples(test, body, st.one_of(st.none(), body))
            .map(lambda t: f"?{t[0]}{{{t[1]}}}" + ("" if t[2] is None else f":{{{t[2]}}}")),
        )

    return st.recursive(simple, extend, max_leaves=4)


@st.composite
def mutated(draw, base_strategy) -> str:
    s = draw(base_strategy)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.integers(0, 3))
        i = draw(st.integers(0, len(s)))
        if op == 0:
            s = s[:i] + draw(st.sampled_from(SPECIALS)) + s[i:]
        elif op == 1 and s:
            s = s[:i] + s[i + 1:]
        elif op == 2 and s:
            j = draw(st.integers(i, len(s)))
            s = s[:i] + s[i:j] * 2 + s[j:]
        elif op == 3:
            s = s[:i] + draw(st.sampled_from(INJECTIONS)) + s[i:]
    return s


@st.composite
def program(draw, stmt) -> str:
    ss = draw(st.lists(stmt, min_size=1, max_size=4))
    return draw(st.sampled_from([";", ";\n", "; ", ""])).join(ss) + draw(st.sampled_from(["", ";"]))


def per_robot(make):
    """(robot, text) strategy; strategies are built once per robot, not per example."""
    return st.one_of(*[st.tuples(st.just(r), make(r)) for r in (TELLO, ARM, TYPEFLY)])


STATEMENT = per_robot(statements)
STATEMENT_OR_MUTANT = per_robot(lambda r: st.one_of(statements(r), statements(r).map(lambda s: s + ";"),
                                                     mutated(statements(r))))
RANDOM_CALLS = {r.robot_type: st.lists(st.builds(
    SkillCall, st.sampled_from(list(r.skills)), st.sampled_from(["mf", "pk", "l", "tp", "g"]),
    st.lists(st.one_of(numbers, strings, st.booleans(), st.sampled_from([10**5000, -10**5000, float("nan")])),
             max_size=3).map(tuple)), max_size=3) for r in (TELLO, ARM, TYPEFLY)}
PROGRAM = per_robot(lambda r: st.one_of(program(statements(r)), mutated(program(statements(r)))))


# ------------------------------------------------------------------ oracle (independent of guard.py)

def assert_accepted_is_safe(robot: RobotSpec, text: str, calls) -> bool:
    v = check_segment(robot, text, calls)
    assert not v.reason.startswith("internal guard error"), v.reason
    if v.ok:
        assert v.reason == ""
        for c in calls:
            assert oracle_problem(robot, c) is None, (text, c)
        assert parse_statement(text, robot).calls == tuple(calls)  # the strict parser agrees
    return v.ok


def run_counted(prop, name: str) -> None:
    count = [0, 0]  # inputs tried, inputs whose segment(s) the guard accepted
    prop(count)
    print(f"\n[fuzz] {name}: {count[0]} inputs tried, {count[1]} accepted")
    assert count[0] >= N, f"{name}: only {count[0]} of {N} examples ran"


# ------------------------------------------------------------------ properties


def test_guard_never_raises_never_accepts_schema_breaking_calls():
    @PROFILE
    @given(STATEMENT_OR_MUTANT, st.data())
    def prop(count, rt, data):
        robot, text = rt
        count[0] += 1
        try:
            calls = parse_statement(text, robot, check=False).calls
        except MiniSpecError:
            calls = tuple(data.draw(RANDOM_CALLS[robot.robot_type]))
        count[1] += assert_accepted_is_safe(robot, text, calls)

    run_counted(prop, "guard: random/mutated statements")


def test_guard_rejects_smuggled_call_lists():
    @PROFILE
    @given(STATEMENT, st.data())
    def prop(count, rt, data):
        robot, text = rt
        count[0] += 1
        try:
            calls = list(parse_statement(text, robot).calls)
        except MiniSpecError:
            return
        if not check_segment(robot, text, calls).ok:
            return
        how = data.draw(st.integers(0, 4))
        if how == 0 or not calls:  # add a call
            calls.append(SkillCall("move_forward", "mf", (500,)) if robot is TELLO
                         else SkillCall("move", "m", (500, 0)) if robot is TYPEFLY else SkillCall("home", "hm", ()))
        elif how == 1:  # drop one
            calls.pop(data.draw(st.integers(0, len(calls) - 1)))
        elif how == 2:  # change an argument (same value, other type; or other value)
            i = data.draw(st.integers(0, len(calls) - 1))
            c = calls[i]
            if not c.args:
                calls[i] = SkillCall(c.name, c.abbr, (1,))
            else:
                a = c.args[0]
                b = float(a) if type(a) is int else (a + "x" if isinstance(a, str) else 7)
                calls[i] = SkillCall(c.name, c.abbr, (b,) + c.args[1:])
        elif how == 3:  # rename
            i = data.draw(st.integers(0, len(calls) - 1))
            other = data.draw(st.sampled_from([s for s in robot.skills.values() if s.name != calls[i].name]))
            calls[i] = SkillCall(other.name, other.abbr, calls[i].args)
        else:  # reorder (only a change when calls differ)
            if len(set(calls)) < 2:
                return
            calls = calls[1:] + calls[:1]
        v = check_segment(robot, text, tuple(calls))
        assert not v.ok, (text, calls)
        count[1] += 1  # a valid statement whose call list was tampered with

    run_counted(prop, "guard: smuggled call lists")


def test_segmenter_never_crashes_is_split_invariant_and_agrees_with_guard():
    @PROFILE
    @given(PROGRAM,
           st.lists(st.integers(0, 400), max_size=12), st.booleans())
    def prop(count, rt, splits, eager):
        robot, text = rt
        count[0] += 1
        ref = segment_text(robot, text, eager_close=eager)
        seg = Segmenter(robot, eager_close=eager)
        pieces, last = [], 0
        for i in sorted(set(min(s, len(text)) for s in splits)) + [len(text)]:
            pieces.append(text[last:i])
            last = i
        cuts = []
        for p in pieces:
            cuts.extend(seg.feed(p))
        cuts.extend(seg.finish())
        assert cuts == ref
        prev = 0
        for c in cuts:
            assert prev <= c.start < c.end <= len(text)
            assert text[c.start:c.end].strip(" \t\n\r\f\v") == c.text  # MiniSpec whitespace is ASCII
            assert text[prev:c.start].strip(" \t\n\r\f\v;") == ""  # nothing but gaps is skipped
            prev = c.end
            if c.ok:
                v = check_segment(robot, c.text, c.calls)
                assert v.ok, (c, v.reason)
                count[1] += 1
            else:
                assert c.calls == () and c.error
        assert text[prev:].strip(" \t\n\r\f\v;") == ""

    run_counted(prop, "segmenter: random/mutated programs, random token splits")


def test_executor_sends_only_valid_resolved_calls():
    """Drone plans with variables and expressions: segmenter -> guard (plan state) -> executor
    (simulated backend); every call the backend receives, computed arguments resolved, passes the
    oracle, and nothing crashes the executor."""
    from timelyllm_ros.core.guard import PlanState
    from timelyllm_ros.core.types import ResultCode, SegmentGoal
    from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception
    from timelyllm_ros.executors.simulated import SimulatedBackend

    backend = SimulatedBackend(TELLO, time_scale=0.0, perception=SimulatedPerception(("cat",), seed=5))
    ex = SegmentExecutor(TELLO, backend, ExecutorConfig(timeout_s=5.0))
    prefix = st.lists(st.tuples(st.sampled_from(VARS), expr_text(TELLO)).map(lambda t: f"{t[0]}={t[1]};"),
                      max_size=3).map("".join)

    @PROFILE
    @given(prefix, program(statements(TELLO)))
    def prop(count, pre, text):
        count[0] += 1
        plan, goals = PlanState(), []
        for c in segment_text(TELLO, pre + text):
            if not c.ok:
                break
            v = check_segment(TELLO, c.text, c.calls, plan)
            if not v.ok:
                break
            plan = v.plan
            goals.append(SegmentGoal(f"p{count[0]}", "d", "tello", len(goals), c.text, c.calls, 1.0, c.blocking))
        for g in goals:
            rep = ex.execute(g)
            assert not rep.error.startswith("executor error"), rep.error
            if rep.code is not ResultCode.OK:
                break
        ex.forget(f"p{count[0]}")
        for call, _ in backend.calls:
            assert oracle_problem(TELLO, call, resolved=True) is None, call
        count[1] += bool(goals) and len(backend.calls) > 0
        backend.calls.clear()

    run_counted(prop, "executor: drone plans with variables/expressions, resolved calls")


def test_chat_segmenter_agrees_with_guard():
    words = st.one_of(st.sampled_from(["Hi", "Dr.", "e.g.", "3.5", "U.S.", "1.", "ok", "\n", "\n\n", "?!", "\"",
                                       "...", "A.", "I.", "etc.", "\x07", "\u202e", "🐈", "  "]),
                      st.text(max_size=6))
    text = st.lists(words, max_size=30).map(" ".join)

    @PROFILE
    @given(text, st.sampled_from(["sentence", "paragraph"]), st.lists(st.integers(0, 200), max_size=8))
    def prop(count, text, mode, splits):
        count[0] += 1
        ref = segment_text(CHAT, text, mode=mode)
        seg = Segmenter(CHAT, mode=mode, max_statement_chars=None)
        cuts, last = [], 0
        for i in sorted(set(min(s, len(text)) for s in splits)) + [len(text)]:
            cuts.extend(seg.feed(text[last:i]))
            last = i
        cuts.extend(seg.finish())
        assert cuts == ref
        assert " ".join(c.text for c in cuts).split() == text.split()  # nothing lost, nothing added
        for c in cuts:
            assert text[c.start:c.end] == c.text
            if c.ok:
                assert check_segment(CHAT, c.text, c.calls).ok
                count[1] += 1
                assert c.calls == (SkillCall("say", "say", (c.text,)),)

    run_counted(prop, "chat segmenter: random sentences")


def test_deep_nesting_and_long_chains_are_rejected_with_a_reason_never_crash():
    """Issue 26: operator chains up to 1,500 long and nesting up to 500 deep (parentheses, unary
    minus, value calls, blocks) go through segmenter (random token splits), guard and executor:
    nothing raises (a RecursionError would), what passes a size limit is rejected naming it, what
    is accepted is safe."""
    from timelyllm_ros.core.minispec import MAX_DEPTH, MAX_EXPR_DEPTH, MAX_OPERATORS
    from timelyllm_ros.core.types import SegmentGoal
    from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception
    from timelyllm_ros.executors.simulated import SimulatedBackend

    backend = SimulatedBackend(TELLO, time_scale=0.0, perception=SimulatedPerception(("cat",), seed=5))
    ex = SegmentExecutor(TELLO, backend, ExecutorConfig(timeout_s=5.0))
    sizes = st.sampled_from([1, 2, 15, 16, 17, 30, 63, 64, 65, 100, 500, 999, 1000, 1500])
    leaf = st.sampled_from(["1", "2", "_1", "iv('cat')", "ox('cat')", "True"])

    @st.composite
    def deep(draw):
        n = draw(sizes)
        kind = draw(st.sampled_from(["chain", "cond", "parens", "neg", "calls", "blocks"]))
        if kind in ("chain", "cond"):
            op = draw(st.sampled_from("&|+-*/<"))
            ops = [op if op != "<" else draw(st.sampled_from("&|+")) for _ in range(n)]
            body = draw(leaf) + "".join(o + draw(leaf) for o in ops)
            text = f"mf({body})" if kind == "chain" else f"?{body}{{tp}}"
            return text, n > MAX_OPERATORS
        if kind == "parens":
            return "_1=" + "(" * n + "1+1" + ")" * n, n >= MAX_EXPR_DEPTH
        if kind == "neg":
            return "->" + "-" * n + "_1", n > MAX_EXPR_DEPTH
        if kind == "calls":
            return "_2=" + "ox(" * n + "'cat'" + ")" * n, n > MAX_EXPR_DEPTH
        return "1{" * n + "tp" + "}" * n, n > MAX_DEPTH

    @PROFILE
    @given(deep(), st.lists(st.integers(0, 4000), max_size=12))
    def prop(count, item, splits):
        text, over = item
        count[0] += 1
        seg = Segmenter(TELLO)
        cuts, last = [], 0
        for i in sorted(set(min(s, len(text)) for s in splits)) + [len(text)]:
            cuts.extend(seg.feed(text[last:i]))
            last = i
        cuts.extend(seg.finish())
        c = cuts[0]
        if over:  # a statement cut for its length leaves its tail as a second (failed) cut
            assert not any(x.ok for x in cuts)
            assert any(w in c.error for w in ("operators (limit", "nested deeper", "longer than",
                                              "skill calls in one statement")), c
            return
        assert len(cuts) == 1
        if not c.ok:
            return  # e.g. a type error (a str where a number goes): rejected for that, with a reason
        v = check_segment(TELLO, c.text, c.calls)
        assert not v.reason.startswith("internal guard error"), v.reason
        if v.ok:
            rep = ex.execute(SegmentGoal(f"d{count[0]}", "d", "tello", 0, c.text, c.calls, 1.0, c.blocking))
            assert not rep.error.startswith("executor error"), rep.error
            ex.forget(f"d{count[0]}")
            for call, _ in backend.calls:
                assert oracle_problem(TELLO, call, resolved=True) is None, call
            backend.calls.clear()
            count[1] += 1

    run_counted(prop, "deep nesting / long operator chains")
