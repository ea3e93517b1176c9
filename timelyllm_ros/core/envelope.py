"""Flight envelope: how far, how much turning, how high and how long one segment and one plan may
command, from the robot YAML (`envelope:` + each skill's `travel:`).  Pure; no I/O.

Per-call ranges (the schema, the SDK's hard limits) bound one call, not the motion: `10{100{mf(500)}}`
is 5 km of valid calls.  The envelope bounds the sum, in two places:

* statically (dispatch guard, `core/minispec/travel.static_travel`): the travel of a segment's *worst path* (every loop
  run in full, every conditional taken, the costlier branch of an if/else), where an amount known
  only at run time counts at its *least* legal value -- so the guard rejects a segment that will
  exceed the envelope on some path whatever its variables hold, and leaves the rest to
* run time (executor, `EnvelopeTracker.charge`): each resolved call is charged before it is sent;
  the first call that would leave the segment's or the plan's envelope is refused, nothing is sent.

The executor also keeps a *flight* account (`FlightAccount`): everything the robot flew since
takeoff (or within a sliding time window), whoever sent the goals and whatever their request ids,
bounded by `envelope.flight` (default: the plan's limits) -- so goals sent straight to an executor
under fresh request ids cannot add up past the envelope -- and it checks each goal as a whole
(`EnvelopeTracker.precheck`, worst path) before its first command.

Axes: `distance_cm` (path length of moves, up/down included), `turn_deg` (total rotation),
`climb_cm` (highest point above where the segment / plan started: net up minus down), and
`duration_s` (the robot's exec-time model: nominal for parametric skills, max_s for variable ones).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from .types import SkillCall, Value

if TYPE_CHECKING:  # robots.py parses envelopes with this module
    from .robots import RobotSpec, SkillSpec

AXES = ("distance_cm", "turn_deg", "climb_cm", "duration_s")
TRAVEL_AXES = ("distance_cm", "turn_deg", "climb_cm")  # what a skill's `travel:` may name


@dataclass(frozen=True, slots=True)
class Travel:
    """Motion commanded by a piece of plan (path length, rotation, net climb and its peak, time)."""

    distance_cm: float = 0.0
    turn_deg: float = 0.0
    climb_cm: float = 0.0  # net height change at the end
    peak_cm: float = 0.0  # highest net climb reached on the way (>= 0)
    duration_s: float = 0.0

    def then(self, b: "Travel") -> "Travel":
        """This, followed by b."""
        return Travel(self.distance_cm + b.distance_cm, self.turn_deg + b.turn_deg, self.climb_cm + b.climb_cm,
                      max(self.peak_cm, self.climb_cm + b.peak_cm), self.duration_s + b.duration_s)

    def worst(self, b: "Travel") -> "Travel":
        """The worse of two alternatives, axis by axis."""
        return Travel(max(self.distance_cm, b.distance_cm), max(self.turn_deg, b.turn_deg),
                      max(self.climb_cm, b.climb_cm), max(self.peak_cm, b.peak_cm), max(self.duration_s, b.duration_s))

    def repeat(self, k: int) -> "Travel":
        out = ZERO
        for _ in range(max(0, k)):
            out = out.then(self)
        return out


ZERO = Travel()


@dataclass(frozen=True, slots=True)
class Limits:
    distance_cm: float = math.inf
    turn_deg: float = math.inf
    climb_cm: float = math.inf
    duration_s: float = math.inf

    def exceeded(self, t: Travel, scope: str) -> str | None:
        """Why t leaves these limits (None if it does not)."""
        for axis, used in (("distance_cm", t.distance_cm), ("turn_deg", t.turn_deg), ("climb_cm", t.peak_cm),
                           ("duration_s", t.duration_s)):
            limit = getattr(self, axis)
            if used > limit + 1e-9:
                return f"{scope} would command {axis} {used:g} (envelope {limit:g})"
        return None


@dataclass(frozen=True, slots=True)
class Envelope:
    segment: Limits = field(default_factory=Limits)
    plan: Limits = field(default_factory=Limits)
    flight: Limits | None = None  # what one robot flies since takeoff / in a window (None: the plan's)

    @property
    def flight_limits(self) -> Limits:
        return self.flight if self.flight is not None else self.plan


class EnvelopeError(ValueError):
    """An envelope / travel entry in a robot YAML is malformed."""


def parse_envelope(d: Any, where: str) -> Envelope:
    if not isinstance(d, Mapping):
        raise EnvelopeError(f"{where}: envelope must be a mapping with 'segment', 'plan' and/or 'flight'")
    extra = set(d) - {"segment", "plan", "flight"}
    if extra:
        raise EnvelopeError(f"{where}: envelope has unknown keys {sorted(extra)} (allowed: segment, plan, flight)")
    return Envelope(**{scope: _limits(d[scope], f"{where}: envelope.{scope}")
                       for scope in ("segment", "plan", "flight") if scope in d})


def _limits(d: Any, where: str) -> Limits:
    if not isinstance(d, Mapping):
        raise EnvelopeError(f"{where} must be a mapping of {list(AXES)}")
    extra = set(d) - set(AXES)
    if extra:
        raise EnvelopeError(f"{where} has unknown keys {sorted(extra)} (allowed: {list(AXES)})")
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise EnvelopeError(f"{where}.{k} must be a positive number, got {v!r}")
    return Limits(**{k: float(v) for k, v in d.items()})


def parse_travel(d: Any, where: str, arg_names: dict[str, str]) -> tuple[tuple[str, float, str], ...]:
    """`travel: {distance_cm: distance, climb_cm: -distance, turn_deg: 360}` -> (axis, coef, arg) entries;
    arg '' means the coefficient is the amount itself.  arg_names: the skill's args -> their types."""
    if not isinstance(d, Mapping):
        raise EnvelopeError(f"{where}: travel must be a mapping of {list(TRAVEL_AXES)}")
    out = []
    items = [(axis, x) for axis, v in d.items() for x in (v if isinstance(v, list) and v else [v])]
    for axis, v in items:  # an axis may list several terms: `distance_cm: [dx, dy]` (|dx| + |dy|)
        if axis not in TRAVEL_AXES:
            raise EnvelopeError(f"{where}: travel has unknown axis {axis!r} (allowed: {list(TRAVEL_AXES)})")
        if isinstance(v, bool):
            raise EnvelopeError(f"{where}: travel.{axis} must be a number or an argument name, got {v!r}")
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append((axis, float(v), ""))
            continue
        if isinstance(v, str):
            sign, name = (-1.0, v[1:]) if v.startswith("-") else (1.0, v)
            if arg_names.get(name) in ("int", "float"):
                out.append((axis, sign, name))
                continue
        raise EnvelopeError(f"{where}: travel.{axis} must be a number or a numeric argument's name "
                            f"(optionally '-name'), got {v!r}")
    return tuple(out)


