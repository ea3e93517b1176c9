"""MiniSpec parser, schema check and interpreter."""

from __future__ import annotations

import pytest

from timelyllm_ros.core.minispec import (COND_CHAIN, MAX_LOOP, RETURNED, Assign, CallStmt, Cond, Else, Loop,
                                         MiniSpecError, MiniSpecRuntimeError, Return, parse_program,
                                         parse_statement, run_program, run_statement)
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.types import SkillCall

ROBOTS = load_robots()
TELLO = ROBOTS["tello"]
ARM = ROBOTS["arm"]


def calls_of(text: str, robot=TELLO) -> list[str]:
    return [str(c) for c in parse_statement(text, robot).calls]


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize("text, kind, calls", [
    ("mf(50);", CallStmt, ["mf(50)"]),
    ("mf(50)", CallStmt, ["mf(50)"]),
    ("  mf ( 50 ) ;", CallStmt, ["mf(50)"]),
    ("tp", CallStmt, ["tp()"]),
    ("tp()", CallStmt, ["tp()"]),
    ("tp;", CallStmt, ["tp()"]),
    ("take_picture;", CallStmt, ["take_picture()"]),
    ("move_forward(100);", CallStmt, ["move_forward(100)"]),
    ("3{mf(50);tc(90)}", Loop, ["mf(50)", "tc(90)"]),
    ("3{mf(50);tc(90);}", Loop, ["mf(50)", "tc(90)"]),
    ("?iv('cat')==True{g('cat');tp}", Cond, ["iv('cat')", "g('cat')", "tp()"]),
    ("?iv('cat')!=False&ox('cat')>0.5|oh('cat')<=0.2{tc(15)}", Cond,
     ["iv('cat')", "ox('cat')", "oh('cat')", "tc(15)"]),
    ("?iv('cat'){tp}", Cond, ["iv('cat')", "tp()"]),
    (":{s('cat')}", Else, ["s('cat')"]),
    (":?iv('dog'){tp}", Else, ["iv('dog')", "tp()"]),
    ("_1=ox('cat');", Assign, ["ox('cat')"]),
    ("_x = 3;", Assign, []),
    ("->True", Return, []),
    ("->", Return, []),
    ("->iv('cat');", Return, ["iv('cat')"]),
    ("8{?iv('cat')==True{->True}tc(45)}", Loop, ["iv('cat')", "tc(45)"]),
    ("2{3{?iv('a'){tp}:{mf(20)}}}", Loop, ["iv('a')", "tp()", "mf(20)"]),
])
def test_statement_kinds_and_calls(text, kind, calls):
    stmt, got = parse_statement(text, TELLO)
    assert isinstance(stmt, kind)
    assert [str(c) for c in got] == calls


def test_calls_resolve_abbreviation_and_full_name():
    (c,) = parse_statement("mf(50)", TELLO).calls
    assert c == SkillCall("move_forward", "mf", (50,))
    (c,) = parse_statement("move_forward(50)", TELLO).calls
    assert c == SkillCall("move_forward", "move_forward", (50,))


def test_string_literals_keep_separators_and_escapes():
    (c,) = parse_statement(r"l('a;b{c}d(e)\'f\\g');", TELLO).calls
    assert c.args == ("a;b{c}d(e)'f\\g",)


def test_literals_types():
    stmt, _ = parse_statement("_1=-2.5", TELLO)
    assert stmt.value.value == -2.5
    stmt, _ = parse_statement("_1=False", TELLO)
    assert stmt.value.value is False
    (c,) = parse_statement("mt(-10,20,5)", ARM).calls
    assert c.args == (-10, 20, 5) and all(type(a) is int for a in c.args)


def test_program_with_else_attached():
    body, calls = parse_program("s('cat');?iv('cat')==True{g('cat');tp}:{l('no cat')};mf(50);tp", TELLO)
    assert [type(s).__name__ for s in body] == ["CallStmt", "Cond", "Else", "CallStmt", "CallStmt"]
    assert len(calls) == 7


