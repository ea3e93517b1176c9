"""Wall-clock serving of a workload in one process: the planner on a real engine, simulated robots.

This is the single-process mode behind `timelyllm demo`: the same Planner as everywhere, driven in
real time.  Robots are `SimulatedRobots` on the wall clock (their goals finish after the sampled
execution time, for real), requests arrive at the workload's times.  One thread: the loop fires
due events (arrivals, robot results), runs one planner step, and sleeps only when the planner has
no engine work — so timings are those of the engine, not of a thread hand-off.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .assembly import PlannerBuilder, PlannerParts, warm_up
from .core.clock import WallClock
from .core.metrics import summarize
from .core.planner import Planner, PlannerConfig
from .core.policies import DEFAULT_POLICY, make_policy
from .core.robots import RobotSpec
from .core.types import Generation
from .engines.base import Engine, StepRecord
from .workloads.format import Arrival
from .sim.robots import SimulatedRobots
from .sim.runner import EventLoop, RequestLanes


@dataclass
class Progress:
    """What the live display shows (updated by the loop)."""

    total: int
    done: int = 0
    segments: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    batch: int = 0
    kv_usage: float = 0.0
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0
    next_arrival_s: float | None = None  # seconds until the next request arrives (None: all in)
    drain_eta_s: float | None = None  # once all arrived: estimated seconds until the last finishes
    final: bool = False  # the last update: every request is terminal


@dataclass
class ServeResult:
    generations: list[Generation]
    metrics: dict[str, Any]
    wall_s: float
    rejected: list[tuple[str, str]]
    planner: Planner
    step_records: list[StepRecord] = field(default_factory=list)  # serving iterations (not the warm-up)


def serve_arrivals(arrivals: list[Arrival], *, engine: Engine, prompts: Any,
                   robots: Mapping[str, RobotSpec], policy: str = DEFAULT_POLICY,
                   policy_params: Mapping[str, Any] | None = None, seed: int = 0,
                   max_batch: int | None = None, config: PlannerConfig | None = None,
                   on_progress: Callable[[Progress], None] | None = None,
                   progress_every_s: float = 0.25, timeout_s: float = 600.0,
                   exclusive_agents: bool = False, warm: bool = True,
                   engine_restart: Callable[[Engine], Engine] | None = None) -> ServeResult:
    """Serve `arrivals` in real time until every accepted request is terminal."""
    if warm:
        warm_up(engine, prompts, sorted({a.robot_type for a in arrivals}))
    clock = WallClock()  # time 0: serving starts (after the warm-up)
    loop = EventLoop(clock)  # the simulator's event heap, on the wall clock
    pol = make_policy(policy, **dict(policy_params or {}))
    builder = PlannerBuilder(PlannerParts(clock=clock, engine=engine, robots=robots, policy=pol, prompts=prompts,
                                          config=config, max_batch=max_batch, engine_restart=engine_restart))
    sim_robots = SimulatedRobots(loop.view, robots, post_result=builder.post_result, schedule=loop.schedule, seed=seed)
    # each request executes in its own lane, as in the benchmark replay (sim/runner.py docstring)
    planner = builder.build(sim_robots if exclusive_agents else RequestLanes(sim_robots)).planner
    rejected: list[tuple[str, str]] = []
    prog = Progress(total=len(arrivals))
    kept_log = engine.step_log  # a caller's own log (benchmarks) gets the serving steps too
    step_log: list[StepRecord] = kept_log if kept_log is not None else []
    engine.step_log = step_log  # serving iterations: the demo's engine-speed report

    def arrive(a: Arrival) -> Callable[[], None]:
        def submit() -> None:
            req = dataclasses.replace(a.to_request(), arrival=loop.view.now())  # its own time
            res = planner.submit(req)
            if not res.accepted:
                rejected.append((a.request_id, res.reason))
        return submit

    for a in arrivals:
        loop.schedule(a.time, arrive(a))
    last_progress = -1.0
    last_arrival = max((a.time for a in arrivals), default=0.0)
    t0 = time.monotonic()

    def report(final: bool = False) -> None:
        now = clock.now()
        st = planner.status()
        gens = planner.generations.values()
        prog.done = sum(1 for g in gens if g.state.terminal) + len(rejected)
        prog.counts, prog.batch = st.counts, st.batch_size
        prog.segments = sum(len(g.segments) for g in gens)
        prog.kv_usage, prog.tokens_per_s, prog.elapsed_s = st.kv_usage, st.tokens_per_s, now
        prog.next_arrival_s = max(0.0, loop.next_time() - now) if now < last_arrival and loop.next_time() else None
        prog.drain_eta_s = None if final or now < last_arrival else drain_eta(planner.live(), now)
        prog.final = final
        assert on_progress is not None
        on_progress(prog)

    while True:
        loop.fire_due()
        ran = planner.step()
        if planner.engine.step_log is not step_log:  # a restarted engine (supervisor) logs too
            planner.engine.step_log = step_log
        now = clock.now()
        if on_progress and now - last_progress >= progress_every_s:
            last_progress = now
            report()
        if not planner.busy() and loop.next_time() is None:
            break
        if time.monotonic() - t0 > timeout_s:
            for g in planner.live():
                planner.cancel(g.gen_id, f"serve timeout after {timeout_s:.0f} s")
            planner.step()
            break
        if not ran:
            nxt = loop.next_time()
            wait = 0.005 if nxt is None else min(0.005, max(0.0, nxt - clock.now()))
            time.sleep(wait)
    if on_progress:
        report(final=True)  # the last frame shows every request terminal
    planner.engine.step_log = kept_log
    gens = list(planner.generations.values())
    assert all(g.state.terminal for g in gens), [g.state for g in gens if not g.state.terminal]
    return ServeResult(generations=gens, metrics=summarize(gens), wall_s=time.monotonic() - t0,
                       rejected=rejected, planner=planner, step_records=step_log)


def drain_eta(live: list[Generation], now: float) -> float:
    """Seconds until the live generations are done if nothing more waits for the engine: each
    one's unfinished segments run back to back, the one executing from its own start (estimated
    execution times, as the planner's; an overrun one counts as ending now)."""
    eta = 0.0
    for g in live:
        t = now
        for i, seg in enumerate(x for x in g.segments if x.exec_end is None):
            running = i == 0 and seg.exec_start is not None
            t = max(now, seg.exec_start + seg.est_exec_s) if running else t + seg.est_exec_s
        eta = max(eta, t - now)
    return eta


__all__ = ["Progress", "ServeResult", "serve_arrivals"]
