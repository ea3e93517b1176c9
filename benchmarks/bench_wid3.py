"""Wall time of simulating LRTrace WID3 (900 s of arm tasks) for one policy.  Goal: <= 2 s.

    python benchmarks/bench_wid3.py [--policy timelyllm] [--repeat 3] [--profile-top 0]

Prints the wall time of each run (workload loading included), the process CPU time beside it (on
a shared machine the wall time includes waiting for a core; CPU time does not), the virtual time
simulated and the speed-up over real time; ``--profile-top N`` also prints the N most expensive
functions.  The machine and its load average are printed first.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import time

from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.workloads.catalog import load_tasks  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="timelyllm")
    ap.add_argument("--workload", default="WID3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile-top", type=int, default=0)
    args = ap.parse_args()
    robots = load_robots()
    catalog = load_tasks(robots=robots)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    walls, cpus = [], []
    for i in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_simulation(args.workload, args.policy, robots=robots, catalog=catalog)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i + 1}: {args.workload} / {args.policy}: {len(r.generations)} requests, "
              f"{r.engine['steps']} engine steps, virtual {r.virtual_end_s:.1f} s, wall {wall:.2f} s, "
              f"CPU {cpu:.2f} s ({r.virtual_end_s / wall:.0f}x real time)")
    print(f"wall time: min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; CPU time: min "
          f"{min(cpus):.2f} s, median {statistics.median(cpus):.2f} s "
          f"(goal <= 2 s wall: {'met' if min(walls) <= 2.0 else 'NOT met'})")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.profile_top:
        prof = cProfile.Profile()
        prof.enable()
        run_simulation(args.workload, args.policy, robots=robots, catalog=catalog)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile_top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
