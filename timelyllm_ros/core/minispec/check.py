"""Static checks over the MiniSpec AST (no parsing here: the AST comes from `syntax.py`).

* static types: every expression gets the set of value types it may hold (`int`, `float`, `str`,
  `bool`); a computed argument is rejected before dispatch only when *none* of its possible types
  fits (a `str` from `p('...')` into `mf`, a `bool` into `tc`), comparisons `<`/`>` and arithmetic
  need numbers.  A variable whose type is unknown here (assigned by an earlier segment the caller
  did not describe) may hold anything: its value is checked at run time (`run.py`).
* bounds: loop product and the number of skill calls one statement may execute.

`var_types` carries what earlier segments of the same plan assigned (the dispatch guard keeps it
per plan); `check_static` returns the types after the statements ran.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from .syntax import (ARITH_OPS, MAX_LOOP, MAX_LOOP_PRODUCT, MAX_STEPS, Assign, BinOp, Call, CallStmt, Cond, Else,
                     Expr, Lit, Loop, MiniSpecError, Neg, Return, SetVar, Stmt, Var)
from ..robots import RobotSpec
from .travel import segment_problem

Types = frozenset[str]
NUM: Types = frozenset({"int", "float"})
ANY: Types = frozenset({"int", "float", "str", "bool"})
_RETURNS: dict[str, Types] = {"bool": frozenset({"bool"}), "float": frozenset({"float"}),
                              "str": frozenset({"str"}), "int": frozenset({"int"})}


def value_type(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    return "str"


def _show(t: Types) -> str:
    return "/".join(sorted(t)) or "nothing"


class _Typer:
    def __init__(self, robot: RobotSpec, var_types: Mapping[str, Types] | None) -> None:
        self.robot = robot
        self.vars: dict[str, Types] = dict(var_types or {})

    def expr(self, e: Expr) -> Types:
        if isinstance(e, Lit):
            return frozenset({value_type(e.value)})
        if isinstance(e, Var):
            return self.vars.get(e.name, ANY)
        if isinstance(e, Call):
            self.call(e)
            return _RETURNS.get(e.returns, ANY)
        if isinstance(e, SetVar):  # `?_1=sd('x'){...}`: the test always runs, so _1 is assigned
            t = self.expr(e.value)
            self.vars[e.var] = t
            return t
        if isinstance(e, Neg):
            t = self.expr(e.operand)
            if not t & NUM:
                raise MiniSpecError(f"'-' needs a number, got a {_show(t)} value", e.pos)
            return t & NUM
        left, right = self.expr(e.left), self.expr(e.right)
        if e.op in ("&", "|", "==", "!="):
            return frozenset({"bool"})
        for side in (left, right):
            if not side & NUM:
                what = "compare" if e.op not in ARITH_OPS else "compute"
                raise MiniSpecError(f"cannot {what} with '{e.op}' on a {_show(side)} value", e.pos)
        if e.op in ARITH_OPS:
            if e.op != "/" and left & NUM == {"int"} and right & NUM == {"int"}:
                return frozenset({"int"})
            return frozenset({"float"}) if e.op == "/" else NUM
        return frozenset({"bool"})

    def call(self, c: Call) -> None:
        spec = self.robot.skill(c.call.name) or self.robot.skill(c.call.abbr)
        if spec is None:  # the parser resolved it; a changed robot object is the caller's bug
            raise MiniSpecError(f"unknown skill {c.call.abbr!r}", c.pos)
        for a, e in zip(spec.args, c.args):
            t = self.expr(e)
            if isinstance(e, Lit):
                continue  # literals are checked against the schema itself (parser / guard)
            if a.type in ("int", "float") and not t & NUM:
                raise MiniSpecError(f"{c.call.abbr}: argument {a.name!r} needs a number, "
                                    f"but {_source(e)} is a {_show(t)} value", _pos(e))
            # str arguments take any value: a number or bool is passed as its text (TypeFly's l(_2))

    def stmts(self, body: Iterable[Stmt]) -> None:
        for s in body:
            self.stmt(s)

    def optional(self, body: Iterable[Stmt]) -> None:
        """A block that may or may not run: variables may keep their old types."""
        before = dict(self.vars)
        self.stmts(body)
        for k, t in before.items():
            self.vars[k] = self.vars.get(k, frozenset()) | t

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, CallStmt):
            self.call(s.call)
        elif isinstance(s, Assign):
            self.vars[s.var] = self.expr(s.value)
        elif isinstance(s, Return):
            if s.value is not None:
                self.expr(s.value)
        elif isinstance(s, Loop):
            before = dict(self.vars)
            self.stmts(s.body)
            self.stmts(s.body)  # the second pass sees what the first iteration assigned
            for k, t in before.items():
                self.vars[k] = self.vars.get(k, frozenset()) | t
        elif isinstance(s, Cond):
            self.expr(s.test)
            self.optional(s.body)
        elif isinstance(s, Else):
            if s.cond is not None:
                self.optional((s.cond,))  # an else-if's test may not run (its assignment neither)
            else:
                self.optional(s.body)


def _source(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Call):
        return f"{e.call.abbr}(...)"
    return "the expression"


def _pos(e: Expr) -> int:
    return e.pos


def static_types(stmts: Iterable[Stmt], robot: RobotSpec,
                 var_types: Mapping[str, Types] | None = None) -> dict[str, Types]:
    """Type-check statements; returns the variable types after them.  Raises MiniSpecError."""
    typer = _Typer(robot, var_types)
    typer.stmts(stmts)
    return typer.vars


def check_static(stmts: tuple[Stmt, ...], robot: RobotSpec, var_types: Mapping[str, Types] | None = None,
                 *, per_statement: bool = False) -> dict[str, Types]:
    """All static checks of `core.minispec`'s check=True: types, loop product, calls per statement,
    and each statement's flight envelope (one statement = one segment; the plan's envelope needs
    the plan's history: the dispatch guard)."""
    for s in stmts:
        product = max_loop_product((s,))
        if product > MAX_LOOP_PRODUCT:
            raise MiniSpecError(f"nested loops repeat {product} times (at most {MAX_LOOP_PRODUCT})",
                                s.pos if per_statement else 0)
        steps = statement_calls(s)
        if steps > MAX_STEPS:
            raise MiniSpecError(f"statement may execute {steps} skill calls (at most {MAX_STEPS})",
                                s.pos if per_statement else 0)
        outside = segment_problem(robot, s)
        if outside:
            raise MiniSpecError(f"outside the flight envelope: {outside}", s.pos if per_statement else 0)
    return static_types(stmts, robot, var_types)


