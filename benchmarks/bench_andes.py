#!/usr/bin/env python3
"""Andes vs FCFS vs TimelyLLM on bursty chat traffic: average QoE and share with QoE >= 0.95.

    python benchmarks/bench_andes.py            # several loads (minutes)
    python benchmarks/bench_andes.py --quick

Arrivals follow Andes' cyclic burst pattern (§6.3): each cycle has a burst phase taking
``--burst-duration`` (35 %) of the cycle at ``--burst-intensity`` (2×) the cycle's average rate,
and a calm phase carrying the rest; Poisson within each phase.  Requests are chat questions from
workloads/chat_tasks.yaml (drawn by expanding workloads/chat_poisson.yaml, then re-timed).  Users
read at 4.8 tok/s (Andes' reading speed), TTFT target = the chat TUF's ERT (1 s).  A reply reaches
the user when its sentence is dispatched.  Batch capped at --max-batch (see bench_trail.py).

Policies: ``andes`` (stream mode, token-level preemption), ``vllm-stream`` (vLLM FCFS, the paper's
baseline), ``fcfs`` and ``timelyllm`` (segmented: each sentence suspends the generation and is
re-queued — TimelyLLM's chatbot mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

from _policy_bench import ROOT, Probe, catalog, fmt, latency_metrics, qoe_metrics

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.workloads.format import load_workload
from timelyllm_ros.sim.runner import run_simulation


def cyclic_times(rate: float, cycle_s: float, cycles: int, intensity: float, duration: float,
                 seed: int) -> list[float]:
    """Arrival times: per cycle a burst phase (duration·cycle at intensity·rate) then a calm phase
    with the remaining (1 − intensity·duration)/(1 − duration) of the rate."""
    if not (0 < duration < 1 and intensity * duration < 1):
        raise ValueError("burst duration must be in (0, 1) and intensity·duration < 1")
    rng = random.Random(seed)
    calm = rate * (1 - intensity * duration) / (1 - duration)
    out: list[float] = []
    for c in range(cycles):
        t0 = c * cycle_s
        for lo, hi, lam in ((t0, t0 + duration * cycle_s, intensity * rate), (t0 + duration * cycle_s, t0 + cycle_s, calm)):
            t = lo
            while lam > 0:
                t += rng.expovariate(lam)
                if t >= hi:
                    break
                out.append(t)
    return out


def parse_policy(label: str) -> tuple[str, dict]:
    """"andes:refine=false,delta_t=2" -> ("andes", {"refine": False, "delta_t": 2.0})."""
    name, _, rest = label.partition(":")
    params: dict = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        low = v.lower()
        params[k] = False if low == "false" else True if low == "true" else float(v) if "." in v or "e" in low else int(v)
    return name, params


def make_setup(times: list[float], probe: Probe):
    def setup(planner, arrivals):
        probe.setup(planner, arrivals)
        if len(arrivals) < len(times):
            raise RuntimeError(f"need {len(times)} requests, workload expanded to {len(arrivals)}")
        return [dataclasses.replace(a, time=t, request_id=f"c{i:05d}") for i, (a, t) in enumerate(zip(arrivals, times))]
    return setup


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 3.0, 4.0], help="cycle-average req/s")
    ap.add_argument("--cycle", type=float, default=60.0)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--burst-intensity", type=float, default=2.0)
    ap.add_argument("--burst-duration", type=float, default=0.35)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--policies", nargs="+", default=["andes", "vllm-stream", "fcfs", "timelyllm"],
                    help="names, with parameters as name:k=v,k=v (e.g. andes:refine=false)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.quick:
        args.rates, args.cycles, args.cycle = [4.0], 1, 40.0
    cat = catalog()
    robots = load_robots()
    base = load_workload(ROOT / "workloads" / "chat_poisson.yaml")
    out: dict = {"args": vars(args), "runs": []}
    print(f"# Andes on cyclic bursts (simulator; intensity {args.burst_intensity:g}, duration "
          f"{args.burst_duration:.0%}, cycle {args.cycle:g} s × {args.cycles}, batch cap {args.max_batch})\n")
    print("| avg rate | policy | req | avg QoE | QoE ≥ 0.95 | mean TTFT s | mean lat s | preemptions | QoE ×vllm-stream | decision ms (mean/p99) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in args.rates:
        times = cyclic_times(rate, args.cycle, args.cycles, args.burst_intensity, args.burst_duration, args.seed)
        pool = dataclasses.replace(base, rate_per_s=max(rate * 3, 5.0), duration_s=args.cycle * args.cycles,
                                   seed=args.seed)
        ref = None
        rows = []
        for label in args.policies:
            pol, params = parse_policy(label)
            if pol == "andes":
                params.setdefault("max_batch", args.max_batch)
            probe = Probe()
            t0 = time.perf_counter()
            res = run_simulation(pool, pol, max_batch=args.max_batch, catalog=cat, policy_params=params,
                                 setup=make_setup(times, probe))
            q = qoe_metrics(res, robots)
            lm = latency_metrics(res, probe)
            row = {"rate": rate, "policy": label, "qoe": q, **lm, "wall_s": time.perf_counter() - t0}
            rows.append(row)
            if pol == "vllm-stream":
                ref = q["qoe_mean"]
        for row in rows:
            q = row["qoe"]
            gain = (q["qoe_mean"] / ref) if ref else None
            out["runs"].append(row)
            print(f"| {rate:g}/s | {row['policy']} | {q['count']} | {fmt(q['qoe_mean'], 3)} | {fmt(100 * q['share_ge'], 1)} % | "
                  f"{fmt(row['ttft']['mean'], 2)} | {fmt(row['latency']['mean'], 2)} | {row['policy_preemptions']} | "
                  f"{fmt(gain)} | {fmt(row['select_ms_mean'], 2)}/{fmt(row['select_ms_p99'], 1)} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
