"""Crash test: SIGKILL the single-process planner at random points, restart it on the same journal.

Each seed: start a child that serves a workload (simulator engine, simulated robots) with the
SQLite journal attached; kill it with SIGKILL after a random delay; restart it on the same journal
(it recovers unfinished requests, then serves the arrivals the journal has not seen); repeat
`--kills` times, then let the last run finish.  Reported per seed: accepted, completed,
failed-with-reason, lost (accepted but never terminal — the goal is 0) and arrivals missing from
the journal.

    python benchmarks/crash_test.py --seeds 1 2 3 --kills 3

`--ros` (issue 26): the same over a ROS 2 graph, nodes as processes (Fast DDS): a planner node with
a journal (simulated engine), `--robots` simulated drone executors, `--requests` PlanTask
requests (`timelyllm request`'s client: resent with the same id when the planner instance dies)
sent one every `--gap` s; the planner is SIGKILLed after U(min, max) s with plans in flight and
restarted `--down` s later.  Watching `/<robot>/execute_segment/_action/status`, per run: goals of
the dead planner open at the kill, how long until the last of them ended (stopped / aborted:
the executors' planner lease), how many succeeded after the lease (must be 0); the requests the
restarted planner resumed (every dispatched segment ran: generation goes on from the journaled
token ids) and how many of them finished; then every request's answer: finished, failed saying
where the robot was left, other failures, rejected, lost (no answer: must be 0).

    python benchmarks/crash_test.py --ros --runs 3 --requests 30
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> int:
    from timelyllm_ros.journal import Journal, recover
    from timelyllm_ros.sim.runner import run_simulation

    journal = Journal(args.journal)

    def setup(planner, arrivals):
        planner.listeners.append(journal)
        rep = recover(journal, planner)
        print(f"recovered: resubmitted {len(rep.resubmitted)}, resumed {len(rep.resumed)}, failed {len(rep.failed)}",
              flush=True)
        return [a for a in arrivals if not journal.known(a.request_id)]

    run_simulation(args.workload, args.policy, seed=args.seed, setup=setup)
    journal.close()
    return 0


def parent(args: argparse.Namespace) -> int:
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.journal import Journal
    from timelyllm_ros.workloads.format import expand, load_workload
    from timelyllm_ros.workloads.catalog import load_tasks

    robots = load_robots()
    rows = []
    for seed in args.seeds:
        rng = random.Random(seed)
        expected = {a.request_id for a in expand(load_workload(args.workload), load_tasks(robots=robots), robots, seed=seed)}
        with tempfile.TemporaryDirectory() as tmp:
            jpath = Path(tmp) / "journal.db"
            cmd = [sys.executable, __file__, "--child", "--journal", str(jpath), "--workload", args.workload,
                   "--policy", args.policy, "--seed", str(seed)]
            kills = resumed = 0
            for attempt in range(args.kills + 1):
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
                if attempt < args.kills:
                    time.sleep(rng.uniform(args.min_delay, args.max_delay))
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
                        kills += 1
                out, _ = proc.communicate(timeout=600)
                resumed += sum(int(m) for m in re.findall(r"^recovered: .*resumed (\d+)", out, re.M))
                if attempt == args.kills and proc.returncode != 0:
                    print(out)
                    raise SystemExit(f"seed {seed}: final run failed with exit code {proc.returncode}")
            j = Journal(jpath)
            states = j.counts()
            seen = {r[0] for r in j.rows()}
            no_reason = [r for r in j.rows() if r[1] == "failed" and not r[2]]
            j.close()
        accepted = sum(states.values())
        lost = sum(v for k, v in states.items() if k not in ("finished", "failed", "cancelled"))
        rows.append((seed, kills, accepted, states.get("finished", 0), states.get("failed", 0),
                     len(no_reason), lost, len(expected - seen), resumed))
    print(f"crash test: workload {args.workload}, policy {args.policy}, simulator engine, SIGKILL after "
          f"U({args.min_delay}, {args.max_delay}) s wall, restart on the same SQLite journal")
    print(f"{'seed':>4} {'kills':>5} {'accepted':>8} {'resumed':>7} {'completed':>9} {'failed':>6} "
          f"{'failed w/o reason':>17} {'lost':>4} {'never journaled':>15}")
    for r in rows:
        print(f"{r[0]:>4} {r[1]:>5} {r[2]:>8} {r[8]:>7} {r[3]:>9} {r[4]:>6} {r[5]:>17} {r[6]:>4} {r[7]:>15}")
    bad = [r for r in rows if r[5] or r[6] or r[7]]
    print("lost total:", sum(r[6] + r[7] for r in rows))
    return 1 if bad else 0


def ros_run(args: argparse.Namespace, run: int, rng: random.Random) -> dict:
    import threading
    from collections import Counter

    from timelyllm_ros.nodes.agent import plan_request_fields
    from timelyllm_ros.nodes.plan_task import PlannerWatch, request_plan
    from timelyllm_ros.rosgraph.processes import free_domain_id, graph_env
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport

    ns = "/crash"
    robots = [f"drone{i + 1}" for i in range(args.robots)]
    env = graph_env(free_domain_id(), {**os.environ, "PYTHONPATH": str(REPO)})
    os.environ.update(ROS_DOMAIN_ID=env["ROS_DOMAIN_ID"], ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    tmp = tempfile.mkdtemp(prefix="crash_ros_")
    logs = Path(tmp)

    def start(kind: str, name: str, *ros: str) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "ab")
        return subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "ros", kind, "--ros-args", *ros],
                                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def serving(name: str, timeout_s: float = 60.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if " serving " in (logs / f"{name}.log").read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise SystemExit(f"{name} did not start:\n" + (logs / f"{name}.log").read_text(errors="replace"))

    planner_args = ["-r", f"__ns:={ns}", "-p", f"journal_path:={logs / 'journal.db'}", "-p", "server_wait_s:=6.0",
                    "-p", f"executors:={','.join(robots)}"]
    procs = [start("executor", r, "-r", f"__ns:=/{r}", "-p", f"time_scale:={args.time_scale}",
                   "-p", f"planner_lease_s:={args.lease}") for r in robots]
    planner = start("planner", "planner1", *planner_args)
    t = RclpyTransport(f"crash_test_{run}")
    events: list[tuple[float, str, bytes, int]] = []  # (time, robot, goal uuid, status)
    lock = threading.Lock()

    def on_status(robot: str):
        def cb(m: dict) -> None:
            now = time.monotonic()
            with lock:
                for st in m["status_list"]:
                    events.append((now, robot, bytes(st["goal_info"]["goal_id"]["uuid"]), int(st["status"])))
        return cb

    answers: dict[str, object] = {}
    try:
        for r in robots:
            serving(r)
            t.subscribe(f"/{r}/execute_segment/_action/status", "action_msgs/msg/GoalStatusArray", on_status(r),
                        qos="latched")
        serving("planner1")
        watch = PlannerWatch(t, ns, args.lease)
        plan = "".join(["mf(100);", "tc(90);", "mf(100);", "tc(90);", "mf(50);"][: rng.choice((4, 5))])

        def client(i: int) -> None:
            rid = f"crash{run}-{i}"
            req = plan_request_fields(request_id=rid, robot_id=robots[i % len(robots)], robot_type="tello",
                                      task="patrol", plan=plan)
            answers[rid] = request_plan(t, ns, req, timeout_s=args.answer_timeout, discovery_timeout_s=60,
                                        watch=watch)

        threads = []
        t0 = time.monotonic()
        kill_at = t0 + rng.uniform(args.min_delay, args.max_delay)
        t_kill = None
        for i in range(args.requests):
            th = threading.Thread(target=client, args=(i,), daemon=True)
            th.start()
            threads.append(th)
            if t_kill is None and time.monotonic() >= kill_at:
                planner.kill()
                t_kill = time.monotonic()
                restart_at = t_kill + args.down
            if t_kill is not None and planner.poll() is not None and time.monotonic() >= restart_at:
                planner = start("planner", "planner2", *planner_args)
            time.sleep(args.gap)
        if t_kill is None:
            while time.monotonic() < kill_at:
                time.sleep(0.01)
            planner.kill()
            t_kill = time.monotonic()
            restart_at = t_kill + args.down
        if planner.poll() is not None:
            while time.monotonic() < restart_at:
                time.sleep(0.01)
            planner = start("planner", "planner2", *planner_args)
        for th in threads:
            th.join(args.answer_timeout + 30)
        watch.close()
    finally:
        t.close()
        planner.kill()
        for p in procs:
            p.kill()
    with lock:
        evs = sorted(events)
    last_before: dict[bytes, int] = {}
    for ts, _r, uid, st in evs:
        if ts <= t_kill:
            last_before[uid] = st
    open_at_kill = {u for u, st in last_before.items() if st in (1, 2, 3)}  # accepted, executing, canceling
    ended: dict[bytes, tuple[float, int]] = {}
    for ts, _r, uid, st in evs:
        if uid in open_at_kill and st in (4, 5, 6) and uid not in ended:
            ended[uid] = (ts - t_kill, st)
    late_ok = sum(1 for dt, st in ended.values() if st == 4 and dt > args.lease)
    states, reasons = Counter(), Counter()
    where = lost = 0
    for rid, a in answers.items():
        st = getattr(a, "status", None)
        if st is None:
            lost += 1
            print(f"  no answer: {rid}: sent {getattr(a, 'sends', '?')} time(s): {getattr(a, 'error', '')}")
            continue
        states[st["state"]] += 1
        if st["state"] == "failed":
            if "dispatched statement(s)" in st["reason"]:
                where += 1
            reasons[st["reason"].split(";")[-1].strip()[:60]] += 1
    never = len(open_at_kill) - len(ended)
    log2 = logs / "planner2.log"
    resumed = (log2.read_text(errors="replace").count("resumed from its journaled token ids")
               if log2.exists() else 0)
    resumed_finished = sum(1 for a in answers.values() if getattr(a, "status", None) is not None
                           and "resumed after a planner restart" in a.status["reason"])
    return {"resumed": resumed, "resumed_finished": resumed_finished,
            "open_at_kill": len(open_at_kill), "ended": len(ended), "never_ended": never,
            "max_end_s": max((dt for dt, _ in ended.values()), default=0.0),
            "stopped": sum(1 for _dt, st in ended.values() if st in (5, 6)),
            "succeeded_in_lease": sum(1 for dt, st in ended.values() if st == 4 and dt <= args.lease),
            "succeeded_later": late_ok, "answers": len(answers), "states": dict(states), "failed_where": where,
            "reasons": dict(reasons), "lost": lost + (args.requests - len(answers)),
            "resends": sum(max(0, getattr(a, "sends", 1) - 1) for a in answers.values()), "logs": tmp}


def ros_parent(args: argparse.Namespace) -> int:
    rows = []
    wall0 = time.monotonic()
    for run in range(args.runs):
        rows.append(ros_run(args, run, random.Random(run + 1)))
    print(f"crash test over ROS 2 (Fast DDS, nodes as processes; simulated engine, {args.robots} simulated drones at "
          f"time_scale {args.time_scale}, planner lease {args.lease:g} s): {args.requests} PlanTask requests per run, "
          f"one every {args.gap:g} s, planner SIGKILLed after U({args.min_delay:g}, {args.max_delay:g}) s, restarted "
          f"{args.down:g} s later on its journal; {time.monotonic() - wall0:.0f} s wall")
    print(f"{'run':>3} {'open@kill':>9} {'ended':>5} {'max end s':>9} {'stopped':>7} {'ok<lease':>8} {'ok later':>8} "
          f"{'resumed':>7} {'(finished)':>10} {'finished':>8} {'failed(where)':>13} {'failed':>6} {'rejected':>8} "
          f"{'lost':>4} {'resent':>6}")
    for i, r in enumerate(rows):
        st = r["states"]
        print(f"{i + 1:>3} {r['open_at_kill']:>9} {r['ended']:>5} {r['max_end_s']:>9.2f} {r['stopped']:>7} "
              f"{r['succeeded_in_lease']:>8} {r['succeeded_later']:>8} {r['resumed']:>7} {r['resumed_finished']:>10} "
              f"{st.get('finished', 0):>8} "
              f"{r['failed_where']:>13} {st.get('failed', 0):>6} {st.get('rejected', 0):>8} {r['lost']:>4} "
              f"{r['resends']:>6}")
    for i, r in enumerate(rows):
        print(f"run {i + 1} failure reasons (end of text): {r['reasons']}  logs: {r['logs']}")
    print("resumed: requests the restarted planner went on generating from their journaled token ids (every "
          "dispatched segment had run); (finished): of them, ended FINISHED; finished counts them too")
    bad = [r for r in rows if r["lost"] or r["succeeded_later"] or r["never_ended"]]
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ros", action="store_true", help="over a ROS 2 graph (nodes as processes)")
    ap.add_argument("--runs", type=int, default=3, help="--ros: runs")
    ap.add_argument("--requests", type=int, default=30, help="--ros: requests per run")
    ap.add_argument("--robots", type=int, default=5, help="--ros: simulated drone executors")
    ap.add_argument("--time-scale", type=float, default=0.3, help="--ros: executors' time_scale")
    ap.add_argument("--gap", type=float, default=0.2, help="--ros: seconds between requests")
    ap.add_argument("--down", type=float, default=2.0, help="--ros: seconds the planner stays dead")
    ap.add_argument("--lease", type=float, default=1.0, help="--ros: executors' planner_lease_s")
    ap.add_argument("--answer-timeout", type=float, default=180.0, help="--ros: seconds a request waits for its answer")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--journal")
    ap.add_argument("--workload", default="WID1")
    ap.add_argument("--policy", default="timelyllm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--min-delay", type=float, default=1.0)
    ap.add_argument("--max-delay", type=float, default=4.0)
    args = ap.parse_args()
    if args.ros:
        return ros_parent(args)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
