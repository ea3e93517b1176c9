"""The workload's robot agents as one ROS node: each PlanRequest published at its arrival time.

    python -m timelyllm_ros.rosgraph.agents --workload mixed_small [--duration S] [--robot-type tello]

Waits for the start signal on `/demo_start` (std_msgs/String holding the wall-clock epoch t0,
latched; `timelyllm demo` sends it once the planner and every executor are up), then publishes
request k at t0 + arrival_k on `<planner_ns>/plan_requests`, stamped with the time it was
actually published (that stamp is the request's arrival for the metrics).  It keeps running
(and its publisher alive, so reliable delivery completes) until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any

from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.signals import StopFlag, stop_on_signals
from timelyllm_ros.transport.base import QOS_LATCHED, QOS_RELIABLE_DEEP, join_name

log = logging.getLogger("timelyllm.agents")
START_TOPIC = "/demo_start"


def publish_schedule(pub: Any, arrivals: list[Any], t0: float, stop: StopFlag) -> int:
    """Publish each arrival's request at t0 + its time (wall clock); returns how many went out."""
    n = 0
    for a in sorted(arrivals, key=lambda a: (a.time, a.request_id)):
        while not stop.is_set() and time.time() < t0 + a.time:  # short waits: signals get handled
            stop.wait(min(0.2, max(0.0, t0 + a.time - time.time())))
        if stop.is_set():
            break
        now = time.time()
        pub.publish(convert.plan_request_to_fields(a.to_request(), stamp=now))
        n += 1
        late = now - (t0 + a.time)
        log.info("published %s (%s, %s) at t=%.3f s%s", a.request_id, a.robot_id, a.task_id, now - t0,
                 f", {late * 1e3:.0f} ms late" if late > 0.05 else "")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, help="bundled workload name or YAML path")
    ap.add_argument("--duration", type=float, default=None, help="only arrivals in the first N seconds")
    ap.add_argument("--robot-type", action="append", default=[], help="only these robot types' agents")
    ap.add_argument("--planner-ns", default="/", help="the planner's namespace (default /)")
    ap.add_argument("--subscribers", type=int, default=1,
                    help="wait for this many plan_requests subscribers before the start (default 1)")
    ap.add_argument("--start-timeout", type=float, default=900.0, help="give up without a start signal")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from timelyllm_ros.inputs import InputError, catalog_for, robots_from_dirs, workload_arrivals
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    try:
        robots = robots_from_dirs([])
        _, arrivals = workload_arrivals(args.workload, robots, catalog_for(robots), duration_s=args.duration)
    except InputError as e:
        print(f"agents: {e}", file=sys.stderr)
        return 2
    if args.robot_type:
        arrivals = [a for a in arrivals if a.robot_type in set(args.robot_type)]
    stop = stop_on_signals()  # (its handler takes no lock: signals.py)
    t = RclpyTransport("agents", args=["timelyllm-agents"])
    try:
        pub = t.publisher(join_name(args.planner_ns, "plan_requests"), interfaces.PLAN_REQUEST, qos=QOS_RELIABLE_DEEP)
        start: dict[str, float] = {}
        got = threading.Event()

        def on_start(m: dict) -> None:
            try:
                start["t0"] = float(m["data"])
                got.set()
            except (KeyError, ValueError):
                log.error("bad start signal %r", m)

        t.subscribe(START_TOPIC, interfaces.STRING, on_start, qos=QOS_LATCHED)
        log.info("%d requests to publish; waiting for the start signal on %s", len(arrivals), START_TOPIC)
        end = time.monotonic() + args.start_timeout
        while not got.wait(0.1):
            if stop.is_set() or time.monotonic() > end:
                log.error("no start signal")
                return 1
        if pub.matched_count() < args.subscribers:
            log.warning("only %d of %d plan_requests subscribers matched at the start", pub.matched_count(),
                        args.subscribers)
        n = publish_schedule(pub, arrivals, start["t0"], stop)
        log.info("published %d of %d requests", n, len(arrivals))
        stop.wait()
    finally:
        t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
