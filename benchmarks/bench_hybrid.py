"""Hybrid offline-online scheduling in the paper's PD-competition setting (simulator).

    python benchmarks/bench_hybrid.py               # GSM8K-like batch + a 20-case study
    python benchmarks/bench_hybrid.py --cases 100   # the paper's 100-case study

Prints total time, utilisation, prefill stages / decode rounds, tokens/s and the gap to the lower
bounds for baseline / offline / online / offline+online (plus ablations: each online rule alone,
our "idle" variant of the prefill-vs-decode rule, and a round-robin baseline), then the
multi-case averages.  Paper (LLaMA-65B, 8 Ascend NPUs): utilisation 80.2 % -> 85.5 % (offline)
-> 86.19 % (online) -> 89.06 % (both); total 201.00 -> 197.08 -> 193.33 -> 190.58 s; lower bound
180 s; +8.0 % utilisation on average over 100 cases.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from timelyllm_ros.offline.batch import load_batch, generate_requests  # noqa: E402
from timelyllm_ros.offline.makespan import lpt, solve  # noqa: E402
from timelyllm_ros.offline.pd_sim import STRATEGIES, lower_bounds, simulate  # noqa: E402

MAIN = ("baseline", "offline", "online", "offline+online")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=Path, default=ROOT / "workloads" / "hybrid_gsm8k.yaml")
    ap.add_argument("--cases", type=int, default=20, help="random cases for the multi-case study (paper: 100)")
    a = ap.parse_args(argv)
    b = load_batch(a.batch)
    reqs, J, lat = b.requests, b.slots, b.latency
    t0 = time.perf_counter()
    plan = solve([r.est_output_tokens for r in reqs], J)
    t_plan = time.perf_counter() - t0
    t_lpt = lpt([r.est_output_tokens for r in reqs], J)
    lb = lower_bounds(reqs, J, lat)
    print(f"Hybrid offline-online (simulator, PD competition): {b.name}, {len(reqs)} requests, J={J}")
    print(f"offline plan: LPT {t_lpt.makespan:.0f} rounds -> {plan.method} {plan.makespan:.0f} rounds in "
          f"{t_plan:.2f} s; P||Cmax lower bound {plan.lower_bound:.0f} "
          f"({'optimal' if plan.optimal else f'gap {100 * plan.gap:.3f} %'})")
    print(f"lower bound on total time: paper Eq. (31)-(32) {lb.paper_s:.2f} s (t_p* {lb.paper_prefill_s:.2f} s "
          f"+ t_d* {lb.paper_decode_s:.2f} s); strict (this latency model) {lb.strict_s:.2f} s")
    print(f"{'strategy':28} {'total s':>8} {'util %':>7} {'stages':>7} {'rounds':>7} {'tok/s':>6} {'gap LB':>7} {'steals':>6}")
    rows = [(n, {}) for n in MAIN] + [("online-requests", {}), ("online-iteration", {}),
                                      ("online", {"iteration_rule": "idle"}),
                                      ("offline+online", {"iteration_rule": "idle"}),
                                      ("baseline", {"assignment": "round_robin"})]
    for name, kw in rows:
        s = STRATEGIES[name]
        r = simulate(reqs, J, lat, s, plan=plan if s.offline else None, **kw)
        assert r.finished == len(reqs)
        print(f"{r.strategy:28} {r.total_s:8.2f} {100 * r.utilisation:7.1f} {r.prefill_stages:7d} "
              f"{r.decode_rounds:7d} {r.tokens_per_s:6.0f} {r.total_s - lb.paper_s:7.2f} {r.steals:6d}")
    if a.cases > 0:
        util: dict[str, list[float]] = {n: [] for n in MAIN}
        total: dict[str, list[float]] = {n: [] for n in MAIN}
        for c in range(a.cases):
            rs = generate_requests(len(reqs), 1000 + c, {"mean": 68.43, "std": 25.04, "min": 1},
                                   {"mean": 344.83, "std": 187.99, "min": 1, "max": 512})
            p = solve([r.est_output_tokens for r in rs], J)
            for n in MAIN:
                s = STRATEGIES[n]
                r = simulate(rs, J, lat, s, plan=p if s.offline else None)
                util[n].append(r.utilisation)
                total[n].append(r.total_s)
        print(f"{a.cases} random cases (seeds 1000..{1000 + a.cases - 1}): mean utilisation / total time")
        for n in MAIN:
            d = [100 * (u - b0) for u, b0 in zip(util[n], util["baseline"])]
            print(f"  {n:16} {100 * statistics.mean(util[n]):5.1f} %  {statistics.mean(total[n]):7.2f} s"
                  f"   vs baseline {statistics.mean(d):+5.1f} pts (min {min(d):+.1f}, max {max(d):+.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
