"""Faults on the real engine, at the planner level (issue: "a missing or unloadable model path, a
model whose head_dim the backend rejects, an engine crash mid-run -- each gives a clear error;
requests in flight end as failed with the reason, none silently lost").

Already covered in tests/test_vllm_engine.py, not repeated here: missing model path / no
config.json / no weights (test_missing_model_path_is_clear), garbage weights
(test_unloadable_model_is_clear), head_dim 16 on CPU (test_head_dim_16_model_is_rejected_on_cpu),
and the adapter's own reaction to a killed worker (test_worker_death_mid_run_is_engine_error).

Here: the engine crashes while the *planner* serves several requests (a separate short-lived
VllmEngine whose worker process is killed -- never the session's shared engine), and a request
whose prompt does not fit the engine's context (the shared engine).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from timelyllm_ros.core.clock import WallClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner, PlannerConfig
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.core.types import GenState, PlanRequest, ResultCode, SegmentGoal, SegmentResult
from timelyllm_ros.workloads.catalog import load_tasks
from timelyllm_ros.prompts import PromptBuilder

pytestmark = pytest.mark.vllm

ROBOTS = load_robots()
TASKS = load_tasks()
NORMAL = TUF(ert=1.0, alpha=-2.0, beta=1.0)


def lrtrace_request(task_id: str, scene: int, request_id: str, *, scene_text: str | None = None) -> PlanRequest:
    t = TASKS[task_id]
    return PlanRequest(request_id=request_id, robot_id=f"{t.robot_type}-{request_id}", robot_type=t.robot_type,
                       task=t.task, scene=t.scenes[scene].scene if scene_text is None else scene_text,
                       tuf=NORMAL, arrival=0.0, task_type=task_id, category=t.category)


class HeldDispatcher:
    """Dispatcher port that records goals and reports results only when `release()` is called
    (robots still busy): blocking statements keep their generation WAITING until then."""

    def __init__(self) -> None:
        self.goals: list[SegmentGoal] = []
        self.cancelled: list[str] = []
        self.planner: Planner | None = None
        self._held: list[SegmentGoal] = []

    def dispatch(self, goal: SegmentGoal) -> None:
        self.goals.append(goal)
        self._held.append(goal)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def release(self) -> None:
        assert self.planner is not None
        now = self.planner.clock.now()
        held, self._held = self._held, []
        for goal in held:
            self.planner.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, now, now,
                                                   calls_done=len(goal.calls),
                                                   value=True if goal.blocking else None))


def make_planner(engine: Any, dispatcher: Any) -> Planner:
    prompts = PromptBuilder(ROBOTS, engine.tokenizer)
    p = Planner(clock=WallClock(), engine=engine, dispatcher=dispatcher, robots=ROBOTS,
                policy=make_policy("timelyllm"), estimator=ExecTimeEstimator(ROBOTS), prompts=prompts,
                config=PlannerConfig(max_tokens=192))
    dispatcher.planner = p
    return p


# --------------------------------------------------------------------- engine crash mid-run

@dataclass
class CrashRun:
    states_at_crash: dict[str, GenState]
    planner: Planner
    dispatcher: HeldDispatcher
    killed: list[int]
    step_errors: list[str] = field(default_factory=list)
    late: Any = None  # SubmitResult of a request sent after the crash


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def crash_run() -> CrashRun:
    """Own engine; three requests (drone with a blocking scan, arm, chat); robots hold their
    results.  Once one request is parked (WAITING for a result or SUSPENDED) while another is
    generating, vLLM's
    worker process is SIGKILLed; then the planner goes on stepping and the robots report."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")
    pytest.importorskip("psutil")
    from timelyllm_ros.engines.tiny_model import tiny_engine_config, tiny_model
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    model, _ = tiny_model()
    before = _children()
    eng = VllmEngine(tiny_engine_config(model, max_num_seqs=4))
    try:
        # this engine's model worker process(es): vLLM's handles, checked against the OS's view
        # (new children of this process: never the shared engine's worker nor unrelated helpers)
        handles = getattr(getattr(eng.llm_engine, "model_executor", None), "workers", None) or []
        workers = sorted(int(w.proc.pid) for w in handles)
        assert workers, "cannot find the vLLM worker process of this engine (vLLM internals changed?)"
        assert set(workers) <= _children() - before, (workers, _children() - before)
        disp = HeldDispatcher()
        planner = make_planner(eng, disp)
        # plans with blocking calls (scan, detect) are likely, but the model decides: the crash
        # point below needs only one generation parked (WAITING or SUSPENDED) and one running
        reqs = [lrtrace_request("T1", 0, "crash-scan"), lrtrace_request("T9", 0, "crash-arm"),
                lrtrace_request("C2", 0, "crash-chat")]
        for r in reqs:
            assert planner.submit(r).accepted
        end = time.monotonic() + 30

        def ready_to_crash() -> bool:
            gs = planner.generations
            waiting = any(g.state in (GenState.WAITING, GenState.SUSPENDED) for g in gs.values())
            running = [g for g in gs.values() if g.state is GenState.RUNNING and g.segments]
            return waiting and bool(running)

        while not ready_to_crash():
            assert planner.busy() and time.monotonic() < end, {
                g.gen_id: (g.state, g.text) for g in planner.generations.values()}
            planner.step()
        states = {g.gen_id: g.state for g in planner.generations.values()}
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        run = CrashRun(states, planner, disp, workers)
        end = time.monotonic() + 60
        while any(g.state is GenState.RUNNING for g in planner.generations.values()):
            assert time.monotonic() < end, "the planner never noticed the dead engine"
            try:
                planner.step()
            except Exception as e:  # noqa: BLE001 - recorded: step() must not raise
                run.step_errors.append(f"{type(e).__name__}: {e}")
                break
        run.late = planner.submit(lrtrace_request("T1", 0, "after-crash"))
        disp.release()  # the robots finish what they were given and report
        for _ in range(5):
            try:
                planner.step()
            except Exception as e:  # noqa: BLE001
                run.step_errors.append(f"{type(e).__name__}: {e}")
        return run
    finally:
        eng.shutdown()


