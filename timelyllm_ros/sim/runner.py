"""Discrete-event simulation of a planner serving an LRTrace workload (paper §7 replay).

Time is a VirtualClock.  Two things move it:

* the simulated engine: each ``planner.step()`` that runs the engine advances the clock by the
  latency profile's cost of that iteration;
* this runner: when the planner has no engine work it jumps the clock to the next event.

Events (request arrivals, robot goal arrivals/completions scheduled by ``SimulatedRobots``) sit
in a heap of ``(time, seq, callback)``.  Before every planner step all events due by ``now`` fire
in time order.  An engine iteration is atomic, so an event that falls inside one is *handled*
when it ends — but robots see the event's own time (a clock view pinned to the event time while
its callback runs), so execution start/end times are exact; the planner simply notices results
between iterations, as a real serving loop does.  Arrivals carry their own arrival time, so a
request that comes in during an iteration is charged the wait for that iteration.

Robots: by default every request executes in its own lane — the paper's replay, where the
workload's agents label requests and execution times come from the time model without queueing
behind another request (LRTrace WID1 offers ~1.1 tasks/s of ~20-40 s drone tasks to 25 agents, so
exclusive robots would turn most response times into waits for a busy robot, which no LLM
scheduler can change).  ``exclusive_agents=True`` makes each agent one physical robot that runs
its goals FIFO; the result then reports how many requests found their agent busy.

Batching: policies that segment (suspend mode) use TimelyLLM's latency-guided controller;
vLLM-style policies (whole plan / stream) use plain continuous batching capped at vLLM's default
``max_num_seqs`` = 256 (both bounded by KV memory).  ``max_batch=N`` fixes the cap at N for every
policy (the Fig. 7 sweep).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..assembly import PlannerBuilder, PlannerParts
from ..core.clock import Clock, VirtualClock
from ..core.metrics import summarize, terminal_count, timeline_records
from ..core.planner import Planner, PlannerConfig, PromptSource
from ..core.policies import DispatchMode, make_policy
from ..core.robots import RobotSpec, load_robots
from ..core.types import Generation, GenState, SegmentGoal
from ..engines.base import Tokenizer
from ..engines.sim_pool import SimulatedPool
from ..engines.simulated import DEFAULT_PROFILE, LatencyProfile, SimulatedEngine
from ..workloads.format import Arrival, Workload, default_catalog, expand, load_workload
from ..workloads.catalog import TaskDef
from .prompts import SimPromptSource, WrittenResults
from .robots import FaultConfig, SimulatedRobots
from ..core.tokenizer import SimTokenizer

VLLM_MAX_NUM_SEQS = 256  # vLLM's default cap on sequences per iteration
DEFAULT_OVERRUN_S = 3600.0  # virtual time allowed after the last arrival before giving up

Progress = Callable[[float, int, int], None]  # (virtual now, terminal requests, total requests)


class SimulationError(RuntimeError):
    """The simulation cannot finish (stuck planner, runaway time); the message says why."""


class _EventClock:
    """Clock view for the simulated robots: the firing event's time while a callback runs, else
    the shared virtual clock (dispatches happen at the planner's now)."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.at: float | None = None

    def now(self) -> float:
        return self.at if self.at is not None else self.base.now()


class EventLoop:
    """Heap of (time, seq, callback); seq keeps same-time events in scheduling order.  Works on
    any clock: the virtual one here, the wall clock in `serve.py` (real-time serving)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.view = _EventClock(clock)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.fired = 0

    def schedule(self, t: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (float(t), next(self._seq), callback))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> int:
        """Run every event due by now, in time order (callbacks may schedule more)."""
        n = 0
        now = self.clock.now()
        while self._heap and self._heap[0][0] <= now:
            t, _, cb = heapq.heappop(self._heap)
            self.view.at = t
            try:
                cb()
            finally:
                self.view.at = None
            n += 1
        self.fired += n
        return n

    def __len__(self) -> int:
        return len(self._heap)


@dataclass
class SimResult:
    """One policy on one workload: the generations (full record) plus their metrics."""

    workload: str
    policy: str
    policy_params: dict[str, Any]
    seed: int
    batcher: str
    profile: str
    generations: list[Generation]
    metrics: dict[str, Any]
    virtual_end_s: float
    engine: dict[str, Any]
    planner: dict[str, Any]
    wall_s: float = field(default=0.0, compare=False)  # not in to_dict: JSON must be reproducible

    def timeline(self) -> list[dict[str, Any]]:
        return timeline_records(self.generations)

    def to_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        d = {
            "workload": self.workload, "policy": self.policy, "policy_params": self.policy_params,
            "seed": self.seed, "batcher": self.batcher, "profile": self.profile,
            "virtual_end_s": self.virtual_end_s, "engine": self.engine, "planner": self.planner,
            "metrics": self.metrics,
        }
        if timeline:
            d["timeline"] = self.timeline()
        return d


class RequestLanes:
    """Dispatcher adapter: each request runs on its own lane ``robot_id~request_id`` of the
    simulated robots, so requests never queue behind each other (see the module docstring)."""

    def __init__(self, inner: SimulatedRobots) -> None:
        self.inner = inner

    def dispatch(self, goal: SegmentGoal) -> None:
        self.inner.dispatch(dataclasses.replace(goal, robot_id=f"{goal.robot_id}~{goal.request_id}"))

    def cancel(self, request_id: str) -> None:
        self.inner.cancel(request_id)


def agent_conflicts(gens: list[Generation]) -> int:
    """Requests that arrived while their agent still had an unfinished request."""
    busy_until: dict[str, float] = {}
    n = 0
    for g in sorted(gens, key=lambda g: (g.request.arrival, g.gen_id)):
        rid, t = g.request.robot_id, g.request.arrival
        if busy_until.get(rid, -1.0) > t:
            n += 1
        end = g.finished_at if g.finished_at is not None else t
        busy_until[rid] = max(busy_until.get(rid, -1.0), end)
    return n


def _rejected_generation(a: Arrival, reason: str) -> Generation:
    """A request the planner refused still counts: FAILED at its arrival, with the reason."""
    return Generation(request=a.to_request(), state=GenState.FAILED, reason=f"rejected: {reason}",
                      finished_at=a.time)


def run_simulation(workload: str | Path | Workload, policy_name: str, *, max_batch: int | None = None,
                   seed: int | None = None, profile_path: str | Path | LatencyProfile = DEFAULT_PROFILE,
                   policy_params: Mapping[str, Any] | None = None,
                   robots: Mapping[str, RobotSpec] | None = None,
                   catalog: Mapping[str, TaskDef] | None = None,
                   faults: FaultConfig | None = None, config: PlannerConfig | None = None,
                   exclusive_agents: bool = False,
                   progress: Progress | None = None, progress_every: int = 500,
                   max_overrun_s: float = DEFAULT_OVERRUN_S,
                   setup: Callable[[Planner, list[Arrival]], list[Arrival]] | None = None,
                   tokenizer: Tokenizer | None = None,
                   prompts: Callable[[SimulatedEngine], PromptSource] | None = None,
                   engines: int = 1, pooled: bool | None = None, engine_kind: str = "preserve",
                   written_true_p: float | None = None) -> SimResult:
    """Replay a workload against the planner with ``policy_name``; every request ends terminal.

    ``seed`` (default: the workload's) drives both the arrival expansion and the robots' sampled
    execution times, so one seed gives one exact run.  Raises ``SimulationError`` if the planner
    stops making progress or virtual time runs ``max_overrun_s`` past the last arrival.
    ``setup(planner, arrivals) -> arrivals`` runs once before the first event (benchmarks wrap the
    engine with probes; the crash test attaches a journal and recovers, dropping known arrivals).
    ``profile_path`` may be a loaded ``LatencyProfile`` (the regime map scales its KV memory).
    ``tokenizer``/``prompts(engine)`` replace the synthetic tokenizer and the reference-plan
    prompts (`timelyllm profile check` replays a real model's prompts and outputs).
    ``engines`` > 1 serves the load on that many simulated engines of the profile behind the one
    planner (engines/sim_pool.py: parallel machines, KV affinity, per-engine batch control);
    ``pooled`` forces (True) or avoids (False) the pool (default: a pool when engines > 1).
    ``engine_kind``: what the simulated engine can do with a paused request's KV
    (`engines/kv_cache.EngineKind`): ``preserve`` (InferCept/LAMPS-style: every mode; the default
    here) or ``stock`` (vLLM as users run it: cache / discard only, `Engine.kv_modes` as
    `VllmEngine` reports it).
    ``written_true_p``: how the model of an unsegmented policy (STREAM / WHOLE) goes on after a
    blocking statement it was not given the result of (sim/prompts.py `WrittenResults`): None, the
    bundled model (no annotation, the all-True plan); p, it writes `#True` with probability p.
    """
    wall0 = _time.perf_counter()
    wl = workload if isinstance(workload, Workload) else load_workload(workload)
    run_seed = wl.seed if seed is None else int(seed)
    robots = dict(robots) if robots is not None else load_robots()
    catalog = catalog if catalog is not None else default_catalog(robots)
    arrivals = expand(wl, catalog, robots, seed=run_seed)
    params = dict(policy_params or {})
    policy = make_policy(policy_name, **params)
    profile = profile_path if isinstance(profile_path, LatencyProfile) else LatencyProfile.from_yaml(profile_path)

    clock = VirtualClock()
    loop = EventLoop(clock)
    tokenizer = tokenizer if tokenizer is not None else SimTokenizer()
    pooled = engines != 1 if pooled is None else pooled
    if not pooled and engines != 1:
        raise ValueError(f"{engines} engines need the pool (pooled=True)")
    sched = policy.engine_scheduling  # vllm-priority: the engine's own priority scheduling
    engine: Any = (SimulatedPool.build(clock, engines, profile, tokenizer, kind=engine_kind, scheduling_policy=sched)
                   if pooled else SimulatedEngine(clock, profile, tokenizer, kind=engine_kind, scheduling_policy=sched))
    written = WrittenResults(written_true_p, run_seed) if policy.mode is not DispatchMode.SUSPEND else None
    source = (prompts(engine) if prompts is not None
              else SimPromptSource(engine, tokenizer, robots=robots, written=written))
    faults = faults or FaultConfig()
    if not exclusive_agents and (faults.disconnects or faults.slow_robots):
        raise ValueError("per-robot faults (disconnects, slow_robots) need exclusive_agents=True")
    if max_batch is not None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    builder = PlannerBuilder(PlannerParts(clock=clock, engine=engine, robots=robots, policy=policy, prompts=source,
                                          config=config or PlannerConfig(), max_batch=max_batch,
                                          max_num_seqs=VLLM_MAX_NUM_SEQS))
    sim_robots = SimulatedRobots(loop.view, robots, builder.post_result, loop.schedule, seed=run_seed,
                                 network_latency_s=wl.network_latency_s, faults=faults)
    built = builder.build(sim_robots if exclusive_agents else RequestLanes(sim_robots))
    planner, batcher = built.planner, built.batcher

    rejected: dict[str, Generation] = {}

    def submit(a: Arrival) -> None:
        res = planner.submit(a.to_request())
        if not res.accepted:
            rejected[a.request_id] = _rejected_generation(a, res.reason)

    if setup is not None:  # e.g. attach a journal and recover (reliability crash test)
        arrivals = list(setup(planner, arrivals))
    for a in arrivals:
        loop.schedule(a.time, lambda a=a: submit(a))

    total = len(arrivals) + len(planner.generations)  # + requests a setup hook resubmitted
    last_arrival = arrivals[-1].time if arrivals else 0.0
    limit = last_arrival + max_overrun_s
    steps = 0
    stalled = 0
    while True:
        loop.fire_due()
        before = clock.now()
        ran = planner.step()
        steps += 1
        if progress is not None and steps % progress_every == 0:
            done, _ = terminal_count(planner.generations.values())
            progress(clock.now(), done + len(rejected), total)
        if clock.now() > limit:
            raise SimulationError(_stuck_message(
                f"virtual time passed {limit:.1f} s ({max_overrun_s:.0f} s after the last arrival)", planner))
        if ran:
            stalled = stalled + 1 if clock.now() == before else 0
            if stalled > 10_000:
                raise SimulationError(_stuck_message("the engine ran 10,000 steps without time passing", planner))
            continue
        nxt = loop.next_time()
        if nxt is not None:
            clock.advance_to(nxt)
            continue
        if planner.busy():
            raise SimulationError(_stuck_message("no engine work and no pending events, but requests are "
                                                 "not finished (a generation can never be admitted)", planner))
        break

    gens = list(planner.generations.values()) + list(rejected.values())
    done, n = terminal_count(gens)
    if n != total or done != total:
        raise SimulationError(f"{total} arrivals but {n} generations, {done} terminal")
    if progress is not None:
        progress(clock.now(), done, total)
    c = engine.engine_counters() if pooled else engine.counters
    fleet = ({"engines": engines, "generations_lost": engine.counters.lost,
              "resumed_elsewhere": engine.counters.moved, "adds_per_engine": engine.counters.served}
             if pooled else {})
    return SimResult(
        workload=wl.name, policy=policy_name, policy_params=params, seed=run_seed, batcher=batcher,
        profile=profile.name or Path(str(profile_path)).stem, generations=gens, metrics=summarize(gens, clock.now()),
        virtual_end_s=clock.now(),
        engine={"steps": c.steps, "busy_s": c.busy_s, "prefill_tokens": c.prefill_tokens,
                "cached_tokens": c.cached_tokens, "decode_tokens": c.decode_tokens,
                "preemptions": c.preemptions, "swap_in_blocks": c.swap_in_blocks, "kind": engine_kind,
                "kv_modes": sorted(engine.kv_modes), "kv_fallbacks": c.kv_fallbacks, **fleet},
        planner={"submitted": planner.submitted, "rejected": len(rejected), "iterations": planner.iteration,
                 "events": loop.fired, "exclusive_agents": exclusive_agents,
                 "agent_conflicts": agent_conflicts(gens)},
        wall_s=_time.perf_counter() - wall0,
    )


def _stuck_message(why: str, planner: Planner) -> str:
    counts: dict[str, int] = {}
    for g in planner.live():
        counts[g.state.value] = counts.get(g.state.value, 0) + 1
    blocked = {g.gen_id: g.blocked for g in planner.live() if g.blocked}
    sample = dict(itertools.islice(blocked.items(), 3))
    return (f"simulation cannot finish: {why}; t={planner.clock.now():.3f}, unfinished requests by "
            f"state {counts}; admission blocked: {sample}")