@pytest.mark.parametrize("text, fragment, pos", [
    ("", "empty statement", 0),
    ("foo(1)", "unknown skill 'foo'", 0),
    ("mt(1,2,3)", "unknown skill 'mt'", 0),  # arm skill on a drone
    ("mf(5)", "below minimum", 3),
    ("mf(501)", "above maximum", 3),
    ("mf(50.0)", "must be an int", 3),
    ("mf('50')", "must be an int", 3),
    ("mf(True)", "must be an int", 3),
    ("mf()", "takes 1 argument", 0),
    ("mf(50,60)", "takes 1 argument", 0),
    ("tp(1)", "takes 0 argument", 0),
    ("s(42)", "must be a string", 2),
    ("l('" + "x" * 201 + "')", "longer than 200", 2),
    ("l('a\tb')", "non-printable", 2),
    ("l('a\u202eb')", "non-printable", 2),
    ("mf(50)mf(30)", "one statement per segment", 6),
    ("mf(50);tc(90)", "one statement per segment", 7),
    ("mf(50;", "expected ')'", 5),
    ("l('abc", "unterminated string", 2),
    ("l('a\\n')", "unknown escape", 2),
    ("3{mf(50)", "missing '}'", 8),
    ("3{mf(50) tc(90)}", "expected ';'", 9),
    ("0{tp}", "outside 1..100", 0),
    ("101{tp}", "outside 1..100", 0),
    ("2.5{tp}", "positive integer", 0),
    ("11{11{11{tp}}}", "nested loops repeat", 0),
    ("?mf(50){tp}", "returns nothing", 1),
    ("_1=tp", "returns nothing", 3),
    ("mf(p('x'))", "needs a number, but p(...) is a str value", 3),
    ("mf(iv('x'))", "needs a number, but iv(...) is a bool value", 3),
    ("tc(2*l2)", "unknown skill 'l2'", 5),
    ("mf(_1*'a')", "cannot compute with '*' on a str value", 5),
    ("?ox('a')>'b'{tp}", "cannot compare with '>' on a str value", 8),
    ("?1<2<3{tp}", "expected '{' to open a block", 4),
    ("mf(" + "(" * 17 + "1" + ")" * 17 + ")", "nested deeper than 16", 19),
    ("mf(٥٠)", "unexpected character", 3),
    ("mf(1" + "0" * 30 + ")", "longer than 24", 3),
    ("mf(50)}", "one statement per segment", 6),
    ("True", "expected a statement", 0),
    ("{{{{{{{{{tp}}}}}}}}}", "expected a statement", 0),
    ("1{" * 9 + "tp" + "}" * 9, "nested deeper", 17),
    ("?" + "&".join(["1"] * 1000) + "{tp}", "more than 64 operators", 130),  # issue 26: RecursionError before
    ("mf(" + "+".join(["1"] * 66) + ")", "more than 64 operators", 132),
    ("mf(ox(" + "+".join(["1"] * 40) + ")*(" + "+".join(["1"] * 30) + "))", "more than 64 operators", 137),
])
def test_errors_have_message_and_position(text, fragment, pos):
    with pytest.raises(MiniSpecError) as ei:
        parse_statement(text, TELLO)
    assert fragment in ei.value.message
    assert ei.value.pos == pos
    assert f"column {pos}" in str(ei.value)


def test_program_may_start_with_else_of_earlier_segment():
    body, _ = parse_program(":{s('cat')}", TELLO)
    assert isinstance(body[0], Else)
    with pytest.raises(MiniSpecError, match="must follow a conditional"):
        parse_program("tp;:{s('cat')}", TELLO)
    rec = Recorder({"iv": [False]})
    env: dict = {}
    run_program("?iv('cat'){tp}", TELLO, rec, env)
    run_program(":{s('cat')}", TELLO, rec, env)
    assert rec.calls == ["iv('cat')", "s('cat')"]


def test_check_call_args_for_executors():
    from timelyllm_ros.core.minispec import check_call_args
    mf = TELLO.skills["move_forward"]
    assert check_call_args(mf, (50,)) is None
    assert "below minimum" in check_call_args(mf, (5,))
    assert "huge integer" in check_call_args(mf, (10**5000,))
    assert "non-printable" in check_call_args(TELLO.skills["log"], ("a\x1b[2J",))
    assert "takes 1 argument" in check_call_args(mf, ())


