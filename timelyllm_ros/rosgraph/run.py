"""`timelyllm demo` as a real ROS 2 graph: every node its own process, talking over DDS.

Processes (`ProcessGroup`, one ROS_DOMAIN_ID no other graph here uses, discovery on localhost):

* the planner node (`timelyllm ros planner`, vLLM with the bundled model, or the simulated engine),
  told every robot id so it discovers their action servers before the first request;
* one executor node per robot of the workload (`timelyllm ros executor`, simulated backends), except
  one drone that runs the djitellopy backend against a Tello emulator process over UDP
  (127.0.0.2:9889; djitellopy binds UDP 8889 itself, so one such drone per machine);
* the agents node (`python -m timelyllm_ros.rosgraph.agents`), publishing the workload's
  PlanRequests at their arrival times once this process gives the start signal;
* this process: one rclpy node that monitors the topics (`GraphMonitor`: the live table and the
  results are built from what the nodes publish) and records them into a rosbag2 MCAP bag.

Every request ends in a terminal state: those still open when `timeout_s` is up are cancelled over
`cancel_requests`; whatever has no terminal status after a grace period, and any request that never
showed up on `plan_requests`, is reported failed with the reason.  Children are stopped in order
(SIGINT, then SIGTERM, then SIGKILL of their process group) on success, on error and on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from timelyllm_ros.core.metrics import summarize, timeline_records
from timelyllm_ros.core.types import Generation
from timelyllm_ros.netns import NamespaceUnavailable, port_holder, private_network
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.transport.base import QOS_DEFAULT, QOS_LATCHED, QOS_RELIABLE_DEEP

from .agents import START_TOPIC
from .bag import BagRecorder, Topic
from .monitor import GraphMonitor
from .processes import ChildExited, ProcessGroup, free_domain_id, graph_env

TELLO_EMULATOR_HOST = "127.0.0.2"
TELLO_EMULATOR_PORT = 9889
TELLO_LOCAL_PORTS = (8889, 8890)  # djitellopy's own command / state ports

RECORDED = (
    Topic("/plan_requests", interfaces.PLAN_REQUEST, QOS_RELIABLE_DEEP),
    Topic("/request_status", interfaces.REQUEST_STATUS, QOS_RELIABLE_DEEP),
    Topic("/segment_status", interfaces.SEGMENT_STATUS, QOS_RELIABLE_DEEP),
    Topic("/cancel_requests", interfaces.STRING, QOS_RELIABLE_DEEP),
    Topic("/planner_status", interfaces.PLANNER_STATUS, QOS_LATCHED),
    Topic("/planned_paths", interfaces.MARKER_ARRAY, QOS_LATCHED),
    Topic("/diagnostics", interfaces.DIAGNOSTIC_ARRAY, QOS_DEFAULT),
    Topic(START_TOPIC, interfaces.STRING, QOS_LATCHED),
)


@dataclass
class GraphOptions:
    engine: str = "vllm"  # planner engine: vllm | simulated (the request carries its plan)
    tello_drone: str = "auto"  # robot id on djitellopy + emulator; auto: the first tello; none: no such drone
    domain_id: int | None = None  # default: a free one
    ready_timeout_s: float = 600.0  # planner (vLLM start + warm-up) and executors up
    grace_s: float = 20.0  # after the serving timeout: how long cancelled requests get to report


@dataclass
class GraphResult:
    generations: list[Generation]
    metrics: dict[str, Any]
    rejected: list[tuple[str, str]]
    wall_s: float  # from the start signal until every request was terminal
    bag: Path
    bag_counts: dict[str, int]
    exit_codes: dict[str, int]
    domain_id: int
    tello_drone: str | None
    logs: Path
    notes: list[str] = field(default_factory=list)
    step_records: list[Any] = field(default_factory=list)  # the planner's serving steps (engine speed)
    stop_s: dict[str, float] = field(default_factory=dict)  # node -> seconds from SIGINT to its exit

    def timeline(self) -> list[dict[str, Any]]:
        return timeline_records(self.generations)


def _node(kind: str, *ros_args: str) -> list[str]:
    return [sys.executable, "-m", "timelyllm_ros.cli", "ros", kind, "--ros-args", *ros_args]


def _params(**kv: Any) -> list[str]:
    out = []
    for k, v in kv.items():
        v = ("true" if v else "false") if isinstance(v, bool) else v
        out += ["-p", f"{k}:={v}"]
    return out


def robots_of(arrivals: list[Any]) -> dict[str, str]:
    """robot id -> robot type, in order of first arrival."""
    out: dict[str, str] = {}
    for a in sorted(arrivals, key=lambda a: (a.time, a.request_id)):
        out.setdefault(a.robot_id, a.robot_type)
    return out


def _pick_tello(robots: dict[str, str], opts: GraphOptions, notes: list[str], stack: ExitStack) -> str | None:
    """The drone to fly with djitellopy (None: all simulated).  When another program holds the
    UDP ports it needs, the whole graph (this process's main thread and every node it starts)
    moves into a private network namespace (root or CAP_SYS_ADMIN; `stack` leaves it); where that
    is not possible the drone is simulated.  Either way a note says so."""
    if opts.tello_drone == "none":
        return None
    tello = next((r for r, t in robots.items() if t == "tello"), None) if opts.tello_drone == "auto" \
        else opts.tello_drone
    if tello is not None and robots.get(tello) != "tello":
        raise ValueError(f"--tello-drone {tello!r} is not a tello robot of the workload")
    held = [h for h in [port_holder(p) for p in TELLO_LOCAL_PORTS] +
            [port_holder(TELLO_EMULATOR_PORT, host=TELLO_EMULATOR_HOST)] if h]
    if tello is None or not held:
        return tello
    try:
        stack.enter_context(private_network())
    except NamespaceUnavailable as e:
        notes.append(f"{tello} runs the simulated backend: {'; '.join(held)} (djitellopy needs UDP 8889/8890, the "
                     f"emulator {TELLO_EMULATOR_HOST}:{TELLO_EMULATOR_PORT}) and no private network is possible: {e}")
        return None
    notes.append(f"{'; '.join(held)}: the graph ran in a private network namespace so that {tello} could fly on "
                 f"djitellopy (its topics were not visible to ROS tools outside this run)")
    return tello


def _start_nodes(group: ProcessGroup, inp: Any, opts: GraphOptions, robots: dict[str, str], tello: str | None) -> None:
    """Emulator, executors, planner, agents (the agents wait for the start signal)."""
    planner: dict[str, Any] = dict(engine=opts.engine, policy=inp.policy, executors=",".join(robots),
                                   goal_timeout_margin_s=30.0, server_wait_s=10.0, warm_up=True,
                                   step_log_path=str(inp.out / "planner_steps.jsonl"))
    if inp.max_batch:
        planner["max_batch"] = int(inp.max_batch)
    if inp.params:  # --param: the demo's policy's own (the planner's policy_params parameter)
        planner["policy_params"] = ",".join(f"{inp.policy}:{k}={v}" for k, v in inp.params.items())
    if opts.engine == "vllm":
        cfg_file = inp.out / "engine_config.yaml"
        cfg_file.write_text(yaml.safe_dump({k: v for k, v in inp.engine_config.items() if k != "model"}))
        planner.update(model=str(inp.engine_config["model"]), engine_config=str(cfg_file))
    else:
        planner.update(profile=str(inp.profile))
    if tello:
        group.start("tello_emulator", [sys.executable, "-m", "timelyllm_ros.executors.tello_emulator",
                                       "--host", TELLO_EMULATOR_HOST, "--port", str(TELLO_EMULATOR_PORT)])
    for i, (rid, rtype) in enumerate(robots.items()):
        p = dict(robot_type=rtype, seed=inp.seed * 1000 + i, backend="simulated")
        if rid == tello:
            p.update(backend="tello", tello_host=TELLO_EMULATOR_HOST, tello_port=TELLO_EMULATOR_PORT)
        group.start(f"executor_{rid}", _node("executor", "-r", f"__ns:=/{rid}", *_params(**p)))
    group.start("planner", _node("planner", *_params(**planner)))
    # the same arrivals as inp.arrivals: the workload up to the last one served here
    group.start("agents", [sys.executable, "-m", "timelyllm_ros.rosgraph.agents", "--workload",
                           str(inp.workload.source), "--duration", repr(max(a.time for a in inp.arrivals)),
                           "--subscribers", "3"])


def _wait_until_up(group: ProcessGroup, node: Any, monitor: GraphMonitor, robots: dict[str, str],
                   timeout_s: float) -> None:
    """Until the planner publishes, reports every executor's action server, the agents' publisher
    is discovered and the monitor hears every topic; ChildExited if a node dies or time runs out."""
    t = time.monotonic()
    wanted = set(robots)
    while True:
        group.check()
        if monitor.planner_status is not None and wanted <= monitor.executors_ready() and \
                node.count_publishers("/plan_requests") >= 1 and node.count_subscribers(START_TOPIC) >= 1 and \
                all(n > 0 for k, n in monitor.matched().items() if k != "plan_requests"):
            return
        if time.monotonic() - t > timeout_s:
            missing = sorted(wanted - monitor.executors_ready())
            raise ChildExited(f"the graph was not up within {timeout_s:.0f} s (planner status: "
                              f"{'yes' if monitor.planner_status else 'no'}; executors not reported ready: "
                              f"{missing[:5]}); logs in {group.log_dir}")
        time.sleep(0.2)


def _serve(group: ProcessGroup, monitor: GraphMonitor, cancel_pub: Any, inp: Any, opts: GraphOptions, t0: float,
           notes: list[str], on_progress: Callable[[Any], None] | None, progress_every_s: float) -> None:
    """Watch the topics until every request of `inp.arrivals` is terminal; the timeout cancels
    and then fails (with the reason) what is still open; nothing is left without a state."""
    expected = {a.request_id: a for a in inp.arrivals}
    arrivals = sorted(inp.arrivals, key=lambda a: a.time)
    cancelled_at: float | None = None
    last_progress = -1.0
    missing_reason = "never seen on plan_requests (the agents node did not publish it)"
    while True:
        now = time.time() - t0
        ended = ""
        try:
            group.check(["planner"])
        except ChildExited as e:
            ended = missing_reason = f"planner process died: {e}"
            notes.append(str(e))
        if cancelled_at is not None and time.time() > cancelled_at + opts.grace_s:
            ended = f"no terminal status within the {inp.timeout_s:.0f} s timeout and {opts.grace_s:.0f} s after its cancel"
            missing_reason = f"not published within the {inp.timeout_s:.0f} s timeout"
        if ended or not group.alive("agents") or now > arrivals[-1].time + 30.0:
            for rid in sorted(set(expected) - set(monitor.request_ids())):  # will not be published any more
                a = expected[rid]
                monitor.add_missing(convert.plan_request_to_fields(a.to_request(), stamp=t0 + a.time), missing_reason)
        if ended:
            for rid in monitor.request_ids():
                if not monitor.terminal(rid):
                    monitor.give_up(rid, ended)
        seen = set(monitor.request_ids())
        done = seen >= set(expected) and all(monitor.terminal(r) for r in seen)
        if on_progress and (done or now - last_progress >= progress_every_s):
            last_progress = now
            nxt = next((a.time - now for a in arrivals if a.time > now), None)
            on_progress(monitor.progress(len(expected), now=now, next_arrival_s=nxt, final=done))
        if done:
            return
        if time.time() > t0 + inp.timeout_s and cancelled_at is None:
            cancelled_at = time.time()
            for rid in seen:
                if not monitor.terminal(rid):
                    cancel_pub.publish({"data": rid})
        time.sleep(0.05)


def run_graph(inp: Any, opts: GraphOptions, *, say: Callable[[str], None],
              on_progress: Callable[[Any], None] | None = None, progress_every_s: float = 0.25) -> GraphResult:
    """Run the demo `inp` (demo.DemoInputs) as a ROS graph; see the module docstring."""
    from timelyllm_ros.engines.base import load_step_log
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    robots = robots_of(inp.arrivals)
    notes: list[str] = []
    stack = ExitStack()  # a private network namespace, if the Tello needs one
    tello = _pick_tello(robots, opts, notes, stack)
    domain = opts.domain_id if opts.domain_id is not None else free_domain_id()
    env = graph_env(domain)
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})  # our own node
    logs, bag_path, steps_file = inp.out / "logs", inp.out / "bag", inp.out / "planner_steps.jsonl"
    steps_file.unlink(missing_ok=True)
    if bag_path.exists():
        shutil.rmtree(bag_path)  # this policy's previous run (check_demo_inputs allowed --out)
    group = ProcessGroup(logs, env)
    say(f"ROS graph on ROS_DOMAIN_ID={domain} (localhost discovery): planner ({opts.engine}), "
        f"{len(robots)} executor nodes{f' ({tello} on djitellopy + Tello emulator)' if tello else ''}, agents; "
        f"node logs in {logs}/")
    transport = recorder = monitor = None
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM: clean up as Ctrl-C
    # SIGINT too, explicitly: a process started with SIGINT ignored (a shell's background job, e.g.
    # `make demo &` or CI scripts run with `&`) would otherwise never see Ctrl-C / `kill -INT`
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _start_nodes(group, inp, opts, robots, tello)
        transport = RclpyTransport("demo_monitor", args=["timelyllm-demo"])
        monitor = GraphMonitor(transport, t0=time.time())
        recorder = BagRecorder(transport.node, bag_path, RECORDED)
        start_pub = transport.publisher(START_TOPIC, interfaces.STRING, qos=QOS_LATCHED)
        cancel_pub = transport.publisher("/cancel_requests", interfaces.STRING, qos=QOS_RELIABLE_DEEP)
        t_up = time.monotonic()
        _wait_until_up(group, transport.node, monitor, robots, opts.ready_timeout_s)
        say(f"graph up in {time.monotonic() - t_up:.0f} s (planner, {len(robots)} executors, agents discovered); "
            f"serving")
        t0 = time.time() + 1.0
        monitor.t0 = t0
        start_pub.publish({"data": repr(t0)})
        _serve(group, monitor, cancel_pub, inp, opts, t0, notes, on_progress, progress_every_s)
        wall_s = time.time() - t0
        gens = monitor.generations()
        rejected = monitor.rejected()
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
        if recorder is not None:
            recorder.close()
        # vLLM's shutdown (engine core, worker process) takes seconds on a loaded CPU
        # the Tello emulator last: the djitellopy executor lands the drone when it closes
        exit_codes = group.stop(order=("agents", "planner"), last=("tello_emulator",), grace_for={"planner": 60.0})
        if monitor is not None:
            monitor.close()
        if transport is not None:
            transport.close()
        stack.close()
    steps = load_step_log(steps_file) if steps_file.is_file() else []
    if not steps:
        notes.append(f"the planner wrote no engine steps to {steps_file}: engine speed not measured")
    bad = {n: rc for n, rc in exit_codes.items() if rc != 0}
    if bad:
        notes.append(f"nodes that did not exit cleanly: {bad} (logs in {logs})")
    return GraphResult(generations=gens, metrics=summarize(gens), rejected=rejected, wall_s=wall_s, bag=bag_path,
                       bag_counts=dict(recorder.counts) if recorder else {}, exit_codes=exit_codes, domain_id=domain,
                       tello_drone=tello, logs=logs, notes=notes, step_records=steps,
                       stop_s={n: round(s, 2) for n, s in group.stop_s.items()})


__all__ = ["GraphOptions", "GraphResult", "RECORDED", "robots_of", "run_graph"]