def test_crash_fails_running_requests_with_the_engine_error(crash_run):
    run = crash_run
    gens = run.planner.generations
    running = [rid for rid, s in run.states_at_crash.items() if s is GenState.RUNNING]
    assert running
    for rid in running:
        g = gens[rid]
        assert g.state is GenState.FAILED, (rid, g.state)
        assert g.reason.startswith("engine failure: vLLM engine failed during step"), g.reason
        assert "build a new VllmEngine" in g.reason
        assert g.finished_at is not None
        if g.segments:  # its robot was told to stop what is still queued or executing
            assert rid in run.dispatcher.cancelled


def test_crash_marks_the_engine_unhealthy_and_refuses_new_requests(crash_run):
    run = crash_run
    assert run.planner.engine_healthy is False
    assert run.planner.status().engine_healthy is False
    assert run.late is not None and not run.late.accepted
    assert run.late.reason == "engine unavailable"
    assert "after-crash" not in run.planner.generations


def test_crash_leaves_no_request_behind(crash_run):
    """Every request in flight at the crash ends: FAILED with the engine error if it still needed
    the engine, FINISHED if its plan was complete (DRAINING) and its robot reported; step() never
    raises."""
    run = crash_run
    gens = run.planner.generations
    for rid, before in run.states_at_crash.items():
        g = gens[rid]
        assert g.state.terminal, (rid, before, g.state)
        if before is GenState.DRAINING:
            assert g.state is GenState.FINISHED, (rid, g.reason)
        else:
            assert g.state is GenState.FAILED and "engine failure" in g.reason, (rid, before, g.state, g.reason)
    assert run.step_errors == []
    assert not run.planner.busy()


# --------------------------------------------------------------------- prompt too long for the engine

def _long_scene(max_chars: int = 3990) -> str:
    """A scene as long as a plan request may carry (PlanRequest.from_mapping: 4000 characters)."""
    words, n = [], 0
    while True:
        w = f"crate {n} at shelf {n % 97} row {n % 13}"
        if len("objects: " + ", ".join(words + [w])) > max_chars:
            return "objects: " + ", ".join(words)
        words.append(w)
        n += 1


def test_prompt_longer_than_the_engine_context_fails_only_that_request(vllm_engine):
    """A request that passes the planner's validation (4000-character scene) but whose prompt does
    not fit the engine's context: refused or failed with the reason; the others are served."""
    eng = vllm_engine
    disp = HeldDispatcher()
    planner = make_planner(eng, disp)
    t = TASKS["T3"]
    long = planner.submit(PlanRequest.from_mapping({"request_id": "too-long", "robot_id": "drone7", "robot_type": "tello",
                                                    "task": t.task, "scene": _long_scene(),
                                                    "tuf": {"ert": 1.0, "alpha": -2.0, "beta": 1.0}},
                                                   arrival=planner.clock.now()))
    n_prompt = len(planner.prompts.prompt_ids(PlanRequest.from_mapping(
        {"request_id": "x", "robot_id": "x", "robot_type": "tello", "task": t.task, "scene": _long_scene(),
         "tuf": {"ert": 1.0, "alpha": -2.0, "beta": 1.0}}, arrival=0.0)))
    assert n_prompt >= eng.max_model_len, "the scene is not long enough to test this"
    assert planner.submit(lrtrace_request("T1", 0, "short")).accepted
    errors: list[str] = []
    end = time.monotonic() + 30
    try:
        while planner.busy() and time.monotonic() < end:
            try:
                planner.step()
            except Exception as e:  # noqa: BLE001 - step() must not raise
                errors.append(f"{type(e).__name__}: {e}")
                if len(errors) > 3:
                    break
            disp.release()
    finally:
        for g in planner.live():  # leave the shared engine clean whatever happened
            eng.abort(g.gen_id, "discard")
    assert errors == []
    if long.accepted:
        g = planner.generations["too-long"]
        assert g.state is GenState.FAILED and "max_model_len" in g.reason, (g.state, g.reason)
    else:
        assert "token" in long.reason, long.reason
    assert planner.generations["short"].state is GenState.FINISHED, planner.generations["short"].reason
    assert eng.stats().healthy and not eng.has_unfinished()
