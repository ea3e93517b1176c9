"""Executor core: run one plan segment on a robot through a skill backend.

`SegmentExecutor` owns everything every robot shares: schema validation of the whole segment
before the robot moves, the MiniSpec interpreter (`core.minispec.run_statement`) with per-plan
variables, the run-time half of validation (each *resolved* call -- computed arguments included --
is checked against the schema, the backend's hard limits and the plan's flight envelope
(`core.envelope.EnvelopeTracker`) before the backend sees it; see `core.guard`), per-call timing,
feedback, cancellation, a per-goal timeout, and mapping failures to `ResultCode`s so a goal always
ends with a result.  On every failure after the goal started the backend is halted and the result
says where the robot was left (e.g. "drone hovering (stop sent)" / "drone landed").  A `SkillBackend` only knows how to run one
skill call on its robot (simulated sleep, djitellopy SDK command, ...).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from timelyllm_ros.core import guard as _guard
from timelyllm_ros.core.envelope import ZERO
from timelyllm_ros.core.flight import EnvelopeTracker, FlightAccount, call_travel
from timelyllm_ros.core.minispec.travel import static_travel
from timelyllm_ros.core.robots import RobotSpec, SkillSpec
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall, Value

log = logging.getLogger(__name__)

try:  # written by another part of the project; the flat-call fallback keeps executors usable
    from timelyllm_ros.core import minispec as _minispec
except ImportError:  # pragma: no cover - only while minispec.py is absent
    _minispec = None  # type: ignore[assignment]


class ExecError(Exception):
    """A segment failed; `code` is what the planner is told."""

    code = ResultCode.ABORTED


class Cancelled(ExecError):
    code = ResultCode.CANCELLED


class GoalTimeout(ExecError):
    code = ResultCode.TIMEOUT


class SkillRejected(ExecError):
    """The call is not allowed (unknown skill, bad argument): nothing was sent to the robot."""

    code = ResultCode.REJECTED


class SkillFailed(ExecError):
    """The robot or its SDK reported a failure while executing."""

    code = ResultCode.ABORTED


class SkillTimeout(ExecError):
    """The robot did not answer in time (SDK timeout)."""

    code = ResultCode.TIMEOUT


class Disconnected(ExecError):
    code = ResultCode.DISCONNECTED


POLL_S = 0.02  # cancellation / deadline polling period while waiting


class CallContext:
    """What a backend may use while running a call: cancellation and the goal's deadline."""

    def __init__(self, cancel_requested: Callable[[], bool], deadline: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cancel_requested = cancel_requested
        self.deadline = deadline
        self.clock = clock

    def check(self) -> None:
        """Raise Cancelled / GoalTimeout if the goal must stop now."""
        if self._cancel_requested():
            raise Cancelled("cancel requested")
        if self.clock() >= self.deadline:
            raise GoalTimeout("segment exceeded its time limit")

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake up within POLL_S of a cancel request or the deadline."""
        end = self.clock() + max(0.0, seconds)
        while True:
            self.check()
            left = end - self.clock()
            if left <= 0:
                return
            time.sleep(min(POLL_S, left))

    def remaining(self) -> float:
        return self.deadline - self.clock()


class SkillBackend(Protocol):
    """Runs single skill calls on one robot."""

    def start(self) -> None:
        """Connect / power up; called once before the first goal."""
        ...

    def validate(self, call: SkillCall, spec: SkillSpec) -> str | None:
        """Robot-specific argument limits beyond the YAML schema; None = allowed."""
        ...

    def begin_goal(self, goal: SegmentGoal, ctx: CallContext) -> None:
        """Called after validation, before the first call (e.g. Tello takeoff on first goal)."""
        ...

    def call(self, call: SkillCall, spec: SkillSpec, ctx: CallContext) -> Value:
        """Run one call; raise an ExecError subclass on failure."""
        ...

    # Optional: `flying: bool` -- a backend that knows whether its robot is airborne (Tello) gets
    # the executor's flight envelope since takeoff (`ExecutorConfig.flight_window_s`).

    def halt(self, reason: str) -> str | None:
        """Make the robot safe after a cancel/timeout/failure (e.g. Tello `stop`: hover); return
        where it was left ("drone hovering (stop sent)", "drone landed"), None if nothing to say."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ExecReport:
    """Outcome of one segment, on the executor's own (monotonic) clock."""

    code: ResultCode
    error: str = ""
    call_durations_s: tuple[float, ...] = ()
    calls_done: int = 0
    value: Value = None
    exec_duration_s: float = 0.0


@dataclass
class ExecutorConfig:
    timeout_s: float = 120.0  # hard per-goal limit
    timeout_factor: float = 0.0  # > 0: limit = max(timeout_min_s, factor * est_exec_s), capped by timeout_s
    timeout_min_s: float = 5.0
    use_interpreter: bool = True  # run goal.text with MiniSpec; False: run goal.calls in order
    max_plans: int = 64  # per-plan interpreter environments kept (LRU)
    # The robot's own flight envelope (`envelope.flight`, default the plan's limits) over every goal
    # it runs, whoever sent it: 0 = since takeoff, for backends that report `flying` (Tello; a
    # simulated robot never lands, so it has no flight account unless a window is set); > 0 = a
    # sliding window of that many seconds, for any backend.
    flight_window_s: float = 0.0

    def limit_for(self, est_exec_s: float) -> float:
        if self.timeout_factor > 0:
            return min(self.timeout_s, max(self.timeout_min_s, self.timeout_factor * est_exec_s))
        return self.timeout_s


FeedbackFn = Callable[[int, str, float], None]  # calls_done, current call, elapsed seconds


@dataclass
class _Run:
    ctx: CallContext
    feedback: FeedbackFn | None
    started: float
    durations: list[float] = field(default_factory=list)
    travel: EnvelopeTracker | None = None  # the plan's envelope account (None: no envelope)


class SegmentExecutor:
    """Runs segments for one robot, one at a time (callers serialise; see nodes.executor_node)."""

    def __init__(self, robot: RobotSpec, backend: SkillBackend, config: ExecutorConfig | None = None,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.robot = robot
        self.backend = backend
        self.config = config or ExecutorConfig()
        self.clock = clock
        self._envs: OrderedDict[str, dict[str, Value]] = OrderedDict()
        self._travel: dict[str, EnvelopeTracker] = {}  # per plan, evicted with its env
        window = self.config.flight_window_s
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window < float("inf"):
            raise ValueError(f"flight window must be >= 0 seconds (0: since takeoff), got {window!r}")
        self.flight: FlightAccount | None = None  # what the robot flew since takeoff / in the window
        if robot.envelope is not None and (window > 0 or hasattr(backend, "flying")):
            self.flight = FlightAccount(robot, window_s=window)
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self.backend.start()
                self._started = True

    def close(self) -> None:
        self.backend.close()

    # ------------------------------------------------------------------ validation

    def _spec(self, call: SkillCall) -> SkillSpec:
        spec = self.robot.skills.get(call.name) or self.robot.skill(call.abbr)
        if spec is None:
            raise SkillRejected(f"robot type {self.robot.robot_type!r} has no skill {call.abbr or call.name!r}")
        return spec

    def _check_call(self, call: SkillCall) -> None:
        spec = self._spec(call)
        problem: str | None = None
        if _minispec is not None:
            problem = _minispec.check_call_args(spec, call.args)
        else:
            if len(call.args) != len(spec.args):
                problem = f"takes {len(spec.args)} argument(s), got {len(call.args)}"
            for a, v in zip(spec.args, call.args):
                problem = problem or a.check(v)
        problem = problem or self.backend.validate(call, spec)
        if problem:
            raise SkillRejected(f"{call}: {problem}")

    def _plan(self, goal: SegmentGoal) -> tuple[Any, tuple[SkillCall, ...]]:
        """Parse and check the whole segment before anything moves: (statements or None, calls).
        The goal's call list must be exactly the calls written in its text (whoever sent it)."""
        if goal.robot_type and goal.robot_type != self.robot.robot_type:
            raise SkillRejected(f"goal is for robot type {goal.robot_type!r}, this executor runs "
                                f"{self.robot.robot_type!r}")
        body = None
        calls: tuple[SkillCall, ...] = tuple(goal.calls)
        if _minispec is not None and self.robot.language == "minispec":
            try:
                parsed_body, parsed = _minispec.parse_program(goal.text, self.robot)
            except _minispec.MiniSpecError as e:
                raise SkillRejected(f"segment {goal.text!r}: {e}") from None
            if not parsed_body:
                raise SkillRejected(f"segment {goal.text!r} has no statement")
            if not _guard.same_calls(parsed, calls):
                raise SkillRejected(f"{_guard.calls_mismatch(calls, parsed)}; nothing sent")
            if self.config.use_interpreter:
                body = parsed_body
        elif self.robot.language == "sentence":
            problem = _guard.chat_problem(self.robot, goal.text, calls)
            if problem:
                raise SkillRejected(f"{problem}; nothing sent")
        if body is None and not calls:
            raise SkillRejected("segment has no skill calls to run")
        for c in calls:
            if body is None or None not in c.args:  # None = computed: checked once resolved (_call)
                self._check_call(c)
        return body, calls

    # ------------------------------------------------------------------ execution

    def _env(self, request_id: str) -> dict[str, Value]:
        env = self._envs.pop(request_id, None) or {}
        self._envs[request_id] = env
        while len(self._envs) > self.config.max_plans:
            old, _ = self._envs.popitem(last=False)
            self._travel.pop(old, None)
        return env

    def new_flight(self) -> None:
        """The robot landed (or was replaced): the flight envelope starts again.  Backends that
        report `flying` need no call: a goal that finds the robot on the ground starts a new flight."""
        if self.flight is not None:
            self.flight.reset()

    def forget(self, request_id: str) -> None:
        """Drop a finished plan's interpreter state."""
        self._envs.pop(request_id, None)
        self._travel.pop(request_id, None)

    def _call(self, run: _Run, call: SkillCall) -> Value:
        run.ctx.check()
        spec = self._spec(call)
        self._check_call(call)  # the resolved call: computed arguments are checked here, before sending
        if run.travel is not None:
            outside = run.travel.charge(call, spec, self.clock())
            if outside:
                raise SkillRejected(f"outside the flight envelope: {outside}")
        if run.feedback is not None:
            run.feedback(len(run.durations), str(call), self.clock() - run.started)
        t0 = self.clock()
        value = self.backend.call(call, spec, run.ctx)
        run.durations.append(self.clock() - t0)
        return value

    def execute(self, goal: SegmentGoal, *, cancel_requested: Callable[[], bool] = lambda: False,
                on_feedback: FeedbackFn | None = None) -> ExecReport:
        """Run one segment; never raises, always returns a report."""
        started = self.clock()
        run = _Run(CallContext(cancel_requested, started + self.config.limit_for(goal.est_exec_s), self.clock),
                   on_feedback, started)
        value: Value = None
        begun = False  # the backend may have moved the robot: failures halt it and say how it was left
        try:
            run.ctx.check()
            body, calls = self._plan(goal)
            if self.robot.envelope is not None:  # the goal as a whole, before its first command
                run.travel = self._envelope_check(goal, body, calls)
            self.start()
            begun = True
            self.backend.begin_goal(goal, run.ctx)
            if body is not None:
                env = self._env(goal.request_id)
                for stmt in body:
                    value = _minispec.run_statement(stmt, self.robot, lambda c: self._call(run, c), env)
                    if env.get(_minispec.RETURNED):
                        break
            else:
                for c in calls:
                    value = self._call(run, c)
            if on_feedback is not None:
                on_feedback(len(run.durations), "", self.clock() - started)
            return ExecReport(ResultCode.OK, "", tuple(run.durations), len(run.durations), value,
                              self.clock() - started)
        except ExecError as e:
            code, msg = e.code, str(e) or type(e).__name__
        except Exception as e:  # interpreter runtime errors, backend bugs: fail the goal, keep serving
            if _minispec is not None and isinstance(e, _minispec.ArgumentError):
                code, msg = ResultCode.REJECTED, f"argument refused at run time, nothing sent: {e}"
            elif _minispec is not None and isinstance(e, _minispec.MiniSpecRuntimeError):
                code, msg = ResultCode.ABORTED, f"plan error: {e}"
            else:
                log.exception("executor backend failed")
                code, msg = ResultCode.ABORTED, f"executor error: {type(e).__name__}: {e}"
        if begun:
            where = self._halt(msg)
            if where:
                msg = f"{msg}; {where}"
        return ExecReport(code, msg, tuple(run.durations), len(run.durations), None, self.clock() - started)

    def _envelope_check(self, goal: SegmentGoal, body: Any, calls: tuple[SkillCall, ...]) -> EnvelopeTracker:
        """The plan's envelope account, after checking the whole goal (its worst path) against the
        segment's, the plan's and the robot's flight envelope; SkillRejected before anything moves."""
        if self.flight is not None and self.flight.window_s == 0 and getattr(self.backend, "flying", None) is False:
            self.flight.reset()  # on the ground: this goal's takeoff starts a new flight
        tracker = self._travel.get(goal.request_id)
        if tracker is None:
            tracker = self._travel[goal.request_id] = EnvelopeTracker(self.robot, self.flight)
            while len(self._travel) > self.config.max_plans:  # bounded, like the plans' envs
                self._travel.pop(next(iter(self._travel)))
        if body is not None:
            seg = static_travel(body, self.robot)
        else:
            seg = ZERO
            for c in calls:
                seg = seg.then(call_travel(self._spec(c), c.args))
        outside = tracker.precheck(seg, self.clock())
        if outside:
            raise SkillRejected(f"outside the flight envelope: {outside}; nothing sent")
        tracker.begin_segment()
        return tracker

    def _halt(self, reason: str) -> str | None:
        try:
            where = self.backend.halt(reason)
        except Exception as e:
            log.exception("halting the robot failed")
            return f"halting the robot failed: {type(e).__name__}: {e}"
        return where if isinstance(where, str) else None


# ---------------------------------------------------------------------- perception


class Perception(Protocol):
    """Answers perception skills (is_visible, object_x, probe, ...) for a backend."""

    def query(self, call: SkillCall, spec: SkillSpec) -> Value: ...


class SimulatedPerception:
    """A scene with a fixed set of visible objects; positions drawn from a seeded rng.

    Not-visible objects answer False (bool skills) / -1.0 (position and size skills) / "" (str).
    """

    POSITION = {"object_x", "object_y"}
    SIZE = {"object_width", "object_height"}

    def __init__(self, visible: Iterable[str] = (), *, answers: Mapping[str, str] | None = None,
                 seed: int = 0) -> None:
        import random

        self.visible = {v.strip().lower() for v in visible}
        self.answers = dict(answers or {})
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def sees(self, obj: Value) -> bool:
        return isinstance(obj, str) and obj.strip().lower() in self.visible

    def query(self, call: SkillCall, spec: SkillSpec) -> Value:
        arg = call.args[0] if call.args else None
        with self._lock:
            if spec.returns == "bool":
                return self.sees(arg)
            if spec.returns == "float":
                if not self.sees(arg):
                    return -1.0
                if spec.name in self.SIZE:
                    return round(self._rng.uniform(0.1, 0.6), 3)
                return round(self._rng.uniform(0.3, 0.7), 3)
            if spec.returns == "str":
                if isinstance(arg, str) and arg in self.answers:
                    return self.answers[arg]
                return ", ".join(sorted(self.visible)) if self.visible else "nothing"
        return None
