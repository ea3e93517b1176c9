"""Offered load over full-batch capacity (ρ) of regime-map cells, measured on `default`'s run (simulator).

    python benchmarks/load_factor.py rtx4090_llama3_8b/stock/drones:400/cap8 orin_nano_llama3_2_3b/stock/WID2/cap4 ...

A cell is PROFILE/ENGINE/LOAD/CAPACITY as the regime map names them (`benchmarks/rejudge.py`).  ρ =
offered tokens per second — every request's generated tokens over the arrival span, known only
after the run — over the engine's tokens per second at a full batch: the median of outputs per
second over the steps that ran at least 90 % of the run's largest batch.  Above 1 the cell's backlog
grows while requests arrive.  An offline figure for choosing a gate (docs/results/2026-11-29-victim-readd.md),
not something a policy can read: online, the offered rate would need each arrival's reply length.
"""

from __future__ import annotations

import argparse
import statistics

from timelyllm_ros.sim.regime import GridError, cell_profile, check_load, parse_capacity, parse_cell_key, resolve_profile
from timelyllm_ros.sim.runner import run_simulation


def load_factor(cell: str) -> str:
    c = parse_cell_key(cell)
    cap = parse_capacity(c.capacity)
    steps: list[tuple[int, float]] = []  # (outputs, seconds) per engine step

    def setup(planner, arrivals):
        eng = planner.engine
        inner = eng.step

        def step():
            t0 = eng.clock.now()
            out = inner()
            steps.append((len(out), eng.clock.now() - t0))
            return out

        eng.step = step
        return arrivals

    r = run_simulation(check_load(c.load), "default", max_batch=cap.max_batch, engine_kind=c.engine, setup=setup,
                       profile_path=cell_profile(c))
    tokens = sum(len(g.output_ids) for g in r.generations)
    arrivals = [g.request.arrival for g in r.generations]
    span = max(arrivals) - min(arrivals)
    largest = max(n for n, _ in steps)
    full = statistics.median(n / dt for n, dt in steps if n >= 0.9 * largest and dt > 0)
    offered = tokens / span
    return (f"{cell}: {tokens} tokens over {span:.1f} s = {offered:.0f} tok/s offered; full batch ({largest}) "
            f"{full:.0f} tok/s; rho {offered / full:.2f}; accrued {r.metrics['overall']['accrued_utility_pct_of_max']:.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="+", help="PROFILE/ENGINE/LOAD/CAPACITY")
    cells = ap.parse_args().cells
    for cell in cells:  # every cell checked before the first run
        try:
            c = parse_cell_key(cell)
            check_load(c.load)
            resolve_profile(c.profile)
        except GridError as e:
            ap.error(str(e))
    for cell in cells:
        print(load_factor(cell), flush=True)


if __name__ == "__main__":
    main()
