"""Simulated robots (drone, arm, chat): each skill call takes a duration drawn from the robot's
execution-time model (robots/<type>.yaml, `ExecTimeModel.sample` with a seeded rng) and answers
perception skills from a `Perception` source.

`time_scale` shrinks wall-clock sleeps (tests run at 0.001-0.01); the durations reported to the
planner are the measured ones, so the planner sees what really happened.
"""

from __future__ import annotations

import random
import threading

from timelyllm_ros.core.robots import RobotSpec, SkillSpec
from timelyllm_ros.core.types import SegmentGoal, SkillCall, Value

from .base import CallContext, Perception, SimulatedPerception


class SimulatedBackend:
    def __init__(self, robot: RobotSpec, *, seed: int = 0, time_scale: float = 1.0,
                 perception: Perception | None = None) -> None:
        if not time_scale >= 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.robot = robot
        self.time_scale = float(time_scale)
        self.perception = perception or SimulatedPerception()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls: list[tuple[SkillCall, float]] = []  # (call, sampled robot seconds), for inspection
        self.halts: list[str] = []

    def start(self) -> None:
        pass

    def validate(self, call: SkillCall, spec: SkillSpec) -> str | None:
        return None  # the YAML schema is the whole truth for a simulated robot

    def begin_goal(self, goal: SegmentGoal, ctx: CallContext) -> None:
        pass

    def sample_duration(self, call: SkillCall, spec: SkillSpec) -> float:
        words = sum(len(a.split()) for a in call.args if isinstance(a, str)) if spec.exec_time.per_word_s else 0
        with self._lock:
            return spec.exec_time.sample(self._rng, spec.arg_map(call.args), words)

    def call(self, call: SkillCall, spec: SkillSpec, ctx: CallContext) -> Value:
        robot_s = self.sample_duration(call, spec)
        self.calls.append((call, robot_s))
        ctx.sleep(robot_s * self.time_scale)
        return self.perception.query(call, spec) if spec.returns != "none" else None

    def halt(self, reason: str) -> None:
        self.halts.append(reason)

    def land(self, reason: str) -> str:
        """on_planner_lost: land (a simulated robot has no pose: recorded like a halt)."""
        self.halts.append(f"land: {reason}")
        return f"{self.robot.robot_type} landed (simulated)"

    def close(self) -> None:
        pass
