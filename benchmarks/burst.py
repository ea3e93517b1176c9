"""Burst: 1,000 requests within one second against the simulator engine.

Admission control must keep queues and memory bounded by configuration: over-limit requests are
rejected at once with a reason, accepted ones all end terminal.  Prints peak RSS, the largest
queue seen, rejections by reason and the terminal states.

    python benchmarks/burst.py --requests 1000 --max-queued 200 --max-live 400

`--ros`: the same over a ROS 2 graph (issue 26): the planner node as its own process (simulated
engine), `--senders` processes publishing `--requests` PlanRequests from `--agents` agents (robot
ids) on `plan_requests` within `--duration` s, each following its requests' RequestStatus.
Prints answered (a status: queued or rejected with a reason) / never answered, the terminal
states, rejection reasons and the planner process's peak RSS.

    python benchmarks/burst.py --ros --requests 3000 --agents 100 --duration 1.5
"""

from __future__ import annotations

import argparse
import resource
import sys
from collections import Counter
from pathlib import Path

from timelyllm_ros.core.planner import PlannerConfig  # noqa: E402
from timelyllm_ros.core.types import GenState  # noqa: E402
from timelyllm_ros.workloads.format import parse_workload  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402


def ros_sender(args: argparse.Namespace) -> int:
    """One sender process: its share of the agents' requests, paced to end by `--duration`."""
    import json
    import time

    from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    t = RclpyTransport(f"burst_sender_{args.sender}")
    try:
        client = RequestClient(t, args.ns)
        if not client.wait_for_planner(60):
            print(json.dumps({"error": "planner not discovered"}), flush=True)
            return 1
        mine = [i for i in range(args.requests) if i % args.senders == args.sender]
        while time.time() < args.start_at:
            time.sleep(0.001)
        t0 = time.monotonic()
        for k, i in enumerate(mine):
            due = t0 + args.duration * k / max(1, len(mine))
            while time.monotonic() < due:
                time.sleep(0.0005)
            client.submit(plan_request_fields(request_id=f"burst-{i}", robot_id=f"agent{i % args.agents}",
                                              robot_type="chat", task="greet", plan="Hello there."))
        sent_s = time.monotonic() - t0
        ids = [f"burst-{i}" for i in mine]
        end = time.monotonic() + args.wait
        while time.monotonic() < end and not all(any(m["terminal"] for m in client.statuses(r)) for r in ids):
            time.sleep(0.2)
        first = {r: (client.statuses(r) or [None])[0] for r in ids}
        last = {r: (client.statuses(r) or [None])[-1] for r in ids}
        print(json.dumps({
            "sent": len(ids), "sent_s": sent_s,
            "answered": sum(1 for m in first.values() if m is not None),
            "first": dict(Counter(m["state"] for m in first.values() if m is not None)),
            "terminal": dict(Counter(m["state"] for m in last.values() if m is not None and m["terminal"])),
            "reasons": dict(Counter(m["reason"].split("(")[0].split("'")[0].strip() for m in first.values()
                                    if m is not None and m["state"] == "rejected")),
        }), flush=True)
    finally:
        t.close()
    return 0


def ros_main(args: argparse.Namespace) -> int:
    import json
    import os
    import subprocess
    import time

    from timelyllm_ros.rosgraph.processes import free_domain_id, graph_env

    repo = Path(__file__).resolve().parents[1]
    env = graph_env(free_domain_id(), {**os.environ, "PYTHONPATH": str(repo)})
    planner = subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "ros", "planner", "--ros-args", "-r",
                                f"__ns:={args.ns}", "-p", "server_wait_s:=0.5"], env=env, cwd=repo,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while " serving " not in line:
            line = planner.stdout.readline()
            if not line:
                raise SystemExit("the planner did not start")
        start_at = time.time() + 8.0  # every sender has discovered the planner by then
        senders = [subprocess.Popen([sys.executable, __file__, "--ros-sender", "--sender", str(k), "--senders",
                                     str(args.senders), "--requests", str(args.requests), "--agents", str(args.agents),
                                     "--duration", str(args.duration), "--start-at", str(start_at), "--ns", args.ns,
                                     "--wait", str(args.wait)], env=env, cwd=repo, stdout=subprocess.PIPE, text=True)
                   for k in range(args.senders)]
        outs = [json.loads(p.communicate(timeout=args.wait + 120)[0].strip().splitlines()[-1]) for p in senders]
        with open(f"/proc/{planner.pid}/status") as f:
            mem = {k: v.strip() for k, v in (ln.split(":", 1) for ln in f if ln.startswith(("VmHWM", "VmRSS")))}
    finally:
        planner.kill()
        planner.wait()
    if any("error" in o for o in outs):
        print(outs)
        return 1
    total = Counter()
    first, terminal, reasons = Counter(), Counter(), Counter()
    for o in outs:
        total.update({"sent": o["sent"], "answered": o["answered"]})
        first.update(o["first"])
        terminal.update(o["terminal"])
        reasons.update(o["reasons"])
    sent_s = max(o["sent_s"] for o in outs)
    print(f"burst over ROS 2 (Fast DDS, nodes as processes; planner: simulated engine, default admission limits): "
          f"{total['sent']} PlanRequests from {args.agents} agents in {sent_s:.2f} s by {args.senders} sender "
          f"processes")
    print(f"answered {total['answered']} of {total['sent']} (never answered {total['sent'] - total['answered']}); "
          f"first status: {dict(first)}")
    print(f"rejection reasons: {dict(reasons)}")
    print(f"terminal states seen by the senders within {args.wait:g} s: {dict(terminal)}")
    print(f"planner process: peak RSS {mem.get('VmHWM')}, RSS at the end {mem.get('VmRSS')}")
    return 0 if total["answered"] == total["sent"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ros", action="store_true", help="over a ROS 2 graph (planner node as a process)")
    ap.add_argument("--senders", type=int, default=4, help="--ros: sender processes")
    ap.add_argument("--duration", type=float, default=1.5, help="--ros: seconds over which the burst is sent")
    ap.add_argument("--wait", type=float, default=60.0, help="--ros: seconds to wait for terminal states")
    ap.add_argument("--ns", default="/burst", help=argparse.SUPPRESS)
    ap.add_argument("--ros-sender", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sender", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--max-queued", type=int, default=200)
    ap.add_argument("--max-live", type=int, default=400)
    ap.add_argument("--max-per-agent", type=int, default=8)
    ap.add_argument("--policy", default="timelyllm")
    args = ap.parse_args()
    if args.ros_sender:
        return ros_sender(args)
    if args.ros:
        return ros_main(args)
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