def call_travel(spec: SkillSpec, args: tuple[Value, ...] | None) -> Travel:
    """The travel of one call; args None (or a None entry) = not known yet: the least legal amount."""
    amounts = {"distance_cm": 0.0, "turn_deg": 0.0, "climb_cm": 0.0}
    known: dict[str, float] = {}
    for a, v in zip(spec.args, args or ()):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            known[a.name] = float(v)
    for axis, coef, arg in spec.travel:
        if not arg:
            amounts[axis] += coef
        elif arg in known:
            amounts[axis] += coef * known[arg] if axis == "climb_cm" else abs(coef * known[arg])
        else:
            a = next(x for x in spec.args if x.name == arg)
            lo = float(a.min) if a.min is not None else 0.0
            hi = float(a.max) if a.max is not None else lo
            if axis == "climb_cm":
                amounts[axis] += min(coef * lo, coef * hi)
            else:
                amounts[axis] += abs(coef) * max(0.0, lo)
    model = spec.exec_time
    if model.variable:
        duration = float(model.max_s or 0.0)
    else:
        unit = spec.exec_time.unit_arg
        if unit and unit not in known:
            a = next(x for x in spec.args if x.name == unit)
            known_for_time = {unit: float(a.min) if a.min is not None else 0.0}
        else:
            known_for_time = known
        duration = model.nominal(known_for_time)
    climb = amounts["climb_cm"]
    return Travel(amounts["distance_cm"], amounts["turn_deg"], climb, max(0.0, climb), duration)


