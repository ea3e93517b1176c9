"""Cost of one scheduling point, and of a whole ``Planner.step()``, for every registered policy.

    python benchmarks/bench_scheduling.py [--sizes 8,1000] [--running 8] [--policy P ...]
                                          [--budget-s 2] [--rounds 4] [--no-step]

Issue 2 goals: one scheduling point <= 0.05 ms with 8 queued generations and <= 1 ms with 1,000
(the paper measured 2.03 ms for 8).

Scheduling point = what ``Planner._schedule`` does before it touches the engine: build the
policy context (engine stats), refresh every ready generation's priority and order them
(``policy.select`` over the ready list, preemption choice included), and the batch-size
controller's decision for the head of that order (the controller the runner installs:
``Planner.use_batching``, i.e. the policy's ``batching()`` — latency-guided or continuous —
capped at 256).  A refused head gets
``Generation.blocked`` as the planner sets it, so Trail and Andes see a full batch as they would.

The ready generations are a realistic mix, made by running the planner itself (batch cap 64,
every first segment started before any resume) over a burst of tello / arm / chat requests until about half have dispatched segments;
the running generations are then suspended (preempted mid-segment) and some robots' results
delivered, so the ready list holds queued first segments, suspended generations with executed
or executing segments, and preempted ones with partial output.  ``--running`` of them are then
admitted to the simulated engine as the running batch.  Each policy gets its own copy of that
state, and first sees ``--warm-steps`` (32) engine steps of the profile at widths up to the running
batch (its online models warmed, as in service; 0: a fresh policy).  Virtual time advances one decode step (22 ms) per scheduling point, and each running
generation gets a token — its output and current segment one longer, every other point one
shorter again (bounded lengths) — and `Generation.touch_tokens`, as the planner marks an engine
step's tokens: what a policy keeps per generation's token counts is read again for the running
ones at every point, as after a real engine step.

``Planner.step()`` is measured separately: a fresh planner per policy and size with
N + ``--running`` requests submitted at once and the batch capped at ``--running``; after 20
warm-up steps, the next steps are timed (scheduling + one engine iteration + token handling,
segment cuts and dispatches), with the mean ready / running counts reported beside them.

Figures: median and p99 per scheduling point in µs, both wall clock (``perf_counter``) and the
thread's CPU time (``thread_time``, immune to being descheduled on a shared machine); the goal
column judges the CPU median.  Machine and load average are printed first.  The scheduling points
are measured in ``--rounds`` rounds, every policy once per round in turn (start rotating), and
pooled: this machine's speed swings between seconds (CPU time included), so measuring each policy
in one block would let a slow second land on one policy alone.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from timelyllm_ros.assembly import PlannerBuilder, PlannerParts  # noqa: E402
from timelyllm_ros.core.clock import VirtualClock  # noqa: E402
from timelyllm_ros.core.planner import Planner, PlannerConfig  # noqa: E402
from timelyllm_ros.core.policies import Policy, make_policy, policy_names  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.tuf import NORMAL, URGENT  # noqa: E402
from timelyllm_ros.core.types import GenState, Generation, PlanRequest  # noqa: E402
from timelyllm_ros.engines.simulated import LatencyProfile, SimulatedEngine  # noqa: E402
from timelyllm_ros.workloads.format import default_catalog  # noqa: E402
from timelyllm_ros.sim.prompts import SimPromptSource  # noqa: E402
from timelyllm_ros.sim.robots import SimulatedRobots  # noqa: E402
from timelyllm_ros.sim.runner import VLLM_MAX_NUM_SEQS, EventLoop, RequestLanes  # noqa: E402
from timelyllm_ros.core.tokenizer import SimTokenizer  # noqa: E402

# The mixed_small demo's traces: tello (normal + urgent), arm (long plans), chat.
TRACES = ("T1", "T3", "T6", "T7", "T9", "T10", "C1", "C2", "C3")
GOALS_US = {8: 50.0, 1000: 1000.0}
DECODE_S = 0.022
WARM_STEPS = 32  # engine steps each policy sees before its points are timed (`--warm-steps`)
_TOKEN = 13  # the token a running generation gets at each scheduling point (any id)


# ------------------------------------------------------------------------------------------ setup
class _FirstSegmentsFirst(Policy):
    """Warm-up only: start every queued request before resuming anyone, so that suspended
    generations accumulate (every real policy resumes them promptly)."""

    name = "first-segments-first"

    def priority(self, g, ctx, now):
        return 1.0 if g.k == 0 else 0.0


class _Sim:
    """A planner on the simulated engine and robots, assembled as ``run_simulation`` does."""

    def __init__(self, policy_name: str | Policy, robots: dict, seed: int) -> None:
        self.clock = VirtualClock()
        self.loop = EventLoop(self.clock)
        tok = SimTokenizer()
        self.policy = make_policy(policy_name) if isinstance(policy_name, str) else policy_name
        self.engine = SimulatedEngine(self.clock, LatencyProfile.from_yaml(), tok,
                                      scheduling_policy=self.policy.engine_scheduling)  # vllm-priority
        builder = PlannerBuilder(PlannerParts(clock=self.clock, engine=self.engine, robots=robots, policy=self.policy,
                                              prompts=SimPromptSource(self.engine, tok, robots=robots),
                                              config=PlannerConfig(max_queued=100_000, max_live=100_000)))
        robots_sim = SimulatedRobots(self.loop.view, robots, builder.post_result,
                                     self.loop.schedule, seed=seed, network_latency_s=0.008)
        self.planner = builder.build(RequestLanes(robots_sim)).planner

    def batcher(self, cap: int):
        """The planner's own choice for this policy (`Planner.use_batching`, i.e.
        `Policy.batching()`: latency-guided or continuous), bounded by `cap` sequences."""
        self.planner.use_batching(None, cap)
        return self.planner.batcher

    def submit_burst(self, n: int, catalog: dict, rng: random.Random, spread_s: float = 2.0) -> None:
        times = sorted(rng.uniform(0.0, spread_s) for _ in range(n))
        for i, t in enumerate(times):
            self.clock.advance_to(max(self.clock.now(), t))
            task = catalog[rng.choice(TRACES)]
            scene = task.scenes[rng.randrange(len(task.scenes))]
            tuf = URGENT if task.category == "urgent" else NORMAL
            req = PlanRequest(request_id=f"r{i:05d}", robot_id=f"{task.robot_type}{i}",
                              robot_type=task.robot_type, task=task.task, scene=scene.scene, tuf=tuf,
                              arrival=self.clock.now(), task_type=task.task_id, category=task.category,
                              reference_plan=scene.plan)
            res = self.planner.submit(req)
            if not res.accepted:
                raise RuntimeError(f"request refused: {res.reason}")

    def run_step(self) -> bool:
        self.loop.fire_due()
        ran = self.planner.step()
        if not ran:
            nxt = self.loop.next_time()
            if nxt is not None:
                self.clock.advance_to(nxt)
        return ran


def ready_running(planner: Planner) -> tuple[list[Generation], list[Generation]]:
    live = planner.live()
    return ([g for g in live if g.state in (GenState.QUEUED, GenState.SUSPENDED)],
            [g for g in live if g.state is GenState.RUNNING])


def build_mix(n_ready: int, n_running: int, robots: dict, catalog: dict, seed: int) -> tuple[_Sim, list[Generation]]:
    """Planner state with n_ready + n_running ready generations of mixed kinds (see module doc):
    half of them suspended with dispatched segments, half without any segment yet."""
    rng = random.Random(seed)
    sim = _Sim(_FirstSegmentsFirst(), robots, seed)
    want = n_ready + n_running
    total = 2 * want + 4
    sim.submit_burst(total, catalog, rng)
    sim.planner.batcher = sim.planner.fixed(64)
    p = sim.planner

    def suspended() -> int:
        return sum(1 for g in p.live() if g.segments and g.state in (GenState.SUSPENDED, GenState.RUNNING))

    for i in range(20_000):
        if i % 10 == 0 and suspended() >= want // 2 + 1:
            break
        sim.run_step()
    now = sim.clock.now()
    for g in [g for g in p.live() if g.state is GenState.RUNNING]:  # preempt mid-segment
        p.engine.abort(g.gen_id, "cache")
        g.state = GenState.SUSPENDED if g.segments else GenState.QUEUED
        g.ready_since = now
    sim.loop.fire_due()
    p._drain_inbox()  # results that arrived: executed segments, blocking ones back to SUSPENDED
    ready, _ = ready_running(p)
    with_segs = [g for g in ready if g.segments]
    without = [g for g in ready if not g.segments]
    k = min(len(with_segs), want // 2 + 1)
    if k + len(without) < want:
        raise RuntimeError(f"mix has only {len(ready)} ready generations, need {want}")
    mix = with_segs[:k] + without[: want - k]
    rng.shuffle(mix)
    return sim, mix


def clone(gens: list[Generation]) -> list[Generation]:
    """Independent copies for one policy (token lists are shared: select() never mutates them)."""
    return [dataclasses.replace(g, segments=[dataclasses.replace(s) for s in g.segments],
                                policy=copy.deepcopy(g.policy), cached_tokens=list(g.cached_tokens))
            for g in gens]


def describe(ready: list[Generation]) -> str:
    kinds: dict[str, int] = {}
    for g in ready:
        kinds[g.request.robot_type] = kinds.get(g.request.robot_type, 0) + 1
    queued = sum(1 for g in ready if not g.segments)
    executed = sum(1 for g in ready for s in g.segments if s.exec_end is not None)
    partial = sum(1 for g in ready if g.output_ids and (not g.segments or g.seg_tokens))
    segs = sum(len(g.segments) for g in ready)
    return (f"{len(ready)} ready: {queued} queued first segments, {len(ready) - queued} suspended "
            f"({segs} dispatched segments, {executed} executed), {partial} preempted mid-segment; "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))


# ------------------------------------------------------------------------------------------ timing
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def bench_point(sim: _Sim, mix: list[Generation], policy_name: str, n_ready: int, n_running: int, budget_s: float,
                max_iter: int, warm_steps: int = WARM_STEPS) -> dict[str, Any]:
    """Median / p99 of one scheduling point for `policy_name` on a copy of the mixed state."""
    p = sim.planner
    gens = clone(mix)
    running, ready = gens[:n_running], gens[n_running:]
    policy = make_policy(policy_name)
    engine = SimulatedEngine(VirtualClock(sim.clock.now()), sim.engine.profile, sim.engine.tokenizer,
                             scheduling_policy=policy.engine_scheduling)  # vllm-priority: vLLM's own
    for g in running:  # the running batch really holds KV: stats and budgets are the engine's
        engine.set_script(g.gen_id, g.request.reference_plan or "")
        engine.add(g.gen_id, g.prompt_ids + g.output_ids, 64)
        g.state = GenState.RUNNING
        g.seg_start = g.seg_start if g.seg_start is not None else engine.clock.now()
    # the controller the runner installs for this policy (max_num_seqs); results go to the mix's planner
    planner = PlannerBuilder(PlannerParts(clock=engine.clock, engine=engine, robots=p.robots, policy=policy,
                                          prompts=p.prompts, config=p.config, max_num_seqs=VLLM_MAX_NUM_SEQS,
                                          estimator=p.estimator)).build(p.dispatcher).planner
    planner.seg_gen_s, planner.token_s = p.seg_gen_s, p.token_s
    planner.iteration = p.iteration
    # a policy in service has seen engine steps: its online models (`default`'s step-time model,
    # rules 9, 10 and 14, and its load factor) are fed the profile's decode steps at widths up to
    # the running batch first, as after a few seconds of serving (a fresh model would keep rule
    # 10's slow start, whose cap follows the running batch, at every point)
    for k in range(warm_steps):
        w = max(1, n_running * (k % 8 + 1) // 8)
        policy.on_step(sim.engine.profile.step_s(seqs=w), w)
    batcher = planner.batcher
    now = engine.clock.now()
    wall: list[float] = []
    cpu: list[float] = []
    refused = 0
    t_end = time.perf_counter() + budget_s
    while len(wall) < max_iter and (len(wall) < 20 or time.perf_counter() < t_end):
        now += DECODE_S
        planner.iteration += 1
        planner._stats = None  # a new scheduling point: fresh engine stats, as after a step
        grow = len(wall) % 2 == 0
        for g in running:  # ... which gave each running generation a token (`touch_tokens`): its
            if grow:       # output and segment grow, as after an engine step (every other point the
                g.output_ids.append(_TOKEN)  # token is taken back: the same lengths, bounded)
                g.seg_tokens += 1
            else:
                g.output_ids.pop()
                g.seg_tokens -= 1
            g.touch_tokens()
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        # --- one scheduling point (Planner._schedule without the engine calls) ---
        ctx = planner.context(running)
        sel = policy.select(ready, running, ctx, now)
        head = next((g for g in sel.order if g.state in (GenState.QUEUED, GenState.SUSPENDED)), None)
        if head is not None:
            ok, why = batcher.can_admit(running, head, planner._engine_stats(), now)
            if not ok:
                head.blocked = why
        # ---
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        wall.append((w1 - w0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
        if head is not None and not ok:
            refused += 1
    return {"wall": wall, "cpu": cpu, "refused": refused}


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Median / p99 over every round's samples of one policy (`bench_point` results pooled)."""
    wall = [x for r in samples for x in r["wall"]]
    cpu = [x for r in samples for x in r["cpu"]]
    return {"n": len(wall), "wall_med": statistics.median(wall), "wall_p99": pct(wall, 0.99),
            "cpu_med": statistics.median(cpu), "cpu_p99": pct(cpu, 0.99),
            "refused": sum(r["refused"] for r in samples)}


