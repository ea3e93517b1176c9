"""Dispatch guard: the single validation point every segment passes before a robot sees it.

The guard trusts nothing it is given: it re-parses the segment text itself (syntax only, with the
one MiniSpec parser; the schema checks below are its own code), requires the goal's call list to
be exactly the calls written in the text (so no one can smuggle a different call list past it),
checks every call against the robot schema, and applies hard limits that do not come from the
YAML (the Tello SDK's ranges, the arm's workspace), so that a loosened schema file cannot make a
robot fly 5 km.  Pure: no I/O, never raises -- anything unexpected is a rejection with a reason.

Validation happens in two places, and only these two:

1. **statically, here, before dispatch** -- everything known from the text: syntax, skill names,
   arity, every literal argument (type, range, hard limit, safe string), loop bounds and call
   counts, the static type of every computed argument (`mf(p('x'))`, or `mf(_1)` when the plan's
   earlier segment made `_1` a `str`: `PlanState.var_types`), and the flight envelope of the
   segment's worst path and of the plan so far (`core.envelope`, amounts known only at run time
   counted at their least legal value);
2. **at run time, in the executor, on resolved values before any robot command** -- a computed
   argument once its value exists (`core.minispec.run.resolve_arg`: type, int-ness without
   rounding, schema range; then `executors.base.SegmentExecutor` re-checks the resolved call, the
   backend's hard limits and the envelope with the actual amounts).  `mf(_1*1000)` after
   `_1=ox('x')` passes here (it may be `mf(300)`), and is refused there when `_1*1000` is 550 or
   512.3: the goal fails and nothing is sent.

A value returned by a blocking call travels back to the generation as before; the guard never
needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import envelope
from .minispec import (MAX_LOOP, MAX_LOOP_PRODUCT, MAX_STEPS, Call, Cond, Else, Lit, Loop, MiniSpecError, Stmt,
                       parse_statement, string_problem, text_problem)
from .minispec import travel as static_envelope
from .minispec.check import Types, iter_calls, statement_calls, static_types
from .robots import RobotSpec, SkillSpec
from .types import SkillCall

MAX_SEGMENT_CALLS = 32  # calls written in one segment
MAX_SEGMENT_CHARS = 4096  # MiniSpec segment text
MAX_STRING_CHARS = 2000  # any string argument, whatever the schema says

_TELLO_MOVE = ((20, 500),)  # djitellopy move_*: int cm in [20, 500]
_TELLO_TURN = ((1, 360),)  # rotate_(counter_)clockwise: int degrees in [1, 360]
_TELLO_SIGNED = (-500, 500)  # TypeFly's signed move / lift: one SDK move per nonzero component
# platform -> skill name -> (lo, hi) per numeric argument (None: not numeric / no hard limit)
HARD_LIMITS: dict[str, dict[str, tuple[tuple[float, float] | None, ...]]] = {
    "tello": {
        "move_forward": _TELLO_MOVE, "move_backward": _TELLO_MOVE, "move_left": _TELLO_MOVE,
        "move_right": _TELLO_MOVE, "move_up": _TELLO_MOVE, "move_down": _TELLO_MOVE,
        "turn_cw": _TELLO_TURN, "turn_ccw": _TELLO_TURN, "delay": ((0, 10000),),
        # TypeFly's current skill names (robots/tello_typefly.yaml); `min_abs` / `nonzero` in the
        # YAML keep each SDK command within 20..500 cm / 1..360 degrees (the backend checks again)
        "move": (_TELLO_SIGNED, _TELLO_SIGNED), "lift": (_TELLO_SIGNED,), "rotate": ((-360, 360),),
    },
    "arm": {
        "move_to": ((-80, 80), (-80, 80), (0, 90)),
        "rotate_wrist": ((-180, 180),),
    },
}
# Skills whose numeric arguments must be ints on the real robot whatever the YAML says (delay is
# not a motion: milliseconds are an int in robots/tello.yaml, seconds a float in TypeFly's).
INT_ONLY = {"tello": set(HARD_LIMITS["tello"]) - {"delay"}, "arm": {"move_to", "rotate_wrist"}}


@dataclass(frozen=True, slots=True)
class PlanState:
    """What the guard knows of a plan's earlier (accepted) segments."""

    var_types: Mapping[str, Types] = field(default_factory=dict)  # variable -> value types it may hold
    travel: envelope.Travel = envelope.ZERO  # worst-path travel commanded so far (static)


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    ok: bool
    reason: str = ""  # why the segment was rejected ('' when ok)
    plan: PlanState | None = None  # the plan's state after this segment (when ok)

    def __bool__(self) -> bool:
        return self.ok


