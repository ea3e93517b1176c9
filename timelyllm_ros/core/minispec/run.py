"""MiniSpec interpreter: runs statements parsed by `parse.py`, one skill call at a time.

Computed arguments are checked here once their value is known, *before* the skill is called
(run-time half of the validation described in `core.guard`):

* numeric arguments need a number (never a bool); an `int` argument takes an int, or a float
  with an exactly integral value (`tc(360/4)` -> 90); 512.3 is refused, never truncated or rounded;
* `str` arguments take a string, or a number / bool as its text (`l(_2)` logs 0.42);
* then the schema's range / length / printable checks (`check_call_args`).

A refused argument raises `ArgumentError` and the call is not made.  Arithmetic refuses division
by zero and results beyond +-MAX_MAGNITUDE (a plan cannot build huge numbers in a loop).
"""

from __future__ import annotations

import math
from typing import Callable, MutableMapping

from ..robots import ArgSpec, RobotSpec
from ..types import SkillCall, Value
from .parse import parse_program, parse_statement
from .syntax import (COND_CHAIN, MAX_LOOP, MAX_STEPS, RETURN_VALUE, RETURNED, ArgumentError, Assign, BinOp, Call,
                     CallStmt, Cond, Else, Expr, Lit, Loop, MiniSpecRuntimeError, Neg, Return, SetVar, Stmt, Var,
                     check_call_args)

MAX_MAGNITUDE = 1e12  # largest |number| arithmetic may produce


class _ReturnSignal(Exception):
    def __init__(self, value: Value) -> None:
        self.value = value


def _is_num(v: Value) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(a: Value, b: Value) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 must not hold in a robot plan
        return type(a) is type(b) and a == b
    return a == b