# ---------------------------------------------------------------- run time


class FlightAccount:
    """What one robot has been commanded since takeoff, or within the last `window_s` seconds
    (executor side; one per executor, shared by every goal whatever its request id)."""

    def __init__(self, robot: RobotSpec, *, window_s: float = 0.0) -> None:
        if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"flight window must be >= 0 seconds (0: since takeoff), got {window_s!r}")
        self.robot = robot
        self.window_s = float(window_s)
        self._charges: collections.deque[tuple[float, Travel]] = collections.deque()  # window: (time, travel)
        self._total = ZERO  # since takeoff (window_s == 0): the running sum

    def reset(self) -> None:
        """The robot landed: the next takeoff starts a new flight."""
        self._charges.clear()
        self._total = ZERO

    def used(self, now: float) -> Travel:
        """Travel commanded in the window (since takeoff when window_s is 0)."""
        if self.window_s == 0:
            return self._total
        cutoff = now - self.window_s
        while self._charges and self._charges[0][0] < cutoff:
            self._charges.popleft()
        out = ZERO
        for _, t in self._charges:
            out = out.then(t)
        return out

    def add(self, t: Travel, now: float) -> None:
        if self.window_s == 0:
            self._total = self._total.then(t)
        else:
            self._charges.append((now, t))

    def scope(self) -> str:
        return f"the last {self.window_s:g} s of flight" if self.window_s > 0 else "this flight (since takeoff)"


class EnvelopeTracker:
    """What one plan has commanded so far (executor side); `charge` before each call is sent.
    With a `FlightAccount`, the robot's flight envelope is charged and checked as well."""

    def __init__(self, robot: RobotSpec, flight: FlightAccount | None = None) -> None:
        self.robot = robot
        self.plan = ZERO
        self.segment = ZERO
        self.flight = flight

    def begin_segment(self) -> None:
        self.segment = ZERO

    def precheck(self, seg: Travel, now: float = 0.0) -> str | None:
        """Why a goal commanding `seg` as a whole (its worst path: `static_travel`) would leave the
        segment's, the plan's or the flight's envelope -- before anything is sent (None if not)."""
        env = self.robot.envelope
        if env is None:
            return None
        reason = env.segment.exceeded(seg, "goal") or env.plan.exceeded(self.plan.then(seg), "plan")
        return reason or self._flight_reason(seg, now)

    def _flight_reason(self, t: Travel, now: float) -> str | None:
        env = self.robot.envelope
        if env is None or self.flight is None:
            return None
        used = self.flight.used(now)
        reason = env.flight_limits.exceeded(used.then(t), self.flight.scope())
        return f"{reason} (already flown: {used.distance_cm:g} cm, {used.turn_deg:g} deg)" if reason else None

    def charge(self, call: SkillCall, spec: SkillSpec, now: float = 0.0) -> str | None:
        """Add the resolved call's travel if it stays within the envelope; else say why (nothing added)."""
        env = self.robot.envelope
        t = call_travel(spec, call.args)
        seg, plan = self.segment.then(t), self.plan.then(t)
        if env is not None:
            reason = (env.segment.exceeded(seg, "segment") or env.plan.exceeded(plan, "plan")
                      or self._flight_reason(t, now))
            if reason:
                return f"{call}: {reason}; not sent"
        self.segment, self.plan = seg, plan
        if self.flight is not None:
            self.flight.add(t, now)
        return None
