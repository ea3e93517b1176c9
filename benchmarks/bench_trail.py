#!/usr/bin/env python3
"""Trail vs FCFS on chat workloads with a realistic reply-length spread (simulator).

    python benchmarks/bench_trail.py                    # full sweep (several minutes)
    python benchmarks/bench_trail.py --quick            # one rate, shorter

Setup: workloads/chat_poisson.yaml (Poisson arrivals, rate swept) and workloads/chat_burst.yaml,
replies from workloads/chat_tasks.yaml (held out from the length predictor's training data), the
RTX 4090 / Llama3-8B latency profile, batch capped at --max-batch (a GPU whose KV holds that many
replies: what makes queueing, and so scheduling, matter).  Baseline = ``vllm-stream`` (vLLM's FCFS
continuous batching, streaming each sentence as it is generated — Trail's own comparison point);
trail runs in the same stream mode.  Latency = last token − arrival, TTFT = first token − arrival,
preempted KV = generated tokens of preempted, not yet resumed generations (time mean and peak;
their prompts are mostly the shared, cached prefix).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from _policy_bench import ROOT, Probe, catalog, fmt, latency_metrics

from timelyllm_ros.workloads.format import load_workload
from timelyllm_ros.sim.runner import run_simulation


def run(wl, policy, params, max_batch, cat):
    probe = Probe()
    t0 = time.perf_counter()
    res = run_simulation(wl, policy, max_batch=max_batch, catalog=cat, policy_params=params, setup=probe.setup)
    m = latency_metrics(res, probe)
    m["wall_s"] = time.perf_counter() - t0
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 3.0, 4.0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--c-rate", type=float, default=4.0, help="arrival rate of the c sweep")
    ap.add_argument("--cs", type=float, nargs="+", default=[0.2, 0.5, 0.8, 1.0])
    ap.add_argument("--predictors", nargs="+", default=["learned", "oracle"],
                    help="learned | oracle | noisy:P (noisy oracle, relative error P)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only-c", action="store_true", help="just the c sweep")
    ap.add_argument("--json", help="also write all numbers here")
    args = ap.parse_args(argv)
    if args.quick:
        args.rates, args.duration, args.cs, args.predictors = [4.0], 30.0, [0.2, 1.0], ["learned"]
    cat = catalog()
    base = load_workload(ROOT / "workloads" / "chat_poisson.yaml")
    burst = load_workload(ROOT / "workloads" / "chat_burst.yaml")
    out: dict = {"max_batch": args.max_batch, "duration_s": args.duration, "runs": []}
    print(f"# Trail vs FCFS (simulator, RTX 4090 / Llama3-8B profile, batch cap {args.max_batch})\n")
    print("| workload | policy | req | mean lat s | median lat s | mean TTFT s | median TTFT s | preemptions |"
          " lat ×FCFS | TTFT ×FCFS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    scen = [(f"poisson {r:g}/s", dataclasses.replace(base, rate_per_s=r, duration_s=args.duration)) for r in args.rates]
    scen.append(("burst", burst))
    if args.only_c:
        scen = []
    for name, wl in scen:
        ref = run(wl, "vllm-stream", {}, args.max_batch, cat)
        rows = [("fcfs (vllm-stream)", ref)]
        for pred in args.predictors:  # "noisy:0.5" = noisy oracle with p = 0.5
            kind, _, p = pred.partition(":")
            params = {"predictor": kind, **({"noise_p": float(p)} if p else {})}
            rows.append((f"trail c=0.8 {pred}", run(wl, "trail", params, args.max_batch, cat)))
        for label, m in rows:
            out["runs"].append({"workload": name, "policy": label, **m})
            sl = ref["latency"]["mean"] / m["latency"]["mean"] if m["latency"]["mean"] else None
            st = ref["ttft"]["mean"] / m["ttft"]["mean"] if m["ttft"]["mean"] else None
            print(f"| {name} | {label} | {m['requests']} | {fmt(m['latency']['mean'])} | {fmt(m['latency']['median'])} | "
                  f"{fmt(m['ttft']['mean'], 3)} | {fmt(m['ttft']['median'], 3)} | {m['policy_preemptions']} | "
                  f"{fmt(sl)} | {fmt(st)} |", flush=True)
    wl = dataclasses.replace(base, rate_per_s=args.c_rate, duration_s=args.duration)
    print(f"\n## Effect of c (poisson {args.c_rate:g}/s, learned predictor)\n")
    print("| c | mean lat s | mean TTFT s | preemptions | preempted KV: generated tokens held (time mean) | (peak) |")
    print("|---|---|---|---|---|---|")
    for c in args.cs:
        m = run(wl, "trail", {"predictor": "learned", "c": c}, args.max_batch, cat)
        out["runs"].append({"workload": f"c-sweep {args.c_rate:g}/s", "policy": f"trail c={c:g}", **m})
        print(f"| {c:g} | {fmt(m['latency']['mean'])} | {fmt(m['ttft']['mean'], 3)} | {m['policy_preemptions']} | "
              f"{fmt(m['preempted_kv_tokens_mean'], 0)} | {m['preempted_kv_tokens_peak']} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
