"""An executor SIGKILLed mid-goal (issue 26): how soon does its request fail, and is the
response time it reports still the first segment's start?

Over ROS 2 (Fast DDS, nodes as processes): a planner node (simulated engine) and a simulated
drone executor; per run, a 2-statement plan starts, the executor is SIGKILLed as its first
statement runs, and a fresh executor is started for the next run.  Prints, per run, the seconds
from the kill to the terminal status, the reason, and the response time before the kill vs the
one in the terminal status.

    python benchmarks/executor_kill.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lease", type=float, default=2.0, help="the planner's executor_lease_s")
    args = ap.parse_args()
    from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields
    from timelyllm_ros.rosgraph.processes import free_domain_id, graph_env

    env = graph_env(free_domain_id(), {**os.environ, "PYTHONPATH": str(REPO)})
    os.environ.update(ROS_DOMAIN_ID=env["ROS_DOMAIN_ID"], ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    logs = Path(tempfile.mkdtemp(prefix="executor_kill_"))

    def start(kind: str, name: str, *ros: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "ros", kind, "--ros-args", *ros],
                                env=env, cwd=REPO, stdout=open(logs / f"{name}.log", "wb"), stderr=subprocess.STDOUT)

    def wait_log(name: str, needle: str, timeout_s: float = 60.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if needle in (logs / f"{name}.log").read_text(errors="replace"):
                return True
            time.sleep(0.02)
        return False

    planner = start("planner", "planner", "-r", "__ns:=/ek", "-p", "server_wait_s:=6.0",
                    "-p", f"executor_lease_s:={args.lease}")
    t = RclpyTransport("executor_kill")
    rows = []
    try:
        assert wait_log("planner", " serving "), "planner did not start"
        client = RequestClient(t, "/ek")
        assert client.wait_for_planner(60)
        for run in range(args.runs):
            name = f"drone_ek{run}"
            ex = start("executor", name, "-r", f"__ns:=/{name}", "-p", "time_scale:=1")
            try:
                assert wait_log(name, " serving "), f"{name} did not start"
                rid = f"ek-{run}"
                client.submit(plan_request_fields(request_id=rid, robot_id=name, robot_type="tello", task="t",
                                                  plan="mf(200);mf(200);"))
                assert wait_log(name, f"executing {rid}/0"), "goal did not start"
                end = time.monotonic() + 10
                while time.monotonic() < end and not any(m["response_time_s"] >= 0 for m in client.statuses(rid)):
                    time.sleep(0.01)
                before = max(m["response_time_s"] for m in client.statuses(rid))
                ex.kill()
                t_kill = time.monotonic()
                st = client.wait_terminal(rid, 60)
                rows.append((run + 1, time.monotonic() - t_kill, before, st["response_time_s"] if st else None,
                             st["reason"] if st else "no terminal status"))
            finally:
                ex.kill()
                ex.wait()
    finally:
        t.close()
        planner.kill()
        planner.wait()
    print(f"executor SIGKILLed mid-goal, over ROS 2 (Fast DDS, nodes as processes; simulated engine and drone, "
          f"planner executor_lease_s {args.lease:g} s):")
    print(f"{'run':>3} {'kill -> failed (s)':>18} {'response before (s)':>19} {'response reported (s)':>21}  reason")
    for r in rows:
        print(f"{r[0]:>3} {r[1]:>18.2f} {r[2]:>19.2f} {(r[3] if r[3] is not None else float('nan')):>21.2f}  {r[4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
