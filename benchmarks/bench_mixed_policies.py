#!/usr/bin/env python3
"""Robots + chat on one engine: timelyllm, trail, andes, fcfs side by side, each with its metric.

    python benchmarks/bench_mixed_policies.py               # workloads/chat_mixed.yaml
    python benchmarks/bench_mixed_policies.py --max-batch 8 --duration 60

Simulator (RTX 4090 / Llama3-8B profile).  Every policy sees the same arrivals.  Columns: time
utility (TimelyLLM's metric: TUF0 of the response time, % of max; overall and urgent tasks),
mean request latency and TTFT (Trail's: last / first token − arrival, all requests), and QoE of
the chat replies (Andes': average and share >= 0.95).  Without --max-batch each policy uses the
runner's batching: TimelyLLM's latency-guided controller for segmenting policies, vLLM's 256-seq
cap for stream ones; --max-batch N caps every policy at N (a memory-limited GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from _policy_bench import ROOT, Probe, catalog, fmt, latency_metrics, qoe_metrics

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.workloads.format import load_workload
from timelyllm_ros.sim.runner import run_simulation

POLICIES = {
    "timelyllm": {},
    "trail": {"predictor": "learned"},
    "andes": {},
    "fcfs": {},
    "vllm-stream": {},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "chat_mixed.yaml"))
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    wl = load_workload(args.workload)
    if args.duration:
        wl = dataclasses.replace(wl, duration_s=args.duration)
    cat = catalog(with_robots=True)
    robots = load_robots()
    rows = []
    cap = f"batch cap {args.max_batch}" if args.max_batch else "runner's default batching"
    print(f"# Mixed robots + chat, {wl.name} ({wl.duration_s:g} s, {cap}) — simulator\n")
    print("| policy | req | utility % max | urgent utility % max | mean lat s | mean TTFT s | chat QoE | chat QoE ≥ 0.95 | preemptions | failed | decision ms (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pol in args.policies:
        params = dict(POLICIES.get(pol, {}))
        if pol == "andes" and args.max_batch:
            params["max_batch"] = args.max_batch
        probe = Probe()
        t0 = time.perf_counter()
        res = run_simulation(wl, pol, max_batch=args.max_batch, catalog=cat, policy_params=params,
                             setup=probe.setup)
        lm = latency_metrics(res, probe)
        q = qoe_metrics(res, robots)
        m = res.metrics
        urgent = m["by_category"].get("urgent", {})
        failed = sum(v for k, v in m["overall"]["states"].items() if k != "finished")
        row = {"policy": pol, "params": params, "requests": len(res.generations),
               "utility_pct": m["overall"]["utility_pct_of_max"], "urgent_utility_pct": urgent.get("utility_pct_of_max"),
               "qoe": q, **lm, "failed": failed, "batcher": res.batcher, "wall_s": time.perf_counter() - t0}
        rows.append(row)
        print(f"| {pol} | {row['requests']} | {fmt(row['utility_pct'], 1)} | {fmt(row['urgent_utility_pct'], 1)} | "
              f"{fmt(lm['latency']['mean'])} | {fmt(lm['ttft']['mean'], 3)} | {fmt(q['qoe_mean'], 3)} | "
              f"{fmt(100 * q['share_ge'] if q['share_ge'] is not None else None, 1)} % | {lm['policy_preemptions']} | "
              f"{failed} | {fmt(lm['select_ms_mean'], 2)} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
