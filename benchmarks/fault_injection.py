"""Fault injection: executor failures/timeouts, engine crashes and slow robots (simulator).

For each scenario: every request must end terminal (the runner raises otherwise); printed are the
counts by state and the time utility of the requests no fault touched, relative to the same
requests in a fault-free run (goal: within 10 %).

    python benchmarks/fault_injection.py --workload WID1 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys

from timelyllm_ros.core.metrics import request_metrics  # noqa: E402
from timelyllm_ros.engines.base import EngineError  # noqa: E402
from timelyllm_ros.sim.robots import FaultConfig  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402


class CrashingEngine:
    """The simulated engine, but each step dies with probability p (its running KV is lost);
    the planner's supervisor restarts it (`engine_restart`)."""

    def __init__(self, inner, p: float, seed: int, planner) -> None:
        self.inner, self.p, self.rng, self.planner, self.crashes = inner, p, random.Random(seed), planner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self):
        if self.rng.random() < self.p:
            self.crashes += 1
            for g in self.planner.live():
                if g.state.value == "running":
                    self.inner.abort(g.gen_id, "discard")
            raise EngineError(f"injected engine crash #{self.crashes}")
        return self.inner.step()


def run(workload: str, seed: int, policy: str, faults: FaultConfig | None = None, engine_p: float = 0.0):
    holder = {}

    def setup(planner, arrivals):
        if engine_p > 0:
            eng = CrashingEngine(planner.engine, engine_p, seed, planner)
            planner.engine = eng
            planner.engine_restart = lambda old: eng  # same object: its inner engine lost the KV
            planner.config.max_engine_restarts = 10_000
            holder["engine"] = eng
        return arrivals

    res = run_simulation(workload, policy, seed=seed, faults=faults, setup=setup)
    return res, holder.get("engine")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="WID1")
    ap.add_argument("--policy", default="timelyllm")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    base, _ = run(args.workload, args.seed, args.policy)
    base_u = {g.gen_id: request_metrics(g).utility for g in base.generations}
    scenarios = [
        ("executor faults 5 %", FaultConfig(reject_p=0.0167, abort_p=0.0167, timeout_p=0.0166, timeout_s=5.0), 0.0),
        ("executor faults 20 %", FaultConfig(reject_p=0.0667, abort_p=0.0667, timeout_p=0.0666, timeout_s=5.0), 0.0),
        ("engine crashes (1 per ~500 steps)", None, 0.002),
        ("slow robots (x2 execution time)", FaultConfig(slow_factor=2.0), 0.0),
    ]
    print(f"fault injection — simulator (profile rtx4090_llama3_8b), workload {args.workload}, "
          f"policy {args.policy}, seed {args.seed}; fault-free requests: {len(base.generations)}")
    print(f"{'scenario':36} {'requests':>8} {'finished':>8} {'failed':>6} {'cancelled':>9} {'non-terminal':>12} "
          f"{'unaffected':>10} {'utility vs fault-free':>22}")
    worst = 0.0
    for name, faults, engine_p in scenarios:
        res, eng = run(args.workload, args.seed, args.policy, faults, engine_p)
        states: dict[str, int] = {}
        for g in res.generations:
            states[g.state.value] = states.get(g.state.value, 0) + 1
        nonterminal = sum(1 for g in res.generations if not g.state.terminal)
        unaffected = [g for g in res.generations if g.state.value == "finished" and not g.engine_restarts]
        if faults is not None and faults.slow_factor != 1.0:
            unaffected = [g for g in res.generations if g.state.value == "finished"]
        u_now = sum(request_metrics(g).utility for g in unaffected)
        u_base = sum(base_u[g.gen_id] for g in unaffected)
        rel = (u_now - u_base) / abs(u_base) if u_base else 0.0
        worst = max(worst, abs(rel))
        extra = f" ({eng.crashes} crashes, {res.planner.get('engine_restarts', eng.crashes)} restarts)" if eng else ""
        print(f"{name:36} {len(res.generations):>8} {states.get('finished', 0):>8} {states.get('failed', 0):>6} "
              f"{states.get('cancelled', 0):>9} {nonterminal:>12} {len(unaffected):>10} {100 * rel:>+21.1f}%{extra}")
        reasons: dict[str, int] = {}
        for g in res.generations:
            if g.state.value != "finished":
                key = g.reason.split(":")[0][:50]
                reasons[key] = reasons.get(key, 0) + 1
        if reasons:
            print("    reasons:", ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items(), key=lambda x: -x[1])[:4]))
    print(f"largest utility change of unaffected requests: {100 * worst:.1f} % (goal <= 10 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
