"""What leaving the engine mid-plan costs in regime-map cells: engine work and waits per policy (simulator).

    python benchmarks/churn.py vllm_cpu_tiny/stock/drones:800/cap16 --policies default,vllm-priority

A cell is PROFILE/ENGINE/LOAD/CAPACITY as the regime map names them (`benchmarks/rejudge.py`).
Every policy runs the cell's arrivals (same seed).  Per policy: accrued utility (Eq. 3, total and
urgent), the engine's busy seconds and the prompt tokens it prefilled (uncached: a stock engine's
re-add re-prefills at least a partial KV block and attends over the whole cached context), the
re-adds (`Generation.resumes`: a suspension at a statement end, a preemption or a blocking
statement each bring the generation back once) and preemptions; then per category the wait for
the first action (arrival to its start) and between actions (end of one to the start of the next,
W(s_k) of Eq. 3), each for the generations that left the engine mid-plan (re-added) and those that
did not.  A diagnostic for docs/results/2026-11-29-churn.md: where a policy's suspensions cost the
engine more than they buy, the waits after them show it.
"""

from __future__ import annotations

import argparse

import numpy as np

from timelyllm_ros.core.policies import policy_names
from timelyllm_ros.sim.regime import GridError, cell_profile, check_load, parse_capacity, parse_cell_key, resolve_profile
from timelyllm_ros.sim.runner import run_simulation


def _waits(xs: list[float]) -> str:
    if not xs:
        return "n 0"
    a = np.asarray(xs)
    return f"n {a.size} mean {a.mean():.2f} p90 {np.percentile(a, 90):.2f} max {a.max():.2f} s"


def churn(cell: str, policy: str) -> list[str]:
    c = parse_cell_key(cell)
    r = run_simulation(check_load(c.load), policy, max_batch=parse_capacity(c.capacity).max_batch,
                       engine_kind=c.engine, profile_path=cell_profile(c))
    m, gens = r.metrics, r.generations
    urgent = m["by_category"].get("urgent")
    lines = [f"{cell} {policy}: accrued {m['overall']['accrued_utility_pct_of_max']:.1f} % (urgent "
             f"{urgent['accrued_utility_pct_of_max'] if urgent else float('nan'):.1f} %); engine busy "
             f"{r.engine['busy_s']:.1f} s, prefilled {r.engine['prefill_tokens']} tokens; re-adds "
             f"{sum(g.resumes for g in gens)}, preemptions {sum(g.num_preemptions for g in gens)}"]
    for cat in sorted({g.request.category for g in gens}):
        for left in (True, False):
            sub = [g for g in gens if g.request.category == cat and (g.resumes > 0) == left]
            first = [g.segments[0].exec_start - g.request.arrival for g in sub
                     if g.segments and g.segments[0].exec_start is not None]
            between = [max(0.0, b.exec_start - a.exec_end) for g in sub for a, b in zip(g.segments, g.segments[1:])
                       if a.exec_end is not None and b.exec_start is not None]
            lines.append(f"  {cat} {'re-added' if left else 'never left'}: first action {_waits(first)}; "
                         f"between actions {_waits(between)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="+", help="PROFILE/ENGINE/LOAD/CAPACITY")
    ap.add_argument("--policies", default="default,vllm-priority", help="comma-separated (default: %(default)s)")
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in policy_names()]
    if unknown or not policies:
        ap.error(f"unknown policies {unknown}; known: {', '.join(policy_names())}")
    for cell in args.cells:  # every cell checked before the first run
        try:
            c = parse_cell_key(cell)  # (its engine kind and capacity too)
            check_load(c.load)
            resolve_profile(c.profile)
        except GridError as e:
            ap.error(str(e))
    for cell in args.cells:
        for p in policies:
            print("\n".join(churn(cell, p)), flush=True)


if __name__ == "__main__":
    main()
