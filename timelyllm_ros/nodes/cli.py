"""`timelyllm ros planner|executor` (the ROS nodes, like `ros2 run timelyllm planner_node`) and
`timelyllm request` (an agent: publish a PlanRequest, print its status until a terminal state).

    timelyllm ros planner --ros-args -p engine:=vllm
    timelyllm ros executor --ros-args -r __ns:=/drone1 -p robot_type:=tello
    timelyllm request --robot drone1 --robot-type tello --task 'find the cat' --wait
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
import uuid
from typing import Any

EXIT_NOT_FINISHED = 1  # the request ended rejected / failed / cancelled
EXIT_TIMEOUT = 124  # no planner, or no terminal state within --timeout
_ROBOT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _print(line: str) -> None:
    """A status line; a reader that went away (`| head -3`) ends the printing, not the request."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail either


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ros", help="run a ROS 2 node: the planner or a robot's executor",
                       description="Run a ROS 2 managed (lifecycle) node over rclpy (Fast DDS). Everything "
                                   "after the node name goes to ROS, as with `ros2 run`: --ros-args -r "
                                   "__ns:=/drone1 -p name:=value --params-file FILE; anything else is an "
                                   "error. `timelyllm ros planner --help` lists the node's parameters.")
    p.add_argument("node", choices=("planner", "executor"))
    p.add_argument("ros_args", nargs=argparse.REMAINDER, metavar="--ros-args ...")
    p.set_defaults(func=run_node)

    r = sub.add_parser("request", help="send a plan request to the planner node and follow its status",
                       description="Send a PlanRequest as a goal of the planner's <planner-ns>/plan_task "
                                   "action and print its RequestStatus messages (with --wait: until a "
                                   "terminal state, then the plan segment by segment). The goal is sent "
                                   "again with the same id if the planner dies meanwhile.")
    r.add_argument("--robot", required=True, help="robot id = its executor's namespace, e.g. drone1")
    r.add_argument("--robot-type", default="tello", help="robots/<type>.yaml key (default tello)")
    r.add_argument("--task", required=True, help="the task in natural language")
    r.add_argument("--scene", default="", help="scene description / visible objects")
    r.add_argument("--plan", default="", help="the plan the simulated engine generates (engine:=simulated)")
    r.add_argument("--request-id", default="", help="default: <robot>-<random>")
    r.add_argument("--category", choices=("normal", "urgent", "chat"), default="normal",
                   help="picks the TUF preset (normal: ERT 1 s; urgent: ERT 0.2 s)")
    r.add_argument("--ert", type=float, help="TUF expected response time, s (overrides the preset)")
    r.add_argument("--alpha", type=float, help="TUF decay per second, <= 0 (overrides the preset)")
    r.add_argument("--beta", type=float, help="TUF maximum utility, > 0 (overrides the preset)")
    r.add_argument("--planner-ns", default="/",
                   help="the planner node's namespace (default /, where a bare `timelyllm ros planner` "
                        "serves; the launch file's planner: /timelyllm)")
    r.add_argument("--wait", action="store_true", help="print every state until a terminal one")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the end (default 300)")
    r.add_argument("--discovery-timeout", type=float, default=15.0,
                   help="seconds to wait for the planner node to be discovered (default 15)")
    r.set_defaults(func=run_request)

    q = sub.add_parser("request-state", help="ask the planner node for a request's state and plan (late joiners)",
                       description="Call <planner-ns>/get_request_state: print the request's latest status "
                                   "and the segments it dispatched, also after it ended.")
    q.add_argument("request_id")
    q.add_argument("--planner-ns", default="/", help="the planner node's namespace (default /)")
    q.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the planner (default 15)")
    q.set_defaults(func=run_request_state)


def run_node(args: argparse.Namespace) -> int:
    from .wiring import main_executor, main_planner

    main = main_planner if args.node == "planner" else main_executor
    return main([f"timelyllm ros {args.node}", *args.ros_args])