def rounds_order(policies: list[str], rounds: int) -> list[str]:
    """Every policy once per round, the start rotating each round, so that every policy samples
    the whole run: this machine's speed swings by up to ~1.7x between seconds (one policy's
    median moved 776 -> 1,254 µs between two back-to-back runs), and a policy measured in one
    block would carry whatever seconds it fell in."""
    k = len(policies)
    return [policies[(r + i) % k] for r in range(rounds) for i in range(k)]


def bench_step(policy_name: str, n_ready: int, n_running: int, robots: dict, catalog: dict, seed: int,
               warmup: int, steps: int) -> dict[str, Any]:
    """Median / p99 of a whole Planner.step() with N + running requests submitted at once."""
    rng = random.Random(seed)
    sim = _Sim(policy_name, robots, seed)
    sim.planner.batcher = sim.batcher(n_running)
    sim.submit_burst(n_ready + n_running, catalog, rng, spread_s=0.5)
    for _ in range(warmup):
        sim.run_step()
    wall: list[float] = []
    cpu: list[float] = []
    n_ready_seen: list[int] = []
    n_run_seen: list[int] = []
    for _ in range(steps):
        sim.loop.fire_due()
        ready, running = ready_running(sim.planner)
        n_ready_seen.append(len(ready))
        n_run_seen.append(len(running))
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        ran = sim.planner.step()
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        wall.append((w1 - w0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
        if not ran:
            nxt = sim.loop.next_time()
            if nxt is not None:
                sim.clock.advance_to(nxt)
    return {"n": len(wall), "wall_med": statistics.median(wall), "wall_p99": pct(wall, 0.99),
            "cpu_med": statistics.median(cpu), "cpu_p99": pct(cpu, 0.99),
            "ready": statistics.fmean(n_ready_seen), "running": statistics.fmean(n_run_seen)}


# ------------------------------------------------------------------------------------------ main
def machine() -> str:
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), platform.processor())
    except OSError:
        model = platform.processor()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}; "
            f"load average (1/5/15 min) {load}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,1000", help="comma-separated ready-queue sizes")
    ap.add_argument("--running", type=int, default=8, help="generations in the running batch")
    ap.add_argument("--policy", action="append", help="policy (repeatable; default: every registered one)")
    ap.add_argument("--budget-s", type=float, default=2.0,
                    help="wall seconds per policy and size, split over --rounds")
    ap.add_argument("--rounds", type=int, default=4,
                    help="measure every policy in this many rounds, in turn (the machine's speed drifts): "
                         "the figures pool every round's scheduling points")
    ap.add_argument("--max-iter", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-step", action="store_true", help="skip the Planner.step() measurement")
    ap.add_argument("--step-steps", type=int, default=40)
    ap.add_argument("--warm-steps", type=int, default=WARM_STEPS,
                    help="engine steps each policy's online models see before its points are timed (0: a fresh "
                         "policy, as before 2026-11-30: `default`'s step-time cap then stays in its slow start)")
    args = ap.parse_args()
    if args.rounds < 1 or not args.budget_s > 0 or args.max_iter < 1 or args.warm_steps < 0:
        ap.error("--rounds and --max-iter must be >= 1, --budget-s > 0, --warm-steps >= 0")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    policies = args.policy or policy_names()
    robots = load_robots()
    catalog = default_catalog(robots)
    print(f"machine: {machine()}")
    print(f"policies: {', '.join(policies)}; running batch {args.running}\n")

    for n in sizes:
        t0 = time.perf_counter()
        sim, mix = build_mix(n, args.running, robots, catalog, args.seed)
        print(f"== scheduling point, {n} ready + {args.running} running "
              f"(state built in {time.perf_counter() - t0:.1f} s; {describe(mix[args.running:])})")
        goal = GOALS_US.get(n)
        print(f"{'policy':<16} {'iters':>6} {'cpu med':>9} {'cpu p99':>9} {'wall med':>9} {'wall p99':>9}  "
              f"{'head refused':>12}  goal" + (f" (<= {goal:g} µs)" if goal else ""))
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
        per_round = max(1, args.max_iter // args.rounds)
        for name in rounds_order(policies, args.rounds):
            samples[name].append(bench_point(sim, mix, name, n, args.running, args.budget_s / args.rounds,
                                             per_round, args.warm_steps))
        for name in policies:
            r = summary(samples[name])
            verdict = "" if goal is None else ("met" if r["cpu_med"] <= goal else "NOT met")
            print(f"{name:<16} {r['n']:>6} {r['cpu_med']:>9.1f} {r['cpu_p99']:>9.1f} {r['wall_med']:>9.1f} "
                  f"{r['wall_p99']:>9.1f}  {r['refused']:>12}  {verdict}", flush=True)
        print()

    if not args.no_step:
        for n in sizes:
            print(f"== Planner.step() with the simulated engine, {n} + {args.running} submitted, "
                  f"batch cap {args.running} (20 warm-up steps, {args.step_steps} timed)")
            print(f"{'policy':<16} {'ready':>7} {'running':>7} {'cpu med':>9} {'cpu p99':>9} {'wall med':>9} "
                  f"{'wall p99':>9}   (µs per step)")
            for name in policies:
                r = bench_step(name, n, args.running, robots, catalog, args.seed, 20, args.step_steps)
                print(f"{name:<16} {r['ready']:>7.0f} {r['running']:>7.1f} {r['cpu_med']:>9.0f} "
                      f"{r['cpu_p99']:>9.0f} {r['wall_med']:>9.0f} {r['wall_p99']:>9.0f}", flush=True)
            print()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
