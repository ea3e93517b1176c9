"""Burst: 1,000 requests within one second against the simulator engine.

Admission control must keep queues and memory bounded by configuration: over-limit requests are
rejected at once with a reason, accepted ones all end terminal.  Prints peak RSS, the largest
queue seen, rejections by reason and the terminal states.

    python benchmarks/burst.py --requests 1000 --max-queued 200 --max-live 400
"""

from __future__ import annotations

import argparse
import resource
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyllm_ros.core.planner import PlannerConfig  # noqa: E402
from timelyllm_ros.core.types import GenState  # noqa: E402
from timelyllm_ros.lrtrace import parse_workload  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--max-queued", type=int, default=200)
    ap.add_argument("--max-live", type=int, default=400)
    ap.add_argument("--max-per-agent", type=int, default=8)
    ap.add_argument("--policy", default="timelyllm")
    args = ap.parse_args()
    tasks = ["T1", "T2", "T3", "T6", "T7", "T9", "T10", "C1"]
    reqs = [{"time": round(i / args.requests, 6), "task": tasks[i % len(tasks)], "scene": i % 5}
            for i in range(args.requests)]
    n_arm, n_chat = max(1, args.agents // 4), max(1, args.agents // 8)
    wl = parse_workload({
        "name": f"burst{args.requests}", "duration_s": 1, "seed": 7,
        "agents": {"tello": args.agents - n_arm - n_chat, "arm": n_arm, "chat": n_chat},
        "tuf": {"normal": {"ert": 1.0, "alpha": -2.0, "beta": 1.0}, "urgent": {"ert": 0.2, "alpha": -6.67, "beta": 2.0},
                "chat": {"ert": 1.0, "alpha": -2.0, "beta": 1.0}},
        "requests": reqs}, "<burst>")
    cfg = PlannerConfig(max_queued=args.max_queued, max_live=args.max_live, max_per_agent=args.max_per_agent)
    peak = {"queued": 0, "live": 0}

    def setup(planner, arrivals):
        orig = planner.step

        def step():
            live = planner.live()
            peak["live"] = max(peak["live"], len(live))
            peak["queued"] = max(peak["queued"], sum(1 for g in live if g.state is GenState.QUEUED))
            return orig()

        planner.step = step
        return arrivals

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = run_simulation(wl, args.policy, config=cfg, setup=setup)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    states = Counter(g.state.value for g in res.generations)
    rejected = [g for g in res.generations if g.reason.startswith("rejected")]
    reasons = Counter(g.reason.split("(")[0].split("'")[0].strip() for g in rejected)
    accepted = len(res.generations) - len(rejected)
    nonterminal = sum(1 for g in res.generations if not g.state.terminal)
    print(f"burst — simulator (profile rtx4090_llama3_8b): {args.requests} requests in 1 s, policy {args.policy}, "
          f"limits max_queued={args.max_queued} max_live={args.max_live} max_per_agent={args.max_per_agent}")
    print(f"accepted {accepted}, rejected {len(rejected)}, accepted but not terminal {nonterminal}")
    print(f"terminal states: {dict(states)}")
    print(f"rejection reasons: {dict(reasons)}")
    print(f"peak live generations {peak['live']} (limit {args.max_live}), peak queued {peak['queued']} "
          f"(limit {args.max_queued})")
    print(f"peak RSS {rss / 1024:.0f} MiB (before the run {rss0 / 1024:.0f} MiB); simulated {res.virtual_end_s:.1f} s "
          f"in {res.wall_s:.1f} s wall")
    ok = nonterminal == 0 and peak["live"] <= args.max_live and peak["queued"] <= args.max_queued
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
