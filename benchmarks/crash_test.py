"""Crash test: SIGKILL the single-process planner at random points, restart it on the same journal.

Each seed: start a child that serves a workload (simulator engine, simulated robots) with the
SQLite journal attached; kill it with SIGKILL after a random delay; restart it on the same journal
(it recovers unfinished requests, then serves the arrivals the journal has not seen); repeat
`--kills` times, then let the last run finish.  Reported per seed: accepted, completed,
failed-with-reason, lost (accepted but never terminal — the goal is 0) and arrivals missing from
the journal.

    python benchmarks/crash_test.py --seeds 1 2 3 --kills 3
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child(args: argparse.Namespace) -> int:
    from timelyllm_ros.journal import Journal, recover
    from timelyllm_ros.sim.runner import run_simulation

    journal = Journal(args.journal)

    def setup(planner, arrivals):
        planner.listeners.append(journal)
        rep = recover(journal, planner)
        print(f"recovered: resubmitted {len(rep.resubmitted)}, failed {len(rep.failed)}", flush=True)
        return [a for a in arrivals if not journal.known(a.request_id)]

    run_simulation(args.workload, args.policy, seed=args.seed, setup=setup)
    journal.close()
    return 0


def parent(args: argparse.Namespace) -> int:
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.journal import Journal
    from timelyllm_ros.lrtrace import expand, load_workload
    from timelyllm_ros.lrtrace_tasks import load_tasks

    robots = load_robots()
    rows = []
    for seed in args.seeds:
        rng = random.Random(seed)
        expected = {a.request_id for a in expand(load_workload(args.workload), load_tasks(robots=robots), robots, seed=seed)}
        with tempfile.TemporaryDirectory() as tmp:
            jpath = Path(tmp) / "journal.db"
            cmd = [sys.executable, __file__, "--child", "--journal", str(jpath), "--workload", args.workload,
                   "--policy", args.policy, "--seed", str(seed)]
            kills = 0
            for attempt in range(args.kills + 1):
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
                if attempt < args.kills:
                    time.sleep(rng.uniform(args.min_delay, args.max_delay))
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
                        kills += 1
                out, _ = proc.communicate(timeout=600)
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
                     len(no_reason), lost, len(expected - seen)))
    print(f"crash test: workload {args.workload}, policy {args.policy}, simulator engine, SIGKILL after "
          f"U({args.min_delay}, {args.max_delay}) s wall, restart on the same SQLite journal")
    print(f"{'seed':>4} {'kills':>5} {'accepted':>8} {'completed':>9} {'failed':>6} {'failed w/o reason':>17} "
          f"{'lost':>4} {'never journaled':>15}")
    for r in rows:
        print(f"{r[0]:>4} {r[1]:>5} {r[2]:>8} {r[3]:>9} {r[4]:>6} {r[5]:>17} {r[6]:>4} {r[7]:>15}")
    bad = [r for r in rows if r[5] or r[6] or r[7]]
    print("lost total:", sum(r[6] + r[7] for r in rows))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
