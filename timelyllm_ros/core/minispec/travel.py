"""The flight envelope statically, over the MiniSpec AST: the worst-path travel of statements
(`static_travel`: every loop run in full, every conditional taken, the costlier branch of an
if/else; an amount known only at run time at its least legal value), and whether a segment / a
plan so far leaves the robot's envelope (`check_static`, `segment_problem`).  The envelope itself
(limits, travel per call, the run-time tracker) is `core/envelope.py`; see its docstring.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..envelope import ZERO, Travel
from ..flight import call_travel
from ..robots import RobotSpec
from ..types import Value
from . import syntax as m

def static_travel(stmts: Iterable[Any], robot: RobotSpec) -> Travel:
    """Worst-path travel of statements (see the module doc for what "worst" means)."""
    def expr(e: Any) -> Travel:
        if isinstance(e, m.Call):
            out = ZERO
            for a in e.args:
                out = out.then(expr(a))
            spec = robot.skill(e.call.name)
            if spec is None:
                return out
            values = tuple(_const(a) for a in e.args)
            return out.then(call_travel(spec, values))
        if isinstance(e, m.Neg):
            return expr(e.operand)
        if isinstance(e, m.SetVar):
            return expr(e.value)
        if isinstance(e, m.BinOp):
            return expr(e.left).then(expr(e.right))
        return ZERO

    def block(body: Iterable[Any]) -> Travel:
        out = ZERO
        items = list(body)
        i = 0
        while i < len(items):
            s = items[i]
            if isinstance(s, m.Cond):  # an if / else-if / else chain: the costliest way through it
                chain = [s]
                while i + 1 < len(items) and isinstance(items[i + 1], m.Else):
                    i += 1
                    chain.append(items[i])
                out = out.then(_chain(chain))
            else:
                out = out.then(stmt(s))
            i += 1
        return out

    def _chain(chain: list[Any]) -> Travel:
        """Tests run in order until one holds; then its body.  Worst: max over the exits."""
        worst, tests = ZERO, ZERO
        plain_else = False
        for s in chain:
            cond = s if isinstance(s, m.Cond) else s.cond
            if cond is None:  # plain else
                worst = worst.worst(tests.then(block(s.body)))
                plain_else = True
                continue
            tests = tests.then(expr(cond.test))
            worst = worst.worst(tests.then(block(cond.body)))
        return worst if plain_else else worst.worst(tests)

    def stmt(s: Any) -> Travel:
        if isinstance(s, m.CallStmt):
            return expr(s.call)
        if isinstance(s, (m.Assign, m.Return)):
            return expr(s.value) if s.value is not None else ZERO
        if isinstance(s, m.Loop):
            return block(s.body).repeat(min(s.count, m.MAX_LOOP))
        if isinstance(s, m.Cond):
            return _chain([s])
        if isinstance(s, m.Else):  # an else whose conditional was an earlier segment: may run
            return stmt(s.cond) if s.cond is not None else block(s.body).worst(ZERO)
        return ZERO

    return block(stmts)


def _const(e: Any) -> Value:
    """The value of a constant expression (literals and arithmetic on them), else None."""
    if isinstance(e, m.Lit):
        return e.value
    if isinstance(e, m.Neg):
        v = _const(e.operand)
        return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if isinstance(e, m.BinOp) and e.op in m.ARITH_OPS:
        a, b = _const(e.left), _const(e.right)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
            return None
        try:
            r = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[e.op]()
        except (ZeroDivisionError, OverflowError):
            return None
        return r if math.isfinite(r) and abs(r) < 1e12 else None
    return None


def check_static(robot: RobotSpec, stmts: Iterable[Any], plan_so_far: Travel = ZERO) -> tuple[str | None, Travel]:
    """(why the statements leave the envelope or None, plan travel including them)."""
    seg = static_travel(stmts, robot)
    plan = plan_so_far.then(seg)
    env = robot.envelope
    if env is None:
        return None, plan
    return env.segment.exceeded(seg, "segment") or env.plan.exceeded(plan, "plan"), plan


def segment_problem(robot: RobotSpec, stmt: Any) -> str | None:
    """Why one statement (a segment) leaves the robot's segment envelope on its worst path, or None."""
    if robot.envelope is None:
        return None
    return robot.envelope.segment.exceeded(static_travel((stmt,), robot), "segment")
