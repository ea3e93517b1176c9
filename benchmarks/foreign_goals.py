"""A foreign node flies a Tello straight through its executor (issue 26): no planner, over DDS.

Starts, as separate processes, a Tello emulator (UDP, logging every command it receives) and a
`timelyllm ros executor` node with the djitellopy backend, then -- as its own rclpy node, the
"foreign node" -- sends `--goals` ExecuteSegment goals of `mf(500);` to `/<robot>/execute_segment`,
each under a fresh request id, and waits for every result.  The executor must fly at most its
flight envelope since takeoff (robots/tello.yaml: 5,000 cm, i.e. 10 such goals) and refuse the
rest with a reason, before any command.  Goals go one after the other (each after the previous
result), as one client flying a drone would send them.  Also sends one multi-call goal `mf(500);mf(500);mf(500);`
first (checked as a whole: refused, nothing flown) and one goal whose text is `tc(90);` but whose
calls are `[mf(500)]` (refused).  Prints the counts and one JSON line (`RESULT {...}`), exit 1 if
the executor flew more than the envelope.

djitellopy binds UDP 8889/8890 host-wide: the run uses a private network namespace
(`timelyllm_ros/netns.py`) when the process may make one, else the host's ports (must be free).

    python benchmarks/foreign_goals.py [--goals 30] [--robot drone1] [--logs DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from timelyllm_ros.core.types import SegmentGoal, SkillCall  # noqa: E402
from timelyllm_ros.netns import NamespaceUnavailable, port_holder, private_network  # noqa: E402
from timelyllm_ros.rosgraph.processes import ProcessGroup, free_domain_id, graph_env  # noqa: E402

EMULATOR_HOST, EMULATOR_PORT = "127.0.0.2", 9889
MF500 = SkillCall("move_forward", "mf", (500,))


def run(goals: int, robot: str, logs: Path) -> dict:
    from timelyllm_ros.ros import convert as c
    from timelyllm_ros.ros import interfaces as ifc
    from timelyllm_ros.transport.base import GoalStatus
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    emu_log = logs / "emulator_commands.jsonl"
    env = graph_env(free_domain_id())
    group = ProcessGroup(logs, env)
    py = sys.executable
    group.start("tello_emulator", [py, "-m", "timelyllm_ros.executors.tello_emulator", "--host", EMULATOR_HOST,
                                   "--port", str(EMULATOR_PORT), "--move-s-per-cm", "0.0005",
                                   "--turn-s-per-deg", "0.0001", "--takeoff-s", "0.05", "--log", str(emu_log)])
    ex = group.start("executor", [py, "-m", "timelyllm_ros.cli", "ros", "executor", "--ros-args",
                                  "-r", f"__ns:=/{robot}", "-p", "backend:=tello",
                                  "-p", f"tello_host:={EMULATOR_HOST}", "-p", f"tello_port:={EMULATOR_PORT}",
                                  "-p", "move_settle_s:=0.0", "-p", "turn_settle_s:=0.0"])
    import os

    os.environ.update(ROS_DOMAIN_ID=env["ROS_DOMAIN_ID"], ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    t = None
    try:
        end = time.monotonic() + 60
        while " serving " not in ex.log.read_text(errors="replace"):
            group.check()
            if time.monotonic() > end:
                raise RuntimeError(f"executor did not start: {ex.log_tail()}")
            time.sleep(0.1)
        t = RclpyTransport("foreign_node")
        ac = t.action_client(f"/{robot}/execute_segment", ifc.EXECUTE_SEGMENT)
        end = time.monotonic() + 30
        while not ac.server_is_ready():
            if time.monotonic() > end:
                raise RuntimeError("the executor's action server was not discovered")
            time.sleep(0.1)
        outcomes: dict[str, object] = {}

        def send(rid: str, text: str, calls: tuple[SkillCall, ...]) -> None:
            """One goal, and wait for its result (one after the other, as one client flying a drone)."""
            done = threading.Event()
            goal = SegmentGoal(rid, robot, "tello", 0, text, calls, 1.0, False)

            def on_result(o: object) -> None:
                outcomes[rid] = o
                done.set()

            ac.send_goal(c.segment_goal_to_fields(goal), on_result=on_result)
            if not done.wait(60):
                raise RuntimeError(f"no result for goal {rid} within 60 s")

        t0 = time.monotonic()
        send("foreign-multi", "mf(500);mf(500);mf(500);", (MF500,) * 3)
        send("foreign-mismatch", "tc(90);", (MF500,))
        for i in range(goals):
            send(f"foreign-{i}", "mf(500);", (MF500,))
        wall = time.monotonic() - t0
    finally:
        if t is not None:
            t.close()
        group.stop(order=("executor",), last=("tello_emulator",))  # the executor lands the drone first
    codes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for rid, o in outcomes.items():
        if not rid.startswith("foreign-") or rid in ("foreign-multi", "foreign-mismatch"):
            continue
        res = getattr(o, "result", None) or {}
        ok = getattr(o, "status", None) is GoalStatus.SUCCEEDED
        codes["OK" if ok else "refused"] += 1
        if not ok:
            reasons[str(res.get("error_message") or getattr(o, "error", ""))] += 1
    special = {rid: (getattr(outcomes[rid], "result", None) or {}).get("error_message", "")
               for rid in ("foreign-multi", "foreign-mismatch")}
    commands = [json.loads(line)["cmd"] for line in emu_log.read_text().splitlines()] if emu_log.exists() else []
    return {"goals": goals, "flown_ok": codes["OK"], "refused": codes["refused"],
            "emulator_forward_500": commands.count("forward 500"),
            "emulator_motion": [x for x in commands if x.split(" ")[0] in ("forward", "back", "cw", "ccw", "up", "down")],
            "refusal_reasons": dict(reasons), "multi_call_goal": special["foreign-multi"],
            "mismatch_goal": special["foreign-mismatch"], "wall_s": round(wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--goals", type=int, default=30)
    ap.add_argument("--robot", default="drone1")
    ap.add_argument("--logs", default=None, help="directory for the processes' logs (default: a temporary one)")
    a = ap.parse_args()
    if a.goals <= 0:
        ap.error("--goals must be > 0")
    stack = contextlib.ExitStack()
    where = "a private network namespace"
    try:
        stack.enter_context(private_network())
    except NamespaceUnavailable as e:
        held = port_holder(8889) or port_holder(8890)
        if held:
            print(f"foreign_goals: {held}, and no private network namespace is possible ({e})", file=sys.stderr)
            return 2
        where = "the host network (no namespace possible; ports free)"
    with stack, tempfile.TemporaryDirectory() as tmp:
        logs = Path(a.logs) if a.logs else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        out = run(a.goals, a.robot, logs)
    print(f"foreign_goals: {a.goals} direct `mf(500);` goals over DDS to a djitellopy executor process "
          f"(Tello emulator process), in {where}, {out['wall_s']} s")
    print(f"  flown OK {out['flown_ok']}, refused {out['refused']}; 'forward 500' commands at the emulator: "
          f"{out['emulator_forward_500']}")
    for reason, n in out["refusal_reasons"].items():
        print(f"  refused x{n}: {reason}")
    print(f"  multi-call goal mf(500);mf(500);mf(500);: {out['multi_call_goal']}")
    print(f"  text tc(90); with calls [mf(500)]: {out['mismatch_goal']}")
    print("RESULT " + json.dumps(out))
    return 0 if out["emulator_forward_500"] <= 10 and out["flown_ok"] <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
