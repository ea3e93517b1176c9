"""LAMPS under memory pressure, in the simulator: tool robots (INFERCEPT API mix) on a small-KV
profile.  Prints mean / P99 completion latency, time to first admission (TTFA, the scheduler part
of TTFT: the first token follows one engine iteration later) and first-action response time, the
handling choices made, engine preemptions, and time utility.

    python benchmarks/bench_lamps.py                    # single- and multi-API sets, all policies
    python benchmarks/bench_lamps.py --sets multi --duration 60 --json out/lamps.json

Policies: lamps (memory-area ranking + waste-based handling), infercept (FCFS + waste-based
handling), fcfs-preserve ("preserve everything", within the pinned-memory safety valve),
fcfs-discard (vLLM without prefix caching: recompute after every call), fcfs (vLLM with prefix
caching: freed, reused unless evicted), and timelyllm / timelyllm-lamps for time utility.
All use the same fixed batch cap (256, vLLM's max_num_seqs) so only ordering and KV handling differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from timelyllm_ros.core.planner import PlannerConfig  # noqa: E402
from timelyllm_ros.workloads.format import load_workload  # noqa: E402
from timelyllm_ros.sim.lamps_workload import load_toolbot  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402

PROFILE = ROOT / "profiles" / "lamps_small_kv.yaml"
POLICIES = ["lamps", "infercept", "fcfs-preserve", "fcfs-discard", "fcfs", "timelyllm", "timelyllm-lamps"]
WASTE_POLICIES = {"lamps", "infercept", "timelyllm-lamps"}
SETS = {"single": ROOT / "workloads" / "lamps_single.yaml", "multi": ROOT / "workloads" / "lamps_multi.yaml"}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def change(x: float, ref: float) -> str:
    """'27.5 % lower' / '3.1x higher' of x relative to ref."""
    if ref <= 0:
        return "n/a"
    if x <= ref:
        return f"{100 * (1 - x / ref):.1f} % lower"
    return f"{100 * (x / ref - 1):.1f} % higher" if x < 2 * ref else f"{x / ref:.1f}x higher"


def run(set_name: str, policy: str, duration: float | None, rate: float | None, seed: int | None,
        starvation: int) -> dict:
    robot, catalog = load_toolbot()
    wl = load_workload(SETS[set_name])
    if duration is not None:
        wl = dataclasses.replace(wl, duration_s=duration)
    if rate is not None:
        wl = dataclasses.replace(wl, rate_per_s=rate)
    params: dict = {}
    if policy in WASTE_POLICIES:
        params["profile"] = str(PROFILE)
    if policy == "lamps":
        params["starvation_threshold"] = starvation
    t0 = time.perf_counter()
    r = run_simulation(wl, policy, max_batch=256, seed=seed, robots={"toolbot": robot}, catalog=catalog,
                       profile_path=PROFILE, policy_params=params, config=PlannerConfig(max_tokens=4096))
    gens = r.generations
    states: dict[str, int] = {}
    modes: dict[str, int] = {}
    lat, ttfa, resp = [], [], []
    starved = 0
    for g in gens:
        states[g.state.value] = states.get(g.state.value, 0) + 1
        for k, v in g.policy.lamps.kv_modes.items():
            modes[k] = modes.get(k, 0) + v
        starved += g.policy.lamps.starving
        if g.finished_at is not None and g.state.value == "finished":
            lat.append(g.finished_at - g.request.arrival)
        if g.segments:
            ttfa.append(g.segments[0].gen_start - g.request.arrival)
        if g.segments and g.segments[0].exec_start is not None:
            resp.append(g.segments[0].exec_start - g.request.arrival)
    ov = r.metrics["overall"]
    return {
        "set": set_name, "policy": policy, "requests": len(gens), "states": states,
        "latency_mean": sum(lat) / len(lat), "latency_p99": pct(lat, 99),
        "ttfa_mean": sum(ttfa) / len(ttfa), "ttfa_p99": pct(ttfa, 99),
        "response_mean": sum(resp) / len(resp), "response_p99": pct(resp, 99),
        "utility_pct": ov["utility_pct_of_max"], "handling": modes, "starved": starved,
        "preemptions": r.engine["preemptions"], "prefill_tokens": r.engine["prefill_tokens"],
        "virtual_end_s": r.virtual_end_s, "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="*", default=list(SETS), choices=list(SETS))
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--duration", type=float, default=None, help="arrival window in s (default: the file's)")
    ap.add_argument("--rate", type=float, default=None, help="requests/s (default: the file's)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--starvation", type=int, default=100, help="LAMPS starvation threshold (iterations)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--lrtrace", nargs="*", default=[], metavar="WID",
                    help="also report time utility of timelyllm vs timelyllm-lamps on these LRTrace "
                         "workloads (small-KV profile, the runner's default batching)")
    ap.add_argument("--lrtrace-policies", nargs="+", default=["timelyllm", "timelyllm-lamps", "fcfs", "lamps"])
    a = ap.parse_args(argv)
    rows = []
    for wid in a.lrtrace:
        print(f"time utility on LRTrace {wid} (simulator, lamps_small_kv profile)")
        print(f"{'policy':16} {'util % max':>10} {'urgent %':>9} {'resp mean':>9} {'resp p99':>8} {'compl mean':>10} handling")
        for p in a.lrtrace_policies:
            params = {"profile": str(PROFILE)} if p in WASTE_POLICIES else {}
            r = run_simulation(wid, p, profile_path=PROFILE, policy_params=params)
            ov, cat = r.metrics["overall"], r.metrics["by_category"]
            modes: dict[str, int] = {}
            for g in r.generations:
                for k, v in g.policy.lamps.kv_modes.items():
                    modes[k] = modes.get(k, 0) + v
            urgent = cat.get("urgent", {}).get("utility_pct_of_max")
            print(f"{p:16} {ov['utility_pct_of_max']:10.1f} {urgent if urgent is not None else float('nan'):9.1f} "
                  f"{ov['response_s']['mean']:9.3f} {ov['response_s']['p99']:8.3f} "
                  f"{ov['completion_s']['mean']:10.2f} {modes} states {ov['states']}", flush=True)
            rows.append({"set": wid, "policy": p, "utility_pct": ov["utility_pct_of_max"], "urgent_pct": urgent,
                         "response_mean": ov["response_s"]["mean"], "handling": modes})
    hdr = (f"{'set':6} {'policy':16} {'n':>4} {'lat mean':>9} {'lat p99':>8} {'ttfa mean':>9} {'ttfa p99':>8} "
           f"{'resp mean':>9} {'util %':>7} {'preempt':>7} {'starved':>7}  handling")
    print("LAMPS benchmark (simulator, profile lamps_small_kv: 1,024 KV blocks)")
    print(hdr)
    for s in a.sets:
        for p in a.policies:
            row = run(s, p, a.duration, a.rate, a.seed, a.starvation)
            rows.append(row)
            print(f"{s:6} {p:16} {row['requests']:4d} {row['latency_mean']:9.2f} {row['latency_p99']:8.2f} "
                  f"{row['ttfa_mean']:9.2f} {row['ttfa_p99']:8.2f} {row['response_mean']:9.2f} "
                  f"{row['utility_pct']:7.1f} {row['preemptions']:7d} {row['starved']:7d}  "
                  f"{row['handling']}  [{row['wall_s']:.0f}s]", flush=True)
            assert row["states"].get("finished", 0) + row["states"].get("failed", 0) \
                + row["states"].get("cancelled", 0) == row["requests"], "a request did not end"
        by = {r["policy"]: r for r in rows if r["set"] == s}
        if "lamps" in by:
            for ref in ("infercept", "fcfs-preserve", "fcfs-discard", "fcfs"):
                if ref in by:
                    lr, rr = by["lamps"], by[ref]
                    print(f"  lamps vs {ref:13}: latency mean {change(lr['latency_mean'], rr['latency_mean'])}, "
                          f"p99 {change(lr['latency_p99'], rr['latency_p99'])}; "
                          f"TTFA mean {change(lr['ttfa_mean'], rr['ttfa_mean'])}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
