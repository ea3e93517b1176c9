"""Execution-time estimates E(segment): the offline profile, corrected online by executor results.

Parametric skills learn a per-(robot type, skill) multiplicative correction of the profile (EWMA of
measured / profiled, clamped so one bad measurement cannot swing the scheduler: bounded influence).
Variable skills (scan, goto, ...) keep the paper's rule — estimate the *minimum* — and learn only
a lower observed minimum, bounded below by half the profiled one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .robots import RobotSpec, SkillSpec
from .types import SkillCall


@dataclass(slots=True)
class _Learned:
    factor: float = 1.0
    min_s: float | None = None
    samples: int = 0


@dataclass(slots=True)
class ExecTimeEstimator:
    robots: dict[str, RobotSpec]
    weight: float = 0.2  # EWMA weight of a new measurement
    max_factor: float = 3.0  # correction stays within [1/max_factor, max_factor]
    _learned: dict[tuple[str, str], _Learned] = field(default_factory=dict)

    def _spec(self, robot_type: str, call: SkillCall) -> SkillSpec | None:
        robot = self.robots.get(robot_type)
        return robot.skill(call.name) or robot.skill(call.abbr) if robot else None

    def estimate_call(self, robot_type: str, call: SkillCall) -> float:
        spec = self._spec(robot_type, call)
        if spec is None:
            return 0.0
        words = len(str(call.args[0]).split()) if spec.exec_time.per_word_s and call.args else 0
        nominal = spec.exec_time.nominal(spec.arg_map(call.args), words)
        learned = self._learned.get((robot_type, spec.name))
        if learned is None:
            return nominal
        if spec.exec_time.variable:
            return learned.min_s if learned.min_s is not None else nominal
        return nominal * learned.factor

    def estimate(self, robot_type: str, calls: Iterable[SkillCall]) -> float:
        """E(segment): sum over its calls (loops/conditionals are counted once: an estimate)."""
        return sum(self.estimate_call(robot_type, c) for c in calls)

    def update(self, robot_type: str, call: SkillCall, measured_s: float) -> None:
        """Learn from one measured call duration reported by an executor."""
        spec = self._spec(robot_type, call)
        if spec is None or not (measured_s >= 0.0) or measured_s == float("inf"):
            return
        key = (robot_type, spec.name)
        learned = self._learned.setdefault(key, _Learned())
        learned.samples += 1
        model = spec.exec_time
        if model.variable:
            floor = 0.5 * (model.min_s or 0.0)
            cur = learned.min_s if learned.min_s is not None else (model.min_s or 0.0)
            learned.min_s = max(floor, min(cur, measured_s))
            return
        words = len(str(call.args[0]).split()) if model.per_word_s and call.args else 0
        nominal = model.nominal(spec.arg_map(call.args), words)
        if nominal <= 0:
            return
        ratio = min(self.max_factor, max(1.0 / self.max_factor, measured_s / nominal))
        learned.factor = (1 - self.weight) * learned.factor + self.weight * ratio

    def correction(self, robot_type: str, skill_name: str) -> float:
        """Current learned factor (1.0 = profile), for status and tests."""
        learned = self._learned.get((robot_type, skill_name))
        return learned.factor if learned else 1.0
