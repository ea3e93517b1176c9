"""The flight envelope per call and at run time (executor side): what one call commands
(`call_travel`), the run-time tracker that charges each resolved call against the segment's and
the plan's envelope before it is sent (`EnvelopeTracker`), and the robot's flight account since
takeoff or within a window, whoever sent the goals (`FlightAccount`).  The envelope's limits and
their parsing are `core/envelope.py` (below `core/robots.py`, which holds them); the static worst
path over a MiniSpec AST is `core/minispec/travel.py`.  Pure; no I/O.
"""

from __future__ import annotations

import collections
import math

from .envelope import ZERO, Travel
from .robots import RobotSpec, SkillSpec
from .types import SkillCall, Value


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
