"""Flight envelope: how far, how much turning, how high and how long one segment and one plan may
command, from the robot YAML (`envelope:` + each skill's `travel:`).  Pure; no I/O.

Per-call ranges (the schema, the SDK's hard limits) bound one call, not the motion: `10{100{mf(500)}}`
is 5 km of valid calls.  The envelope bounds the sum, in two places:

* statically (dispatch guard, `minispec/travel.static_travel`): the travel of a segment's *worst path* (every loop
  run in full, every conditional taken, the costlier branch of an if/else), where an amount known
  only at run time counts at its *least* legal value -- so the guard rejects a segment that will
  exceed the envelope on some path whatever its variables hold, and leaves the rest to
* run time (executor, `core/flight.EnvelopeTracker.charge`): each resolved call is charged before it is sent;
  the first call that would leave the segment's or the plan's envelope is refused, nothing is sent.

The executor also keeps a *flight* account (`core/flight.FlightAccount`): everything the robot flew since
takeoff (or within a sliding time window), whoever sent the goals and whatever their request ids,
bounded by `envelope.flight` (default: the plan's limits) -- so goals sent straight to an executor
under fresh request ids cannot add up past the envelope -- and it checks each goal as a whole
(`EnvelopeTracker.precheck`, worst path) before its first command.

Axes: `distance_cm` (path length of moves, up/down included), `turn_deg` (total rotation),
`climb_cm` (highest point above where the segment / plan started: net up minus down), and
`duration_s` (the robot's exec-time model: nominal for parametric skills, max_s for variable ones).

This module holds the limits and their parsing, below `core/robots.py` (a RobotSpec holds its
Envelope) and importing nothing of the project; what a call commands and the run-time accounts are
`core/flight.py`, the static worst path `core/minispec/travel.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

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
