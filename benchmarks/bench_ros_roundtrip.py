"""ExecuteSegment round trip, planner -> executor -> planner: over DDS on loopback vs in-process.

    .venv/bin/python benchmarks/bench_ros_roundtrip.py [--goals 300] [--inflight 1]

The planner side is the planner node's own `ActionDispatcher` (the code that sends every segment
goal and posts its SegmentResult back); the executor side is `timelyllm ros executor` (a simulated
tello with time_scale 0: skills take no time), as a separate process over Fast DDS (rclpy from the
ROS 2 Jazzy wheels), and the same ExecutorNode code over the in-process transport.  Each goal is
`tc(10);`; the figure is dispatch() -> SegmentResult posted, wall clock, the same goals for both.
The executor reports its own execution time (exec_duration_s); it is printed too, so what remains
is transport + action protocol (goal request, accept, result request, result).

Numbers depend on the machine's load (2 shared cores here): the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from timelyllm_ros.core.clock import WallClock  # noqa: E402
from timelyllm_ros.core.flight import EnvelopeTracker  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SegmentResult, SkillCall  # noqa: E402
from timelyllm_ros.nodes.dispatcher import ActionDispatcher, DispatcherConfig  # noqa: E402

ROBOT = "bench_drone"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def goals_per_plan(call: SkillCall, most: int = 1_000_000) -> int:
    """How many `call`s one plan (request) may command within the tello's flight envelope, which
    the executor enforces per request (at most `most`)."""
    robot = load_robots()["tello"]
    plan, k = EnvelopeTracker(robot), 0
    while k < most:
        plan.begin_segment()  # each goal is one segment
        if plan.charge(call, robot.skills[call.name]) is not None:
            break
        k += 1
    if k == 0:
        raise RuntimeError(f"the tello's envelope does not allow even one {call}")
    return k


def run_goals(transport: Any, n: int, inflight: int, warmup: int) -> tuple[list[float], list[float], float]:
    """Send n (+ warmup) goals, at most `inflight` outstanding; (round trips s, executor s, cpu s/goal)."""
    clock = WallClock()
    done: dict[tuple[str, int], SegmentResult] = {}
    t_sent: dict[tuple[str, int], float] = {}
    t_done: dict[tuple[str, int], float] = {}
    cv = threading.Condition()

    def post(res: SegmentResult) -> None:
        now = time.perf_counter()
        with cv:
            key = (res.request_id, res.segment_index)
            done[key], t_done[key] = res, now
            cv.notify_all()

    disp = ActionDispatcher(transport, clock, post, DispatcherConfig(server_wait_s=30.0, timeout_margin_s=30.0))
    call = SkillCall("turn_cw", "tc", (10,))
    per_plan = goals_per_plan(call)
    total = n + warmup
    keys: list[tuple[str, int]] = []
    rid, seg = "", per_plan
    cpu0 = None
    try:
        for i in range(total):
            if i == warmup:
                cpu0 = time.process_time()
            with cv:
                while i - len(done) >= inflight:
                    cv.wait()
            if seg == per_plan:  # the plan's envelope is used up: the next goals are a new request
                rid, seg = f"rt-{uuid.uuid4().hex[:6]}", 0
            key = (rid, seg)
            keys.append(key)
            t_sent[key] = time.perf_counter()
            disp.dispatch(SegmentGoal(rid, ROBOT, "tello", seg, "tc(10);", (call,), 0.1, False))
            seg += 1
        with cv:
            while len(done) < total:
                if not cv.wait(60):
                    raise RuntimeError(f"only {len(done)} of {total} results after 60 s")
        cpu = (time.process_time() - (cpu0 or 0.0)) / n
    finally:
        disp.close()
    bad = [r for r in done.values() if r.code != ResultCode.OK]
    if bad:
        raise RuntimeError(f"{len(bad)} goals failed, e.g. {bad[0].error}")
    keys = keys[warmup:]
    rt = [t_done[k] - t_sent[k] for k in keys]
    ex = [done[k].exec_end - done[k].exec_start for k in keys]
    return rt, ex, cpu


def report(name: str, rt: list[float], ex: list[float], cpu: float) -> None:
    ms = [x * 1e3 for x in rt]
    print(f"{name:<30} goals {len(rt):4d}  p50 {_pct(ms, 50):7.2f} ms  p99 {_pct(ms, 99):7.2f} ms  "
          f"mean {statistics.fmean(ms):7.2f} ms  executor p50 {_pct([x * 1e3 for x in ex], 50):5.2f} ms  "
          f"planner-side CPU {cpu * 1e3:5.2f} ms/goal")


def over_dds(n: int, inflight: int, warmup: int) -> tuple[list[float], list[float], float]:
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_ros_executor_{os.getpid()}.log", "w+b")
    proc = subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "ros", "executor", "--ros-args",
                             "-r", f"__ns:=/{ROBOT}", "-p", "time_scale:=0.0"], stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)
    t = RclpyTransport(f"bench_planner_{os.getpid()}")
    try:
        return run_goals(t, n, inflight, warmup)
    finally:
        t.close()
        proc.terminate()
        proc.wait(20)
        log.close()


def in_process(n: int, inflight: int, warmup: int) -> tuple[list[float], list[float], float]:
    from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor
    from timelyllm_ros.executors.simulated import SimulatedBackend
    from timelyllm_ros.nodes.executor_node import ExecutorNode
    from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport

    robot = load_robots()["tello"]
    bus = InProcessBus()
    ex_t, pl_t = InProcessTransport(bus, ROBOT), InProcessTransport(bus)
    node = ExecutorNode(ex_t, SegmentExecutor(robot, SimulatedBackend(robot, time_scale=0.0), ExecutorConfig()),
                        robot_id=ROBOT)
    try:
        return run_goals(pl_t, n, inflight, warmup)
    finally:
        node.close()
        ex_t.close()
        pl_t.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goals", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--inflight", type=int, default=1, help="goals outstanding at once (default 1)")
    args = ap.parse_args(argv)
    if args.goals < 1 or args.inflight < 1 or args.warmup < 0:
        ap.error("--goals and --inflight must be >= 1, --warmup >= 0")
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    call = SkillCall("turn_cw", "tc", (10,))
    print(f"ExecuteSegment round trip (dispatch -> SegmentResult), {args.goals} goals after {args.warmup} warm-up, "
          f"{args.inflight} in flight, {call}; a request carries at most "
          f"{goals_per_plan(call)} (the tello's plan envelope); ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')}; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}")
    report("in-process transport", *in_process(args.goals, args.inflight, args.warmup))
    report("rclpy / Fast DDS, 2 processes", *over_dds(args.goals, args.inflight, args.warmup))
    print(f"loadavg after {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
