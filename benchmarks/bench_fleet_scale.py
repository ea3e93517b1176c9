"""How many drone agents 1, 2, 4, 8 engines serve on time, on the whole plan (simulator).

    python benchmarks/bench_fleet_scale.py [--engines 1,2,4,8] [--policy default] [--param NAME=VALUE ...]
        [--profile profiles/rtx4090_llama3_8b.yaml] [--engine-kind stock] [--threshold 80]
        [--max-p99-wait 5] [--score whole-plan|first-action] [--resolution 0.1]
        [--quick] [--out out/fleet_scale.json]

A point N passes (issue 25 item 5, `--score whole-plan`, the default) when urgent requests keep
>= `--threshold` % of max **accrued** utility (Eq. 3: first action and every wait between
actions) and no continuation waits more than `--max-p99-wait` s at p99 (W(s_k), k >= 1, all
requests); `--score first-action` is the older criterion (urgent first-action utility only).
The engine is stock vLLM's by default (`--engine-kind stock`: abort frees a paused request's KV,
resume through the prefix cache), the engine users run.

Load: the regime map's scaled drone load `drones:N` (WID1's shape, N Tello agents, events at
0.25 * N / 25 per second for 60 s, seed 11).  For each engine count E the search starts at
N = 400 * E, multiplies N by 1.5 (or divides) until it brackets the threshold, then bisects until
the bracket is within `--resolution` of N (`--quick`: 0.25).  It reports the largest N evaluated
that keeps urgent time utility >= the threshold (% of max), the first N above it that does not,
and the scale-up over one engine.  Every evaluation is printed as it finishes, with its wall and
CPU time (the machine is shared: CPU time is the fairer measure) and the load average.
The search assumes utility falls with N; every evaluated point is printed so that can be checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from timelyllm_ros.cli import _param  # noqa: E402  (the CLI's NAME=VALUE parsing)
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.inputs import InputError, check_run_params, params_for  # noqa: E402
from timelyllm_ros.core.latency_profile import DEFAULT_PROFILE  # noqa: E402
from timelyllm_ros.workloads.catalog import load_tasks  # noqa: E402
from timelyllm_ros.sim.runner import run_simulation  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Search:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.robots = load_robots()
        self.catalog = load_tasks(robots=self.robots)
        self.points: list[dict] = []
        self.params = params_for(args.policy, args.param)  # the policy's --param values

    def urgent(self, n: int, engines: int) -> float:
        """Evaluate drones:n on `engines` engines; the urgent score (% of max) of the chosen
        `--score`, or -inf where the p99 continuation wait exceeds `--max-p99-wait`."""
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_simulation(f"drones:{n}", self.args.policy, profile_path=self.args.profile, engines=engines,
                           robots=self.robots, catalog=self.catalog, engine_kind=self.args.engine_kind,
                           policy_params=self.params)
        urg, overall = r.metrics["by_category"]["urgent"], r.metrics["overall"]
        first = float(urg["utility_pct_of_max"])
        accrued = float(urg["accrued_utility_pct_of_max"])
        p99 = overall["continuation_wait_s"]["p99"]
        p99 = float(p99) if p99 is not None else 0.0
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.points.append({"engines": engines, "agents": n, "requests": len(r.generations),
                            "urgent_pct": first, "urgent_accrued_pct": accrued, "continuation_wait_p99_s": p99,
                            "total_pct": overall["utility_pct_of_max"],
                            "total_accrued_pct": overall["accrued_utility_pct_of_max"],
                            "wall_s": wall, "cpu_s": cpu})
        print(f"  E={engines} N={n:5d}: {len(r.generations):6d} requests, urgent {first:5.1f} % of max "
              f"(accrued {accrued:5.1f} %), continuation wait p99 {p99:5.2f} s "
              f"(wall {wall:6.1f} s, CPU {cpu:6.1f} s, load {load()})", flush=True)
        if self.args.score == "first-action":
            return first
        return accrued if p99 <= self.args.max_p99_wait else float("-inf")

    def largest(self, engines: int) -> tuple[int, int | None, float]:
        """(largest passing N, smallest failing N above it, urgent % at the passing N)."""
        thr, res = self.args.threshold, self.args.resolution
        n = 400 * engines
        seen: dict[int, float] = {}

        def ok(k: int) -> bool:
            if k not in seen:
                seen[k] = self.urgent(k, engines)
            return seen[k] >= thr

        if ok(n):
            lo, hi = n, None
            while hi is None:
                k = int(round(lo * 1.5 / 10) * 10)
                if ok(k):
                    lo = k
                else:
                    hi = k
        else:
            lo, hi = None, n
            while lo is None:
                k = max(1, int(round(hi / 1.5 / 10) * 10))
                if k == hi or ok(k):
                    lo = k
                else:
                    hi = k
        while hi - lo > max(10, res * lo):
            mid = int(round((lo + hi) / 2 / 10) * 10)
            if mid in (lo, hi):
                break
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo, hi, seen.get(lo, float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="1,2,4,8", help="comma-separated engine counts")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--param", action="append", type=_param, default=[], metavar="NAME=VALUE",
                    help="a parameter of --policy (repeatable; as `timelyllm bench --param`), e.g. plan_order=true")
    ap.add_argument("--engine-kind", default="stock", choices=("stock", "preserve"),
                    help="what the simulated engine can do with a paused request's KV (stock vLLM: stock)")
    ap.add_argument("--score", default="whole-plan", choices=("whole-plan", "first-action"),
                    help="whole-plan: accrued (Eq. 3) urgent utility and the p99 continuation wait; "
                    "first-action: urgent first-action utility only")
    ap.add_argument("--max-p99-wait", type=float, default=5.0,
                    help="whole-plan: a point fails if the p99 continuation wait exceeds this, s")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--threshold", type=float, default=80.0, help="urgent utility (accrued with --score whole-plan), %% of max")
    ap.add_argument("--resolution", type=float, default=0.1, help="stop when the bracket is within this share of N")
    ap.add_argument("--quick", action="store_true", help="resolution 0.25")
    ap.add_argument("--points", help="comma-separated N to evaluate for each engine count instead of the search "
                    "(e.g. to narrow a bracket a search left); prints each point only")
    ap.add_argument("--out", help="write the table and every evaluated point as JSON")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.engines.split(",")]
        if any(c < 1 for c in counts):
            raise ValueError
    except ValueError:
        raise SystemExit(f"bench_fleet_scale: --engines must be positive integers, e.g. 1,2,4,8; got {args.engines!r}")
    try:  # a bad name or value is a clear error before any simulation (as `timelyllm bench`)
        check_run_params([args.policy], args.param)
    except InputError as e:
        raise SystemExit(f"bench_fleet_scale: {e}") from None
    if args.quick:
        args.resolution = 0.25
    crit = (f"urgent accrued utility (Eq. 3) >= {args.threshold:g} % of max and p99 continuation wait "
            f"<= {args.max_p99_wait:g} s" if args.score == "whole-plan"
            else f"urgent first-action utility >= {args.threshold:g} % of max")
    search = Search(args)
    shown = "".join(f" {k}={v}" for k, v in search.params.items())
    print(f"simulator, profile {Path(args.profile).stem}, {args.engine_kind} engine, policy {args.policy}{shown}, "
          f"load drones:N (60 s, seed 11); threshold: {crit}; {os.cpu_count()} cores, load {load()}", flush=True)
    if args.points:
        try:
            points = [int(x) for x in args.points.split(",")]
            if any(n < 1 for n in points):
                raise ValueError
        except ValueError:
            raise SystemExit(f"bench_fleet_scale: --points must be positive integers; got {args.points!r}")
        for e in counts:
            for n in points:
                search.urgent(n, e)
        write_json(args, search.params, {"points": search.points})
        return 0
    rows = []
    t0 = time.perf_counter()
    for e in counts:
        print(f"engines: {e}", flush=True)
        lo, hi, u = search.largest(e)
        rows.append({"engines": e, "agents_at_threshold": lo, "first_below": hi, "urgent_pct": u})
    one = next((r for r in rows if r["engines"] == 1), None)
    print()
    print(f"| engines | agents passing ({args.score}) | first N failing | urgent % at that N "
          f"| scale-up vs 1 engine | at least |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        # scale-up: passing N over 1 engine's passing N; "at least": over 1 engine's first failing N
        # (the true thresholds lie inside the brackets the search left)
        r["scale_up"] = r["agents_at_threshold"] / one["agents_at_threshold"] if one else None
        r["scale_up_min"] = r["agents_at_threshold"] / one["first_below"] if one and one["first_below"] else None
        cols = [f"{x:.2f}x" if x else "-" for x in (r["scale_up"], r["scale_up_min"])]
        print(f"| {r['engines']} | {r['agents_at_threshold']} | {r['first_below']} | {r['urgent_pct']:.1f} | "
              f"{cols[0]} | {cols[1]} |")
    print(f"\nsearch took {time.perf_counter() - t0:.0f} s wall, "
          f"{sum(p['cpu_s'] for p in search.points):.0f} s CPU in simulations; load {load()}")
    write_json(args, search.params, {"rows": rows, "points": search.points})
    return 0


def write_json(args: argparse.Namespace, params: dict, doc: dict) -> None:
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"profile": Path(args.profile).stem, "policy": args.policy,
                                              "policy_params": params,
                                              "engine_kind": args.engine_kind, "score": args.score,
                                              "threshold": args.threshold, "max_p99_wait_s": args.max_p99_wait,
                                              **doc}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