def test_else_inside_block_must_follow_conditional():
    with pytest.raises(MiniSpecError, match="must follow a conditional"):
        parse_statement("2{tp;:{mf(50)}}", TELLO)
    parse_statement("2{?iv('a'){tp};:{mf(50)}}", TELLO)  # ';' between if and else is allowed


def test_check_false_parses_out_of_range_calls():
    _, calls = parse_statement("mf(5)", TELLO, check=False)
    assert calls == (SkillCall("move_forward", "mf", (5,)),)
    with pytest.raises(MiniSpecError, match="unknown skill"):
        parse_statement("zz(5)", TELLO, check=False)


def test_chat_robot_does_not_speak_minispec():
    with pytest.raises(MiniSpecError, match="does not speak MiniSpec"):
        parse_statement("say('hi')", ROBOTS["chat"])


# ------------------------------------------------------------------ interpreter


class Recorder:
    """call_skill that records calls and answers from a script of return values."""

    def __init__(self, answers: dict[str, list] | None = None) -> None:
        self.calls: list[str] = []
        self.answers = {k: list(v) for k, v in (answers or {}).items()}

    def __call__(self, call: SkillCall):
        self.calls.append(str(call))
        queue = self.answers.get(call.abbr)
        return queue.pop(0) if queue else None


def test_run_call_and_value():
    rec = Recorder({"ox": [0.7]})
    assert run_statement("ox('cat')", TELLO, rec, {}) == 0.7
    assert rec.calls == ["ox('cat')"]


@pytest.mark.parametrize("visible, expect", [(True, ["iv('cat')", "g('cat')", "tp()"]), (False, ["iv('cat')"])])
def test_conditional_branches(visible, expect):
    rec = Recorder({"iv": [visible]})
    env: dict = {}
    run_statement("?iv('cat')==True{g('cat');tp}", TELLO, rec, env)
    assert rec.calls == expect
    assert env[COND_CHAIN] is visible


def test_else_across_segments_uses_env():
    for visible, expect in [(True, ["iv('cat')", "tp()"]), (False, ["iv('cat')", "s('cat')"])]:
        rec = Recorder({"iv": [visible]})
        env: dict = {}
        run_statement("?iv('cat'){tp}", TELLO, rec, env)
        run_statement(":{s('cat')}", TELLO, rec, env)
        assert rec.calls == expect


def test_else_if_chain():
    rec = Recorder({"iv": [False, True]})
    env: dict = {}
    for stmt in ["?iv('cat'){l('cat')}", ":?iv('dog'){l('dog')}", ":{l('none')}"]:
        run_statement(stmt, TELLO, rec, env)
    assert rec.calls == ["iv('cat')", "iv('dog')", "l('dog')"]


def test_else_without_conditional_is_runtime_error():
    env: dict = {}
    run_statement("tp", TELLO, Recorder(), env)
    with pytest.raises(MiniSpecRuntimeError, match="without a preceding conditional"):
        run_statement(":{tp}", TELLO, Recorder(), env)


def test_loop_repeats_and_boolean_ops_short_circuit():
    rec = Recorder({"iv": [False, True, False], "ox": [0.7]})
    run_statement("3{?iv('x')&ox('x')>0.5{tc(10)}}", TELLO, rec, {})
    # ox is asked only when iv is True (short-circuit)
    assert rec.calls == ["iv('x')", "iv('x')", "ox('x')", "tc(10)", "iv('x')"]
    rec = Recorder({"iv": [True]})
    run_statement("?iv('x')|ox('x')>0.5{tp}", TELLO, rec, {})
    assert rec.calls == ["iv('x')", "tp()"]


def test_comparisons_of_non_numbers_fail_clearly():
    with pytest.raises(MiniSpecRuntimeError, match="must be numbers"):
        run_statement("?ox('x')>0.5{tp}", TELLO, Recorder({"ox": ["left"]}), {})