def check_segment(robot: RobotSpec, text: str, calls: Any, plan: PlanState | None = None) -> GuardVerdict:
    """Accept a segment only if `text` is one valid statement for `robot` and `calls` are exactly
    its calls, each within the schema and the robot's hard limits, its computed arguments can be
    of the right type, and the segment (and the plan so far, `plan`) stays in the envelope.
    The verdict carries the plan state to pass with the plan's next segment."""
    try:
        out = _check(robot, text, calls, plan if isinstance(plan, PlanState) else PlanState())
    except Exception as e:  # noqa: BLE001 - the guard must never take the planner down
        return GuardVerdict(False, f"internal guard error: {type(e).__name__}: {e}")
    return GuardVerdict(True, "", out) if isinstance(out, PlanState) else GuardVerdict(False, out)


def check_goal(robot: RobotSpec, goal: Any, plan: PlanState | None = None) -> GuardVerdict:
    """check_segment for a SegmentGoal (robot type included)."""
    try:
        if getattr(goal, "robot_type", None) != robot.robot_type:
            return GuardVerdict(False, f"goal is for robot type {getattr(goal, 'robot_type', None)!r}, "
                                       f"not {robot.robot_type!r}")
        return check_segment(robot, goal.text, goal.calls, plan)
    except Exception as e:  # noqa: BLE001
        return GuardVerdict(False, f"internal guard error: {type(e).__name__}: {e}")


def _check(robot: RobotSpec, text: Any, calls: Any, plan: PlanState) -> str | PlanState:
    if not isinstance(robot, RobotSpec):
        return f"robot must be a RobotSpec, got {type(robot).__name__}"
    if not isinstance(text, str):
        return f"segment text must be a string, got {type(text).__name__}"
    if not text.strip():
        return "empty segment"
    if not isinstance(calls, (tuple, list)):
        return f"calls must be a tuple of SkillCall, got {type(calls).__name__}"
    if len(calls) > MAX_SEGMENT_CALLS:
        return f"{len(calls)} calls in one segment (at most {MAX_SEGMENT_CALLS})"
    for c in calls:
        if type(c) is not SkillCall:
            return f"calls must be SkillCall objects, got {type(c).__name__}"
    if robot.language == "sentence":
        return chat_problem(robot, text, tuple(calls)) or plan
    if robot.language != "minispec":
        return f"unknown robot language {robot.language!r}"
    if len(text) > MAX_SEGMENT_CHARS:
        return f"segment longer than {MAX_SEGMENT_CHARS} characters"
    try:
        stmt, parsed = parse_statement(text, robot, check=False)
    except MiniSpecError as e:
        return f"invalid statement: {e}"
    if not same_calls(parsed, tuple(calls)):
        return calls_mismatch(tuple(calls), parsed)
    for node in iter_calls((stmt,)):
        reason = _check_call(robot, node)
        if reason:
            return reason
    product = _loop_product(stmt)
    if product > MAX_LOOP_PRODUCT:
        return f"nested loops repeat {product} times (at most {MAX_LOOP_PRODUCT})"
    steps = statement_calls(stmt)
    if steps > MAX_STEPS:
        return f"segment may execute {steps} skill calls (at most {MAX_STEPS})"
    try:
        var_types = static_types((stmt,), robot, plan.var_types)
    except MiniSpecError as e:
        return f"invalid statement: {e}"
    outside, travel = static_envelope.check_static(robot, (stmt,), plan.travel)
    if outside:
        return f"outside the flight envelope: {outside}"
    return PlanState(var_types, travel)


def chat_problem(robot: RobotSpec, text: str, calls: tuple[SkillCall, ...]) -> str | None:
    """Why a chat segment (text + its one say() call) is not acceptable, or None."""
    say = robot.skill("say")
    if say is None or len(say.args) != 1:
        return f"chat robot {robot.robot_type!r} has no say(text) skill"
    if len(calls) != 1:
        return f"a chat segment is exactly one say() call, got {len(calls)} calls"
    c = calls[0]
    if c.name != say.name or c.abbr not in (say.abbr, say.name) or len(c.args) != 1:
        return f"a chat segment is exactly one say(text) call, got {c}"
    arg = c.args[0]
    if type(arg) is not str or arg != text.strip():
        return "say() text differs from the segment text"
    limit = min(say.args[0].max_len, 8 * MAX_STRING_CHARS)
    if len(arg) > limit:
        return f"chat segment longer than {limit} characters"
    return text_problem(arg)


