"""Simulated robots: a Dispatcher that executes segment goals in virtual time.

Why: the paper's end-to-end numbers (Fig. 5, 9, 10) come from replaying LRTrace workloads with
robots simulated from profiled execution times and an 8 ms network latency (§7.2).  This module
is that replay's robot side: each robot id runs its segments strictly in order (FIFO), a goal
arrives `network_latency_s` after dispatch, starts when it has arrived and the previous segment
has ended, and lasts what the skills' execution-time models sample.  MiniSpec statements are
interpreted (conditionals, loops, variables) with `core.minispec.run_statement`, so a plan's
blocking perception calls return deterministic simulated answers.  Faults (rejects, aborts,
timeouts, slow robots, disconnects) can be injected for reliability tests.

Determinism: every random draw of a segment comes from generators seeded by
(seed, robot id, request id, segment index), so results do not depend on how goals of different
robots interleave, nor on whether faults are enabled.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..core.clock import Clock
from ..core.robots import RobotSpec, SkillSpec
from ..core.types import ResultCode, SegmentGoal, SegmentResult, SkillCall, Value

try:  # the interpreter is optional: without it a segment's calls run flat, in order
    from ..core.minispec import MiniSpecError, parse_statement, run_statement
except ImportError:  # pragma: no cover - only when core.minispec is absent
    parse_statement = run_statement = None  # type: ignore[assignment]

    class MiniSpecError(ValueError):  # type: ignore[no-redef]
        pass

Schedule = Callable[[float, Callable[[], None]], None]
Answer = Callable[[SkillCall, SkillSpec, random.Random], Value]


class FaultError(ValueError):
    """A FaultConfig is malformed."""


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Faults injected per goal (probabilities are exclusive: at most one fault per goal)."""

    reject_p: float = 0.0  # the executor refuses the goal on arrival -> REJECTED
    abort_p: float = 0.0  # fails part-way through its calls -> ABORTED
    timeout_p: float = 0.0  # never answers; reported after timeout_s -> TIMEOUT
    timeout_s: float = 10.0  # how long a hung goal keeps its robot before TIMEOUT is reported
    slow_factor: float = 1.0  # execution times are multiplied by this ...
    slow_robots: frozenset[str] = frozenset()  # ... on these robot ids (empty: on all robots)
    disconnects: Mapping[str, float] = field(default_factory=dict)  # robot id -> virtual time it goes away

    def __post_init__(self) -> None:
        for name in ("reject_p", "abort_p", "timeout_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise FaultError(f"{name} must be a probability in [0, 1], got {v!r}")
        if self.reject_p + self.abort_p + self.timeout_p > 1.0 + 1e-12:
            raise FaultError("reject_p + abort_p + timeout_p must not exceed 1")
        for name in ("timeout_s", "slow_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise FaultError(f"{name} must be a finite number > 0, got {v!r}")
        if not isinstance(self.slow_robots, (frozenset, set, tuple, list)):
            raise FaultError("slow_robots must be a set of robot ids")
        object.__setattr__(self, "slow_robots", frozenset(self.slow_robots))
        if not isinstance(self.disconnects, Mapping):
            raise FaultError("disconnects must map robot id -> time")
        for rid, t in self.disconnects.items():
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise FaultError(f"disconnect time of {rid!r} must be a finite number, got {t!r}")


def default_answer(true_p: float) -> Answer:
    """Simulated perception: bool skills say True with probability true_p; numbers in [0, 1)."""

    def answer(call: SkillCall, spec: SkillSpec, rng: random.Random) -> Value:
        if spec.returns == "bool":
            return rng.random() < true_p
        if spec.returns == "float":
            return round(rng.random(), 3)
        if spec.returns == "str":
            return "yes" if rng.random() < true_p else "no"
        return None

    return answer


class _Abort(Exception):
    """Internal: stop interpreting a statement (the robot was interrupted)."""


@dataclass(slots=True)
class _Job:
    goal: SegmentGoal
    arrival: float
    done: bool = False
    start: float | None = None
    end: float | None = None
    durations: tuple[float, ...] = ()  # per executed call, as planned at start
    result: SegmentResult | None = None  # what is reported at `end` unless cancelled first


@dataclass(slots=True)
class _Robot:
    robot_id: str
    queue: deque[_Job] = field(default_factory=deque)
    current: _Job | None = None


class SimulatedRobots:
    """Dispatcher port over simulated robots in virtual time (see the module docstring).

    `schedule(t, fn)` must run `fn` when the virtual clock reaches t (the runner's event queue);
    results are delivered through `post_result` from those callbacks.
    """

    def __init__(self, clock: Clock, robots: Mapping[str, RobotSpec],
                 post_result: Callable[[SegmentResult], None], schedule: Schedule, seed: int = 0,
                 network_latency_s: float = 0.008, faults: FaultConfig = FaultConfig(), *,
                 perception_true_p: float = 0.8, answer: Answer | None = None) -> None:
        if isinstance(network_latency_s, bool) or not isinstance(network_latency_s, (int, float)) \
                or not math.isfinite(network_latency_s) or network_latency_s < 0:
            raise ValueError(f"network_latency_s must be a finite number >= 0, got {network_latency_s!r}")
        if not 0.0 <= perception_true_p <= 1.0:
            raise ValueError(f"perception_true_p must be in [0, 1], got {perception_true_p!r}")
        if not isinstance(faults, FaultConfig):
            raise TypeError("faults must be a FaultConfig")
        self.clock = clock
        self.robots = dict(robots)
        self.post_result = post_result
        self.schedule = schedule
        self.seed = seed
        self.network_latency_s = float(network_latency_s)
        self.faults = faults
        self.answer = answer or default_answer(perception_true_p)
        self._robots: dict[str, _Robot] = {}
        self._jobs: dict[str, list[_Job]] = {}  # by request id, not yet reported
        self._env: dict[str, dict[str, Value]] = {}  # per request: MiniSpec variables / if-chain
        self.dispatched = 0
        self.reported: dict[str, int] = {c.name: 0 for c in ResultCode}

    # --- Dispatcher port -------------------------------------------------------------------
    def dispatch(self, goal: SegmentGoal) -> None:
        if not isinstance(goal, SegmentGoal):
            raise TypeError(f"dispatch needs a SegmentGoal, got {type(goal).__name__}")
        job = _Job(goal, self.clock.now() + self.network_latency_s)
        self._jobs.setdefault(goal.request_id, []).append(job)
        self.dispatched += 1
        self.schedule(job.arrival, lambda: self._arrive(job))

    def cancel(self, request_id: str) -> None:
        """Stop what this request runs on its robot and drop its queued or in-flight goals."""
        now = self.clock.now()
        restart: list[_Robot] = []
        for job in list(self._jobs.get(request_id, ())):
            if job.done:
                continue
            robot = self._robots.get(job.goal.robot_id)
            if robot is not None and robot.current is job:
                assert job.start is not None
                done, elapsed, t = 0, [], job.start
                for d in job.durations:
                    if t + d > now:
                        break
                    t += d
                    done += 1
                    elapsed.append(d)
                self._report(job, ResultCode.CANCELLED, job.start, now, tuple(elapsed), done,
                             error="cancelled while executing")
                robot.current = None
                restart.append(robot)
            else:
                self._report(job, ResultCode.CANCELLED, now, now, error="cancelled before it started")
        self._env.pop(request_id, None)
        for robot in restart:
            self._start_next(robot)

    # --- introspection -----------------------------------------------------------------------
    def busy(self) -> bool:
        """Any goal not yet reported."""
        return any(not j.done for jobs in self._jobs.values() for j in jobs)

    def queue_length(self, robot_id: str) -> int:
        r = self._robots.get(robot_id)
        if r is None:
            return 0
        return sum(1 for j in r.queue if not j.done) + (1 if r.current is not None else 0)

    # --- event handlers ----------------------------------------------------------------------
    def _arrive(self, job: _Job) -> None:
        if job.done:
            return
        g, now = job.goal, self.clock.now()
        robot = self._robots.setdefault(g.robot_id, _Robot(g.robot_id))
        if self._disconnected(g.robot_id, now):
            self._report(job, ResultCode.DISCONNECTED, now, now, error=f"robot {g.robot_id} is disconnected")
            return
        problem = self._check(g)
        if problem:
            self._report(job, ResultCode.REJECTED, now, now, error=problem)
            return
        if self._fault_rng(g).random() < self.faults.reject_p:
            self._report(job, ResultCode.REJECTED, now, now, error="simulated fault: goal rejected")
            return
        robot.queue.append(job)
        if robot.current is None:
            self._start_next(robot)

    def _start_next(self, robot: _Robot) -> None:
        while robot.queue and robot.current is None:
            job = robot.queue.popleft()
            if job.done:
                continue
            now = self.clock.now()
            if self._disconnected(robot.robot_id, now):
                self._report(job, ResultCode.DISCONNECTED, now, now,
                             error=f"robot {robot.robot_id} is disconnected")
                continue
            self._plan_execution(job, now)
            robot.current = job
            assert job.end is not None
            self.schedule(job.end, lambda r=robot, j=job: self._complete(r, j))

    def _complete(self, robot: _Robot, job: _Job) -> None:
        if job.done or robot.current is not job:
            return  # cancelled meanwhile
        robot.current = None
        r = job.result
        assert r is not None
        self._report(job, r.code, r.exec_start, r.exec_end, r.call_durations_s, r.calls_done,
                     value=r.value, error=r.error)
        self._start_next(robot)

    # --- execution model ---------------------------------------------------------------------
    def _plan_execution(self, job: _Job, start: float) -> None:
        """Decide now (at exec start) what the segment does, how long it takes and how it ends."""
        g = job.goal
        spec = self.robots[g.robot_type]
        rng = random.Random(f"{self.seed}|exec|{g.robot_id}|{g.request_id}|{g.segment_index}")
        factor = self.faults.slow_factor if (not self.faults.slow_robots
                                             or g.robot_id in self.faults.slow_robots) else 1.0
        durations: list[float] = []

        def call_skill(call: SkillCall) -> Value:
            skill = spec.skill(call.name) or spec.skill(call.abbr)
            if skill is None:  # _check parsed the statement, so this is a bug elsewhere
                raise MiniSpecError(f"unknown skill {call.name!r}")
            value = self.answer(call, skill, rng)
            durations.append(self._duration(spec, skill, call, value, rng) * factor)
            return value

        code, error, value = ResultCode.OK, "", None
        try:
            value = self._run(g, spec, call_skill)
        except (MiniSpecError, RuntimeError) as e:
            code, error = ResultCode.ABORTED, f"statement failed on the robot: {e}"
        frng = self._fault_rng(g)
        f = self.faults
        u = frng.random() - f.reject_p  # the same draw decided rejection at arrival
        end = start + sum(durations)
        calls_done = len(durations)
        if code is ResultCode.OK and 0 <= u < f.abort_p:
            k = frng.randrange(len(durations)) if durations else 0
            partial = frng.random() * (durations[k] if durations else 0.0)
            end = start + sum(durations[:k]) + partial
            durations, calls_done, value = durations[:k], k, None
            code, error = ResultCode.ABORTED, f"simulated fault: aborted during call {k}"
        elif code is ResultCode.OK and 0 <= u - f.abort_p < f.timeout_p:
            end = start + f.timeout_s
            durations, calls_done, value = [], 0, None
            code, error = ResultCode.TIMEOUT, f"simulated fault: no answer within {f.timeout_s:g} s"
        d = self.faults.disconnects.get(g.robot_id)
        if d is not None and start <= d < end:
            done, t = 0, start
            for x in durations:
                if t + x > d:
                    break
                t += x
                done += 1
            durations, calls_done, end, value = durations[:done], done, d, None
            code, error = ResultCode.DISCONNECTED, f"robot {g.robot_id} disconnected at t={d:g}"
        job.start, job.end, job.durations = start, end, tuple(durations)
        job.result = SegmentResult(g.request_id, g.segment_index, code, start, end, tuple(durations),
                                   calls_done, value, error)

    def _run(self, g: SegmentGoal, spec: RobotSpec, call_skill: Callable[[SkillCall], Value]) -> Value:
        if spec.language == "minispec" and run_statement is not None:
            env = self._env.setdefault(g.request_id, {})
            return run_statement(g.text, spec, call_skill, env)
        value: Value = None
        for c in g.calls:  # chat sentences (one say() call), or no interpreter available
            value = call_skill(c)
        return value

    @staticmethod
    def _duration(spec: RobotSpec, skill: SkillSpec, call: SkillCall, value: Value,
                  rng: random.Random) -> float:
        m = skill.exec_time
        if spec.language == "sentence":
            words = len(str(call.args[0]).split()) if call.args else 0
            if m.per_word_s > 0:
                return m.sample(rng, words=words)
            return words * 60.0 / spec.words_per_minute
        if m.variable and skill.returns == "bool" and value is False:
            return float(m.max_s)  # a search that finds nothing runs its full course
        return m.sample(rng, skill.arg_map(call.args))

    def _check(self, g: SegmentGoal) -> str:
        spec = self.robots.get(g.robot_type)
        if spec is None:
            return f"unknown robot type {g.robot_type!r}"
        if spec.language == "minispec" and parse_statement is not None:
            try:
                parse_statement(g.text, spec)
            except MiniSpecError as e:
                return f"invalid statement: {e}"
            return ""
        if not g.calls:
            return "segment has no skill calls"
        for c in g.calls:
            skill = spec.skill(c.name) or spec.skill(c.abbr)
            if skill is None:
                return f"robot type {g.robot_type!r} has no skill {c.name!r}"
            if len(c.args) != len(skill.args):
                return f"{skill.name} takes {len(skill.args)} arguments, got {len(c.args)}"
            for a, v in zip(skill.args, c.args):
                problem = a.check(v)
                if problem:
                    return f"{skill.name}: {problem}"
        return ""

    # --- helpers -----------------------------------------------------------------------------
    def _fault_rng(self, g: SegmentGoal) -> random.Random:
        return random.Random(f"{self.seed}|fault|{g.robot_id}|{g.request_id}|{g.segment_index}")

    def _disconnected(self, robot_id: str, t: float) -> bool:
        d = self.faults.disconnects.get(robot_id)
        return d is not None and t >= d

    def _report(self, job: _Job, code: ResultCode, start: float, end: float,
                durations: tuple[float, ...] = (), calls_done: int = 0, *, value: Value = None,
                error: str = "") -> None:
        job.done = True
        jobs = self._jobs.get(job.goal.request_id)
        if jobs is not None:
            jobs.remove(job)
            if not jobs:
                del self._jobs[job.goal.request_id]
        self.reported[code.name] += 1
        self.post_result(SegmentResult(job.goal.request_id, job.goal.segment_index, code, start, end,
                                       tuple(durations), calls_done, value, error))
