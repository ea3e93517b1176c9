"""`timelyllm plan-offline BATCH`: the Hybrid paper's offline plan for a known batch.

BATCH is a batch file (YAML/JSON with slots and requests, or a `generate` block), e.g. the
bundled workloads/hybrid_gsm8k.yaml (1,319 GSM8K-like requests on 200 slots) -- not an LRTrace
workload such as WID1 (those are for `timelyllm bench`).

Assigns the batch's requests to J concurrency slots minimising the makespan in decode rounds
(P||Cmax on the estimated output tokens: LPT + local search, branch-and-bound when small),
prints the plan's makespan against the lower bounds and, with --simulate, replays the batch in
the PD-competition simulator under baseline / offline / online / offline+online.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .batch import load_batch
from .makespan import PlanError, solve
from .pd_sim import STRATEGIES, lower_bounds, simulate


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan-offline", help="offline P||Cmax plan of a known batch (Hybrid offline-online)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch", type=Path, metavar="BATCH",
                   help="batch file (YAML/JSON: slots, requests or generate), e.g. workloads/hybrid_gsm8k.yaml")
    p.add_argument("--slots", type=int, default=None, help="override the file's number of slots J")
    p.add_argument("--simulate", action="store_true", help="replay under the four strategies")
    p.add_argument("--out", type=Path, default=None, help="write the plan (slot of every request) as JSON")
    p.add_argument("--node-limit", type=int, default=2_000_000, help="branch-and-bound node budget")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError

    try:
        batch = load_batch(args.batch)
    except PlanError as e:
        raise CliError(str(e)) from None
    slots = batch.slots if args.slots is None else args.slots
    if slots < 1:
        raise CliError(f"--slots must be >= 1, got {slots}")
    reqs = batch.requests
    plan = solve([r.est_output_tokens for r in reqs], slots, node_limit=args.node_limit)
    lat = batch.latency
    lb = lower_bounds(reqs, slots, lat)
    loads = sorted(plan.loads)
    print(f"batch {batch.name}: {len(reqs)} requests, {slots} slots, "
          f"{sum(r.input_tokens for r in reqs)} input / {sum(r.output_tokens for r in reqs)} output tokens")
    print(f"plan ({plan.method}): makespan {plan.makespan:.0f} decode rounds, lower bound "
          f"{plan.lower_bound:.0f} ({'proven optimal' if plan.optimal else f'gap {100 * plan.gap:.2f} %'}); "
          f"slot loads min {loads[0]:.0f} / median {loads[len(loads) // 2]:.0f} / max {loads[-1]:.0f}")
    print(f"lower bound on total time: paper Eq. (32) {lb.paper_s:.2f} s "
          f"(prefill {lb.paper_prefill_s:.2f} s + decode {lb.paper_decode_s:.2f} s), "
          f"strict under this latency model {lb.strict_s:.2f} s")
    if args.simulate:
        print(f"{'strategy':16} {'total s':>9} {'util %':>7} {'stages':>7} {'rounds':>7} {'tok/s':>7} {'gap to LB':>9}")
        for name in ("baseline", "offline", "online", "offline+online"):
            r = simulate(reqs, slots, lat, STRATEGIES[name], plan=plan if STRATEGIES[name].offline else None)
            print(f"{name:16} {r.total_s:9.2f} {100 * r.utilisation:7.1f} {r.prefill_stages:7d} "
                  f"{r.decode_rounds:7d} {r.tokens_per_s:7.0f} {r.total_s - lb.paper_s:8.2f}s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "batch": batch.name, "slots": slots, "method": plan.method, "makespan_rounds": plan.makespan,
            "lower_bound_rounds": plan.lower_bound, "optimal": plan.optimal,
            "assignment": {r.id: plan.slot[i] for i, r in enumerate(reqs)},
        }, indent=1, sort_keys=True))
        print(f"plan written to {args.out}")
    return 0