# ---------------------------------------------------------------- bounds


def expr_calls(e: Expr | None) -> int:
    """Skill calls written in an expression (each runs at most once per evaluation)."""
    if e is None or isinstance(e, (Lit, Var)):
        return 0
    if isinstance(e, Call):
        return 1 + sum(expr_calls(a) for a in e.args)
    if isinstance(e, Neg):
        return expr_calls(e.operand)
    if isinstance(e, SetVar):
        return expr_calls(e.value)
    assert isinstance(e, BinOp)
    return expr_calls(e.left) + expr_calls(e.right)


def statement_calls(stmt: Stmt) -> int:
    """Upper bound of skill calls one run of stmt may execute (loop bodies multiplied)."""
    if isinstance(stmt, CallStmt):
        return expr_calls(stmt.call)
    if isinstance(stmt, (Assign, Return)):
        return expr_calls(stmt.value)
    if isinstance(stmt, Loop):
        return stmt.count * sum(statement_calls(s) for s in stmt.body)
    if isinstance(stmt, Cond):
        return expr_calls(stmt.test) + sum(statement_calls(s) for s in stmt.body)
    if isinstance(stmt, Else):
        return (statement_calls(stmt.cond) if stmt.cond else 0) + sum(statement_calls(s) for s in stmt.body)
    return 0


def max_loop_product(stmts: tuple[Stmt, ...] | list[Stmt]) -> int:
    """Largest product of nested loop counts (1 when there is no loop); a count outside
    1..MAX_LOOP counts as more than MAX_LOOP_PRODUCT (an AST built by hand cannot sneak past)."""
    best = 1
    for s in stmts:
        if isinstance(s, Loop):
            count = s.count if 1 <= s.count <= MAX_LOOP else MAX_LOOP_PRODUCT + 1
            best = max(best, count * max_loop_product(s.body))
        elif isinstance(s, Cond):
            best = max(best, max_loop_product(s.body))
        elif isinstance(s, Else):
            best = max(best, max_loop_product(s.body), max_loop_product((s.cond,)) if s.cond else 1)
    return best


def iter_calls(stmts: Iterable[Stmt]) -> Iterator[Call]:
    """Every call node in the statements (nested calls in arguments included), in textual order."""
    for s in stmts:
        if isinstance(s, CallStmt):
            yield from _expr_call_nodes(s.call)
        elif isinstance(s, (Assign, Return)):
            if s.value is not None:
                yield from _expr_call_nodes(s.value)
        elif isinstance(s, Loop):
            yield from iter_calls(s.body)
        elif isinstance(s, Cond):
            yield from _expr_call_nodes(s.test)
            yield from iter_calls(s.body)
        elif isinstance(s, Else):
            if s.cond is not None:
                yield from iter_calls((s.cond,))
            yield from iter_calls(s.body)


def _expr_call_nodes(e: Expr) -> Iterator[Call]:
    if isinstance(e, Call):
        for a in e.args:
            yield from _expr_call_nodes(a)
        yield e
    elif isinstance(e, Neg):
        yield from _expr_call_nodes(e.operand)
    elif isinstance(e, SetVar):
        yield from _expr_call_nodes(e.value)
    elif isinstance(e, BinOp):
        yield from _expr_call_nodes(e.left)
        yield from _expr_call_nodes(e.right)