def run_request_state(args: argparse.Namespace) -> int:
    from timelyllm_ros.cli import CliError
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport, RclpyUnavailable

    from .agent import request_state, status_line

    try:
        t = RclpyTransport(f"request_state_{uuid.uuid4().hex[:8]}", args=["timelyllm-request-state"])
    except RclpyUnavailable as e:
        raise CliError(str(e)) from None
    try:
        t0 = time.monotonic()
        ans = request_state(t, args.planner_ns, args.request_id, args.timeout)
        if ans is None:
            print(f"timelyllm request-state: error: no planner answered on {args.planner_ns.rstrip('/')}"
                  f"/get_request_state within {args.timeout:g} s", file=sys.stderr)
            return EXIT_TIMEOUT
        if not ans["found"]:
            print(f"timelyllm request-state: {args.request_id}: not known to the planner (never sent, or "
                  f"older than the states it keeps)", file=sys.stderr)
            return EXIT_NOT_FINISHED
        _print(status_line(ans["status"], t0))
        for i, seg in enumerate(ans["segments"]):
            _print(f"  segment {i}: {seg}")
        return EXIT_NOT_FINISHED if ans["status"]["state"] in ("rejected", "failed", "cancelled") else 0
    finally:
        t.close()


def run_request(args: argparse.Namespace) -> int:
    from timelyllm_ros.cli import CliError
    from timelyllm_ros.core.tuf import NORMAL, TUF, URGENT
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport, RclpyUnavailable

    from .agent import RequestClient, plan_request_fields, status_line
    from .plan_task import request_plan

    preset = URGENT if args.category == "urgent" else NORMAL
    if not _ROBOT_NAME.match(args.robot):  # it names the executor's namespace (and the default id)
        raise CliError(f"--robot {args.robot!r}: must be a ROS name (letters, digits, _; not starting with "
                       f"a digit), the robot's executor namespace")
    rid = args.request_id or f"{args.robot}-{uuid.uuid4().hex[:8]}"
    try:
        tuf = TUF(ert=preset.ert if args.ert is None else args.ert,
                  alpha=preset.alpha if args.alpha is None else args.alpha,
                  beta=preset.beta if args.beta is None else args.beta)
        fields = plan_request_fields(request_id=rid, robot_id=args.robot, robot_type=args.robot_type,
                                     task=args.task, scene=args.scene, plan=args.plan,
                                     category=args.category, tuf=tuf)
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        t = RclpyTransport(f"request_{uuid.uuid4().hex[:8]}", args=["timelyllm-request"])
    except RclpyUnavailable as e:
        raise CliError(str(e)) from None
    client = None
    try:
        client = RequestClient(t, args.planner_ns)  # its cancel topic: Ctrl-C
        t0 = time.monotonic()
        seen: list[tuple] = []
        one_at_a_time = threading.RLock()  # feedback and status arrive on the transport's threads

        def show(m: dict) -> None:  # feedback, then the result's status: each state once
            key = (m["state"], m["segments_dispatched"], m["segments_done"], m["reason"])
            with one_at_a_time:  # (print writes the line and its newline apart: two threads glued lines)
                if key not in seen:
                    seen.append(key)
                    _print(status_line(m, t0))

        # the plan_task action: acknowledged (feedback) and answered (result); resent with the
        # same id if the planner instance it went to dies (nodes/plan_task.py)
        ans = request_plan(t, args.planner_ns, fields, timeout_s=args.timeout,
                           discovery_timeout_s=args.discovery_timeout, on_status=show, first_only=not args.wait)
        if ans.status is None:
            if ans.sends == 0:
                print(f"timelyllm request: error: {ans.error} (is `timelyllm ros planner` running, same "
                      f"ROS_DOMAIN_ID?)", file=sys.stderr)
            else:
                print(f"timelyllm request: error: {rid}: {ans.error}", file=sys.stderr)
            return EXIT_TIMEOUT
        final = ans.status
        if args.wait and ans.segments:
            _print(f"plan ({len(ans.segments)} segment{'s' if len(ans.segments) != 1 else ''}):")
            for i, text in enumerate(ans.segments):
                _print(f"  {i + 1}. {text}")
        bad = final["state"] in ("rejected", "failed", "cancelled")
        return EXIT_NOT_FINISHED if bad else 0
    except KeyboardInterrupt:
        if client is not None:
            client.cancel(rid)  # an operator's Ctrl-C ends the request too
            time.sleep(0.2)  # let the cancel go out
        return 130
    finally:
        t.close()