def show_value(v: Value) -> str:
    """A value for messages and for str arguments: MiniSpec's own spelling."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)
    return str(v) if not isinstance(v, str) else v


def resolve_arg(a: ArgSpec, v: Value, abbr: str) -> Value:
    """The value a skill receives for a computed argument, or ArgumentError (never coerced silently)."""
    where = f"{abbr}: argument {a.name!r}"
    if a.type == "str":
        if isinstance(v, str):
            return v
        if v is None:
            raise ArgumentError(f"{where} got no value")
        return show_value(v)
    if not _is_num(v):
        raise ArgumentError(f"{where} must be a number, got {v!r}")
    if not math.isfinite(v):  # type: ignore[arg-type]
        raise ArgumentError(f"{where} must be finite, got {v!r}")
    if a.type == "int" and isinstance(v, float):
        if not v.is_integer():
            raise ArgumentError(f"{where} must be a whole number, got {v!r} (not rounded or truncated)")
        return int(v)
    return v


class _Runner:
    def __init__(self, robot: RobotSpec, call_skill: Callable[[SkillCall], Value], env: MutableMapping[str, Value],
                 max_steps: int) -> None:
        self.robot = robot
        self.call_skill = call_skill
        self.env = env
        self.steps = 0
        self.max_steps = max_steps

    def resolve(self, c: Call) -> SkillCall:
        """The call with every computed argument evaluated and checked."""
        if all(isinstance(e, Lit) for e in c.args):
            return c.call
        spec = self.robot.skill(c.call.name)
        if spec is None or len(spec.args) != len(c.args):
            raise ArgumentError(f"{c.call.abbr}: does not fit the robot schema")
        args = tuple(e.value if isinstance(e, Lit) else resolve_arg(a, self.eval(e), c.call.abbr)
                     for a, e in zip(spec.args, c.args))
        problem = check_call_args(spec, args)
        if problem:
            raise ArgumentError(f"{c.call.abbr}: {problem} (computed at run time)")
        return SkillCall(c.call.name, c.call.abbr, args)

    def call(self, c: Call) -> Value:
        resolved = self.resolve(c)
        self.steps += 1
        if self.steps > self.max_steps:
            raise MiniSpecRuntimeError(f"statement exceeded {self.max_steps} skill calls")
        return self.call_skill(resolved)

    def eval(self, e: Expr) -> Value:
        if isinstance(e, Lit):
            return e.value
        if isinstance(e, Var):
            if e.name not in self.env:
                raise MiniSpecRuntimeError(f"variable {e.name} is not defined")
            return self.env[e.name]
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, SetVar):  # TypeFly's `?_1=sd('x'){g(_1)}`: assign, then stand for the value
            v = self.eval(e.value)
            self.env[e.var] = v
            return v
        if isinstance(e, Neg):
            v = self.eval(e.operand)
            if not _is_num(v):
                raise MiniSpecRuntimeError(f"cannot negate {v!r}: not a number")
            return -v  # type: ignore[operator]
        assert isinstance(e, BinOp)
        if e.op in ("&", "|"):  # short-circuit: skills on the right side may not run
            left = bool(self.eval(e.left))
            if e.op == "&":
                return left and bool(self.eval(e.right))
            return left or bool(self.eval(e.right))
        a, b = self.eval(e.left), self.eval(e.right)
        if e.op == "==":
            return _eq(a, b)
        if e.op == "!=":
            return not _eq(a, b)
        if not (_is_num(a) and _is_num(b)):
            raise MiniSpecRuntimeError(f"cannot evaluate {a!r} {e.op} {b!r}: both sides must be numbers")
        if e.op == "<":
            return a < b  # type: ignore[operator]
        if e.op == ">":
            return a > b  # type: ignore[operator]
        if e.op == "<=":
            return a <= b  # type: ignore[operator]
        if e.op == ">=":
            return a >= b  # type: ignore[operator]
        return _arith(e.op, a, b)  # type: ignore[arg-type]

    def block(self, body: tuple[Stmt, ...]) -> Value:
        value: Value = None
        chain: bool | None = None  # whether the current if/else-if chain took a branch
        for s in body:
            value, chain = self.stmt(s, chain)
        return value

    def stmt(self, s: Stmt, chain: bool | None) -> tuple[Value, bool | None]:
        """Run one statement; returns its value and the if-chain state for a following else."""
        if isinstance(s, CallStmt):
            return self.call(s.call), None
        if isinstance(s, Assign):
            v = self.eval(s.value)
            self.env[s.var] = v
            return v, None
        if isinstance(s, Return):
            raise _ReturnSignal(None if s.value is None else self.eval(s.value))
        if isinstance(s, Loop):
            value: Value = None
            for _ in range(min(s.count, MAX_LOOP)):
                value = self.block(s.body)
            return value, None
        if isinstance(s, Cond):
            if self.eval(s.test):
                return self.block(s.body), True
            return None, False
        if isinstance(s, Else):
            if chain is None:
                raise MiniSpecRuntimeError("':' (else) without a preceding conditional")
            if chain:
                return None, True
            if s.cond is not None:
                return self.stmt(s.cond, None)
            return self.block(s.body), True
        raise MiniSpecRuntimeError(f"unknown statement {s!r}")


def _arith(op: str, a: int | float, b: int | float) -> int | float:
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    else:
        if b == 0:
            raise MiniSpecRuntimeError(f"division by zero in {a!r} / {b!r}")
        r = a / b
    if not math.isfinite(r) or abs(r) > MAX_MAGNITUDE:
        raise MiniSpecRuntimeError(f"{a!r} {op} {b!r} is out of range (|value| <= {MAX_MAGNITUDE:g})")
    return r


def run_statement(ast_or_text: Stmt | str, robot: RobotSpec, call_skill: Callable[[SkillCall], Value],
                  env: MutableMapping[str, Value], *, max_steps: int = MAX_STEPS) -> Value:
    """Execute one statement, calling `call_skill` with every resolved call it reaches.

    `env` is the executor's per-plan state: variables (`_1`), the if/else chain of the last
    top-level conditional, and whether the plan already returned (after `->` nothing runs).
    Returns the statement's value: a call's result, an assigned value, the last value of a block,
    or the returned value.  Raises MiniSpecRuntimeError (ArgumentError for a refused argument).
    """
    stmt = parse_statement(ast_or_text, robot).stmt if isinstance(ast_or_text, str) else ast_or_text
    if env.get(RETURNED):
        return env.get(RETURN_VALUE)
    chain = env.get(COND_CHAIN)
    runner = _Runner(robot, call_skill, env, max_steps)
    try:
        value, new_chain = runner.stmt(stmt, chain if isinstance(chain, bool) else None)
    except _ReturnSignal as r:
        env[RETURNED] = True
        env[RETURN_VALUE] = r.value
        env.pop(COND_CHAIN, None)
        return r.value
    if new_chain is None:
        env.pop(COND_CHAIN, None)
    else:
        env[COND_CHAIN] = new_chain
    return value


def run_program(text: str, robot: RobotSpec, call_skill: Callable[[SkillCall], Value],
                env: MutableMapping[str, Value] | None = None, *, max_steps: int = MAX_STEPS) -> Value:
    """Parse and run a whole plan statement by statement (the unsegmented baseline)."""
    env = {} if env is None else env
    body, _ = parse_program(text, robot)
    value: Value = None
    for s in body:
        value = run_statement(s, robot, call_skill, env, max_steps=max_steps)
        if env.get(RETURNED):
            break
    return value