def _show(v: Any) -> str:
    """An argument for a message; str() of a 5000-digit int would raise."""
    if type(v) is int and not -10**18 < v < 10**18:
        return "<huge int>"
    return repr(v)[:40]


def _fmt(calls: Any, limit: int = 200) -> str:
    """Calls for a rejection message, safe for any content (huge ints, long strings)."""
    out = ", ".join(f"{c.abbr}({','.join(_show(a) for a in c.args)})" if isinstance(c, SkillCall)
                    and isinstance(c.args, tuple) else type(c).__name__ for c in calls)
    return "[" + (out if len(out) <= limit else out[:limit] + "...") + "]"


def calls_mismatch(calls: tuple[SkillCall, ...], parsed: tuple[SkillCall, ...]) -> str:
    """The rejection of a goal whose call list is not the calls written in its text."""
    return f"goal calls {_fmt(calls)} differ from the calls in the text {_fmt(parsed)}"


def same_calls(a: tuple[SkillCall, ...], b: tuple[SkillCall, ...]) -> bool:
    """Equality that does not let 1 stand for True or 50.0 for 50 (the goal's calls must be
    exactly its text's: used by the guard and again by every executor)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.name != y.name or x.abbr != y.abbr or type(x.args) is not tuple or type(y.args) is not tuple:
            return False
        if len(x.args) != len(y.args):
            return False
        for u, v in zip(x.args, y.args):
            if type(u) is not type(v) or u != v:
                return False
    return True


def _check_call(robot: RobotSpec, node: Call) -> str | None:
    c = node.call
    spec: SkillSpec | None = robot.skills.get(c.name)
    if spec is None:
        return f"unknown skill {c.name!r} for robot type {robot.robot_type!r}"
    if c.abbr not in (spec.abbr, spec.name):
        return f"{c.abbr!r} is not a name of skill {spec.name!r}"
    if len(c.args) != len(spec.args) or len(node.args) != len(spec.args):
        return f"{c.abbr}: takes {len(spec.args)} argument(s), got {len(c.args)}"
    hard = HARD_LIMITS.get(robot.hardware, {}).get(spec.name, ())
    int_only = spec.name in INT_ONLY.get(robot.hardware, ())
    for i, (a, v, e) in enumerate(zip(spec.args, c.args, node.args)):
        where = f"{c.abbr}: argument {a.name!r}"
        if not isinstance(e, Lit):
            if v is not None:
                return f"{where} is computed but the call carries the value {_show(v)}"
            continue  # its static type is checked below; its value at run time (module doc)
        if a.type == "str":
            if type(v) is not str:
                return f"{where} must be a string, got {v!r}"
            if len(v) > min(a.max_len, MAX_STRING_CHARS):
                return f"{where} longer than {min(a.max_len, MAX_STRING_CHARS)} characters"
            problem = string_problem(v)
            if problem:
                return f"{where}: {problem}"
            if a.choices and v not in a.choices:
                return f"{where} must be one of {list(a.choices)}"
            continue
        if a.type == "int" or int_only:
            if type(v) is not int:
                return f"{where} must be an int, got {v!r}"
        elif a.type == "float":
            if type(v) not in (int, float) or not math.isfinite(v):
                return f"{where} must be a finite number, got {v!r}"
        else:
            return f"{where} has unknown type {a.type!r}"
        shown = _show(v)
        if (a.min is not None and v < a.min) or (a.max is not None and v > a.max):
            return f"{where}={shown} outside {a.min}..{a.max}"
        lim = hard[i] if i < len(hard) else None
        if lim is not None and not lim[0] <= v <= lim[1]:
            return f"{where}={shown} outside the robot's hard limit {lim[0]}..{lim[1]}"
        problem = a.check(v)  # the schema's own check as well
        if problem:
            return f"{c.abbr}: {problem}"
    return None


def _loop_product(stmt: Stmt) -> int:
    """Largest product of nested loop counts; also rejects counts above MAX_LOOP via the value."""
    if isinstance(stmt, Loop):
        inner = max((_loop_product(s) for s in stmt.body), default=1)
        count = stmt.count if 1 <= stmt.count <= MAX_LOOP else MAX_LOOP_PRODUCT + 1
        return count * inner
    if isinstance(stmt, Cond):
        return max((_loop_product(s) for s in stmt.body), default=1)
    if isinstance(stmt, Else):
        return max([_loop_product(s) for s in stmt.body] + ([_loop_product(stmt.cond)] if stmt.cond else []),
                   default=1)
    return 1