def test_true_is_not_one():
    rec = Recorder({"iv": [1]})
    run_statement("?iv('x')==True{tp}", TELLO, rec, {})
    assert rec.calls == ["iv('x')"]


def test_variables_persist_in_env():
    rec = Recorder({"ox": [0.8]})
    env: dict = {}
    run_statement("_1=ox('cat');", TELLO, rec, env)
    assert env["_1"] == 0.8
    run_statement("?_1>0.6{tc(15)}", TELLO, rec, env)
    assert rec.calls == ["ox('cat')", "tc(15)"]
    with pytest.raises(MiniSpecRuntimeError, match="_2 is not defined"):
        run_statement("?_2>0.6{tc(15)}", TELLO, rec, env)


def test_return_in_loop_stops_plan():
    rec = Recorder({"iv": [False, False, True]})
    env: dict = {}
    assert run_statement("8{?iv('cat')==True{->True}tc(45)}", TELLO, rec, env) is True
    assert rec.calls == ["iv('cat')", "tc(45)", "iv('cat')", "tc(45)", "iv('cat')"]
    assert env[RETURNED] is True
    assert run_statement("mf(50)", TELLO, rec, env) is True  # nothing runs after a return
    assert len(rec.calls) == 5


def test_scan_macro_exhausts_loop():
    rec = Recorder()
    env: dict = {}
    value = run_program("8{?iv('cat')==True{->True}tc(45)}->False", TELLO, rec, env)
    assert value is False
    assert rec.calls.count("tc(45)") == 8


def test_step_limit():
    with pytest.raises(MiniSpecRuntimeError, match="exceeded 5 skill calls"):
        run_statement(f"{MAX_LOOP}{{tp}}", TELLO, Recorder(), {}, max_steps=5)


def test_run_statement_rejects_invalid_text_before_calling():
    rec = Recorder()
    with pytest.raises(MiniSpecError):
        run_statement("mf(50);mf(5)", TELLO, rec, {})
    assert rec.calls == []


def test_run_program_whole_plan():
    rec = Recorder({"iv": [True]})
    run_program("s('cat');?iv('cat')==True{g('cat');tp}:{l('no cat')};mf(50)", TELLO, rec)
    assert rec.calls == ["s('cat')", "iv('cat')", "g('cat')", "tp()", "mf(50)"]


def test_lrtrace_reference_plans_parse():
    """Every reference plan in the workload file is valid MiniSpec for its robot."""
    import yaml
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "workloads" / "lrtrace_tasks.yaml"
    if not path.exists():
        pytest.skip("workloads/lrtrace_tasks.yaml not present")
    tasks = yaml.safe_load(path.read_text())["tasks"]
    n = 0
    for task in tasks.values():
        robot = ROBOTS[task["robot_type"]]
        if robot.language != "minispec":
            continue
        for sc in task["scenes"]:
            body, calls = parse_program(sc["plan"], robot)
            assert body and calls
            n += 1
    assert n > 0


def test_parse_memo_never_serves_another_robot_or_a_stale_verdict():
    """parse_statement is memoised; a hit needs the very same RobotSpec object and errors repeat."""
    import yaml

    from timelyllm_ros.core.minispec import MiniSpecError, parse_statement
    from timelyllm_ros.core.robots import ROBOTS_DIR, load_robots, parse_robot

    tello = load_robots()["tello"]
    assert parse_statement("mu(100);", tello).calls[0].args == (100,)
    assert parse_statement("mu(100);", tello) is parse_statement("mu(100);", tello)  # memo hit
    data = yaml.safe_load((ROBOTS_DIR / "tello.yaml").read_text())
    data["skills"]["move_up"]["args"][0]["max"] = 50  # a narrowed schema, same robot_type
    narrow = parse_robot(data, "narrow")
    with pytest.raises(MiniSpecError, match="above maximum"):
        parse_statement("mu(100);", narrow)
    with pytest.raises(MiniSpecError, match="above maximum"):
        parse_statement("mu(100);", narrow)  # the memoised error is raised again
    assert parse_statement("mu(100);", tello).calls[0].args == (100,)  # the original is unaffected
